"""A bitsandbytes wheel slimmed to the one CUDA build a GPU machine's PyTorch loads.

    python benchmarks/gpu_slim_wheel.py WHEEL --cuda 130     # rewrites WHEEL in place

bitsandbytes 0.50.2's manylinux wheel is 43 MB: it ships a `libbitsandbytes_cudaXYZ.so` for
CUDA 11.8 to 13.2, ROCm and XPU builds (129 MB unpacked). A lent machine's PyTorch is
2.11.0+cu130, so bitsandbytes loads `libbitsandbytes_cuda130.so` there (it picks the
library from `torch.version.cuda`). Keeping that one and the CPU build makes a wheel of
3.4 MiB (measured 2026-12-05, from 41.1 MiB), so it travels beside the other wheels and the checkout inside the 64 MiB a
lent machine takes. The wheel's RECORD is rewritten (hash and size of every file kept),
so it installs as any wheel.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

NATIVE = re.compile(r"libbitsandbytes_(?P<build>[a-z]+\d*)\.(so|dll|dylib)$")


def kept(name: str, cuda: str) -> bool:
    """Whether the wheel keeps `name`: every file but the native builds other than the
    CPU one and `cuda{cuda}`."""
    match = NATIVE.search(name)
    return match is None or match["build"] in ("cpu", f"cuda{cuda}")


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(wheel: Path, cuda: str, out: Path | None = None) -> tuple[int, int]:
    """Write `wheel` keeping only the files `kept` names (to `out`, else in place);
    returns (bytes before, bytes after)."""
    before = wheel.stat().st_size
    target = out or wheel
    with zipfile.ZipFile(wheel) as src:
        names = [i for i in src.infolist() if kept(i.filename, cuda)]
        if not any(NATIVE.search(i.filename) and f"cuda{cuda}" in i.filename for i in names):
            raise SystemExit(f"{wheel.name}: has no libbitsandbytes_cuda{cuda} build")
        files = {i.filename: src.read(i) for i in names}
    record = next(n for n in files if n.endswith(".dist-info/RECORD"))
    lines = [_record_line(n, d) for n, d in files.items() if n != record]
    files[record] = ("\n".join([*lines, f"{record},,"]) + "\n").encode()
    tmp = target.with_name(target.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for name, data in files.items():
            dst.writestr(name, data)
    tmp.replace(target)
    return before, target.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--cuda", default="130", help="CUDA build kept: 130 for torch +cu130")
    parser.add_argument("--out", type=Path, default=None, help="default: the wheel, in place")
    args = parser.parse_args(argv)
    before, after = slim(args.wheel, args.cuda, args.out)
    print(
        f"{args.wheel.name}: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB (cuda{args.cuda})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
