"""Several CPU ranks in one spawn, for the multi-rank tests.

`run_ranks(work, out_dir)` spawns `world` processes; each sets the launcher's environment
(`MASTER_ADDR`/`MASTER_PORT` on a free loopback port, `RANK`, `LOCAL_RANK`, `WORLD_SIZE`),
one torch thread, joins the default process group (gloo unless told; `backend=None`
leaves it to the work, as a Session makes it from the environment), calls
`work(rank, out_dir)` and writes the dict it returns, or the error it raised (as
`{"error": "<type>: <message>\\n<traceback>"}`), to `out_dir` as JSON, then destroys the group.
The parent reads every rank's JSON back, in rank order. `work` must be a module-level
function (the spawned processes import it by name); it may write other files to `out_dir`.
A spawn costs seconds of start-up, so a test module runs all its configurations in one.
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

#: what each rank runs: (rank, out_dir) -> the JSON-able result the parent reads back
Work = Callable[[int, str], dict[str, Any]]


def run_ranks(
    work: Work, out_dir: str | Path, *, world: int = 2, backend: str | None = "gloo"
) -> list[dict[str, Any]]:
    """Run `work` on `world` ranks joined over `backend`; each rank's result, in rank order
    (a rank that failed holds "error")."""
    import torch.multiprocessing as mp

    from workbench.train.backends.process_group import _free_port

    args = (world, _free_port(), str(out_dir), work, backend)
    mp.spawn(_one_rank, args=args, nprocs=world)
    return [json.loads(_result_path(out_dir, r, world).read_text()) for r in range(world)]


def _result_path(out_dir: str | Path, rank: int, world: int) -> Path:
    return Path(out_dir, f"rank-{rank}-of-{world}.json")


def _one_rank(
    rank: int, world: int, port: int, out_dir: str, work: Work, backend: str | None
) -> None:
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
    )  # fmt: skip
    torch.set_num_threads(1)
    result: dict[str, Any] = {"error": "the rank stopped before its work returned"}
    try:
        if backend is not None:
            dist.init_process_group(backend)
        result = work(rank, out_dir)
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
    finally:
        try:
            _result_path(out_dir, rank, world).write_text(json.dumps(result))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
