#!/usr/bin/env bash
# On a lent GPU machine (its own python3 with CUDA PyTorch; no registry reached): install the
# wheels benchmarks/gpu_wheels.sh gathered into .whl/ beside that PyTorch, then run the GPU
# check with this checkout on the path, and copy its results to $OUT (the folder that comes
# back) if set. Arguments go to gpu_check.py (e.g. --allow-partial), and its exit status is
# this script's: 0 every check passed, 1 a check or section failed, 3 nothing failed but a
# check could not run here (one GPU: the 2-rank NCCL all-reduce) unless --allow-partial,
# 143 on SIGTERM; 2 when the wheels do not install.
set -uo pipefail
cd "$(dirname "$0")/.."
SITE=${SITE:-/tmp/wb-site}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl || exit 2
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c "import torch, deepspeed; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'deepspeed', deepspeed.__version__)"
python3 benchmarks/gpu_check.py "$@"
code=$?
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT" && cp benchmarks/results/gpu_check*.json "$OUT"/ 2>/dev/null
fi
exit $code
