#!/usr/bin/env bash
# On a lent GPU machine (its own python3 with CUDA PyTorch; no registry reached):
#   bash benchmarks/gpu_run.sh [gpu_check arguments, e.g. --allow-partial]
# 1. refuses to start (exit 2, one line naming what is missing) without every wheel
#    benchmarks/gpu_wheels.sh gathers into .whl/, or when one of them does not install or
#    import beside that PyTorch: a run without them would spend the GPU on sections that
#    cannot import their library;
# 2. runs the `gpu`-marked tests (about 60 s, cut at GPU_TESTS_SECONDS=75), log and JUnit XML
#    into the results folder;
# 3. runs benchmarks/gpu_check.py with this checkout on the path; it writes its JSON into
#    the results folder itself after every section and on SIGTERM, so a run killed at the
#    machine's limit still sends back what finished.
# The results folder is $OUT when set (the folder a lent machine sends back), else
# benchmarks/results/. The exit status is gpu_check's: 0 every check passed, 1 a check or
# section failed, 3 nothing failed but a check could not run here unless --allow-partial,
# 143 on SIGTERM; 2 refused to start; 4 gpu_check passed but a `gpu` test failed.
# docs/gpu.md: what the run covers, in what order, and what it leaves out.
set -uo pipefail
cd "$(dirname "$0")/.."
SITE=${SITE:-/tmp/wb-site}
WHEELS=${WHEELS:-.whl}
RESULTS=${OUT:-benchmarks/results}
PY=${GPU_RUN_PYTHON:-python3}
# distribution (as a wheel's file name spells it) -> the module it must import
NEEDED=(deepspeed:deepspeed torchao:torchao bitsandbytes:bitsandbytes pydantic:pydantic
  pydantic_core:pydantic_core annotated_types:annotated_types
  typing_inspection:typing_inspection hjson:hjson)
# in the machine's image already (KINDS.md): imported, never carried
IMAGE=(torch transformers peft lightning accelerate psutil pytest)
refuse() { echo "gpu_run.sh: not started: $*" >&2; exit 2; }

[ -d "$WHEELS" ] || refuse "no $WHEELS/ folder (run 'bash benchmarks/gpu_wheels.sh' where a registry is reached, and carry .whl)"
missing=()
for pair in "${NEEDED[@]}"; do
  dist=${pair%%:*}
  compgen -G "$WHEELS/$dist-*.whl" >/dev/null || missing+=("$dist")
done
[ ${#missing[@]} -eq 0 ] || refuse "wheels missing from $WHEELS/: ${missing[*]} (run 'bash benchmarks/gpu_wheels.sh')"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$WHEELS"/*.whl >/tmp/gpu_run_pip.log 2>&1 ||
  refuse "the wheels in $WHEELS/ did not install: $(tail -n 1 /tmp/gpu_run_pip.log)"
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
modules=("${IMAGE[@]}")
for pair in "${NEEDED[@]}"; do modules+=("${pair##*:}"); done
verdict=$(mktemp)
# the libraries' own import notices go to a log; the verdict to its own file
"$PY" - "$verdict" "${modules[@]}" >/tmp/gpu_run_imports.log 2>&1 <<'PYEOF' ||
import importlib, sys
bad = []
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any failure to import is a refusal
        first = str(exc).splitlines()[0] if str(exc) else ""
        bad.append(f"{name} ({type(exc).__name__}: {first})")
with open(sys.argv[1], "w") as f:
    f.write("; ".join(bad))
PYEOF
  refuse "the import check itself failed: $(tail -n 1 /tmp/gpu_run_imports.log)"
bad=$(cat "$verdict")
[ -z "$bad" ] || refuse "does not import here: $bad"
mkdir -p "$RESULTS"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

# the gpu-marked tests (the newest CUDA code: paged 8-bit AdamW, activation offload, the
# allocator model, the planner's probe, the memory snapshot, ...): a hard limit
mapfile -t gpu_tests < <(grep -rl "pytest.mark.gpu" tests --include='test_*.py' | sort)
timeout --signal=TERM --kill-after=10 "${GPU_TESTS_SECONDS:-75}" \
  "$PY" -m pytest -m gpu -q -p no:cacheprovider -o timeout=60 \
  --junitxml="$RESULTS/gpu_tests.xml" "${gpu_tests[@]}" >"$RESULTS/gpu_tests.log" 2>&1
tests_code=$?
echo "gpu tests: exit $tests_code (log in $RESULTS/gpu_tests.log)"

"$PY" benchmarks/gpu_check.py --out-dir "$RESULTS" "$@" 2>&1 | tee "$RESULTS/gpu_check.log"
code=${PIPESTATUS[0]}
if [ "$code" -eq 0 ] && [ "$tests_code" -ne 0 ] && [ "$tests_code" -ne 5 ]; then
  code=4
fi
exit $code
