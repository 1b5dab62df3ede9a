#!/usr/bin/env bash
# Wheels of what benchmarks/gpu_check.py needs beyond a CUDA machine's own PyTorch image
# (DeepSpeed and its pydantic, hjson; torchao for the INT8 and 8-bit AdamW sections;
# bitsandbytes for paged 8-bit AdamW, QLoRA and the adam8bit fallback), for Python
# $PY_VERSION, into .whl/ (git-ignored). Run on this machine, where the package registry
# is reached; benchmarks/gpu_run.sh installs them on a GPU machine that reaches no
# registry, and refuses to start (exit 2) when one is missing.
# bitsandbytes' wheel (41 MiB: a build for every CUDA from 11.8 to 13.2, ROCm and XPU) is
# slimmed to the CPU build and the one for $BNB_CUDA (130: the lent machines' torch
# 2.11.0+cu130), 3.4 MiB, so everything travels inside a lent machine's 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PY_VERSION=${PY_VERSION:-3.12}
BNB_CUDA=${BNB_CUDA:-130}
OUT=${WHEELS:-.whl}
mkdir -p "$OUT"
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
  --implementation cp "${platforms[@]}" -d "$OUT" \
  "pydantic==$(version pydantic)" "pydantic-core==$(version pydantic-core)" \
  "annotated-types==$(version annotated-types)" "typing-inspection==$(version typing-inspection)" \
  "hjson==$(version hjson)" "torchao==$(version torchao)" \
  "bitsandbytes==$(version bitsandbytes)"
"$PY" benchmarks/gpu_slim_wheel.py --cuda "$BNB_CUDA" "$OUT"/bitsandbytes-*.whl
# DeepSpeed is published as a source archive: built here once into a pure-Python wheel
# (its CUDA ops are compiled on the GPU machine when first used)
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "deepspeed==$(version deepspeed)"
ls -1s "$OUT"
du -sh "$OUT"
