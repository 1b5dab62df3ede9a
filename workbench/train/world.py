"""The world size and rank this process trains as: `WORLD_SIZE` and `RANK`, which torchrun
and DeepSpeed's launcher set for each rank (1 and 0 without a launcher)."""

from __future__ import annotations

import os

from workbench.config import format_problems
from workbench.inputs import shown


def world_from_env() -> tuple[int, int]:
    """(world size, rank) from the environment; ValueError naming every bad variable."""
    problems = []
    values = {}
    for name, default, minimum in (("WORLD_SIZE", "1", 1), ("RANK", "0", 0)):
        raw = os.environ.get(name, default)
        try:
            values[name] = int(raw)
            if values[name] < minimum:
                raise ValueError
        except ValueError:
            problems.append(
                f"environment {name}={shown(raw, 1000)}: must be an integer >= {minimum}"
            )
    if not problems and values["RANK"] >= values["WORLD_SIZE"]:
        problems.append(
            f"environment RANK={values['RANK']}: must be < WORLD_SIZE={values['WORLD_SIZE']}"
        )
    if problems:
        raise ValueError(format_problems(problems))
    return values["WORLD_SIZE"], values["RANK"]
