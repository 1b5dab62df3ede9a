#!/usr/bin/env bash
# Wheels of what benchmarks/gpu_check.py needs beyond a CUDA machine's own PyTorch image
# (DeepSpeed and its pydantic, hjson; torchao for the INT8 section), for Python $PY_VERSION,
# into .whl/ (git-ignored). Run on this machine, where the package registry is reached;
# benchmarks/gpu_run.sh installs them on a GPU machine that reaches no registry.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PY_VERSION=${PY_VERSION:-3.12}
OUT=${WHEELS:-.whl}
mkdir -p "$OUT"
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
  --implementation cp "${platforms[@]}" -d "$OUT" \
  "pydantic==$(version pydantic)" "pydantic-core==$(version pydantic-core)" \
  "annotated-types==$(version annotated-types)" "typing-inspection==$(version typing-inspection)" \
  "hjson==$(version hjson)" "torchao==$(version torchao)"
# DeepSpeed is published as a source archive: built here once into a pure-Python wheel
# (its CUDA ops are compiled on the GPU machine when first used)
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "deepspeed==$(version deepspeed)"
ls -1 "$OUT"
