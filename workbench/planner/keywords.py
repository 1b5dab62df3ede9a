"""plan()'s keywords as `workbench plan` names them: the CLI's own names moved to plan()'s
(`params`, `price`, `no_offload`), the settings each plan chooses and the output flags
refused by name, and `--gpus` read as nodes of `gpus_per_node` (pure)."""

from __future__ import annotations

from typing import Any

from workbench.estimate.inputs_check import ARCH_FIELDS
from workbench.inputs import shown

#: the most GPUs a plan spans (the largest published runs use tens of thousands)
MAX_GPUS = 1 << 20

#: `workbench plan`'s names for plan()'s keywords (its flags without the dashes)
CLI_NAMES = {"params": "n_params", "price": "price_per_gpu_hour", "no_offload": "offload"}
#: the flags of `workbench plan` that are about its output, with what the API does instead
OUTPUT_FLAGS = {
    "top": "result.text(top=N) shows the first N",
    "json": "result.to_dict() is the JSON",
    "probe": "workbench.train.measure.plan_probe.probe_plans(result, k) runs the top k",
    "export": "workbench.export.export_job(TrainConfig(**result.best.settings), ...) writes "
    "plan #1 as a job",
    "export_model": "export_job(..., model=SPEC) names the module the job trains",
    "export_format": "export_job(..., format=F) picks the format",
}
#: the estimator's inputs each plan chooses itself (the search space)
SEARCHED = (
    "micro_batch",
    "grad_accum",
    "zero_stage",
    "fsdp",
    "offload_optimizer",
    "offload_params",
    "tensor_parallel",
    "pipeline_parallel",
    "checkpointing",
    "gpus",
)
#: the estimator's inputs that describe the model, passed on as they are
SHAPE_KEYS = (*(k for k in ARCH_FIELDS if k != "seq_len"), "dropout")


def cli_keywords(shape: dict[str, Any], given: dict[str, Any]) -> None:
    """`workbench plan`'s own names in `shape` (params, price, no_offload) moved to
    plan()'s keywords in `given`; ValueError naming any other keyword plan() does not take:
    a setting each plan chooses, an output flag of the CLI, or an unknown name (with the
    close one and the allowed ones)."""
    import difflib

    for name in list(shape):
        if name in CLI_NAMES:
            value = shape.pop(name)
            target = CLI_NAMES[name]
            if name == "no_offload":
                if not isinstance(value, bool):
                    raise ValueError(f"no_offload={shown(value)}: must be True or False")
                given["offload"] = given["offload"] and not value
                continue
            if given[target] is not None:
                raise ValueError(
                    f"{name}={shown(value)}: give it or {target}= (the same input), not both"
                )
            given[target] = value
        elif name in SHAPE_KEYS:
            continue
        elif name in SEARCHED:
            raise ValueError(
                f"{name}={shown(shape[name])}: each plan chooses it (plan.settings holds "
                "it); plan() takes the cluster (gpu, gpus or gpus_per_node and nodes), the "
                "batch and what to pin (engines, precision, optimizer, attention, offload)"
            )
        elif name in OUTPUT_FLAGS:
            raise ValueError(
                f"{name}={shown(shape[name])}: an output flag of `workbench plan`; plan() "
                f"returns every plan and {OUTPUT_FLAGS[name]}"
            )
        else:
            known = [*given, "gpus", "gpus_per_node", "nodes", *CLI_NAMES, *SHAPE_KEYS]
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"{name}={shown(shape[name])}: plan() takes no such keyword; {hint}"
                f"allowed: {', '.join(known)}"
            )


def nodes_of(gpus: Any, gpus_per_node: int | None, nodes: int | None) -> tuple[Any, Any]:
    """(gpus_per_node, nodes) from `gpus` in all, as `workbench plan --gpus` reads it: a
    node holds 8 (or `gpus` when fewer) unless `gpus_per_node` says; ValueError naming
    gpus when it is not whole nodes or disagrees with `nodes`."""
    if gpus is None:
        return (8 if gpus_per_node is None else gpus_per_node), (1 if nodes is None else nodes)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= MAX_GPUS:
        raise ValueError(f"gpus={shown(gpus)}: must be an integer from 1 to {MAX_GPUS:,}")
    per = min(gpus, 8) if gpus_per_node is None else gpus_per_node
    if isinstance(per, bool) or not isinstance(per, int) or per < 1:
        return per, nodes  # cluster() names gpus_per_node
    if gpus % per:
        raise ValueError(f"gpus={gpus}: must be a whole number of nodes of {per} GPUs")
    if nodes is not None and nodes != gpus // per:
        count = gpus // per
        raise ValueError(
            f"gpus={gpus}: is {count} node{'s' if count != 1 else ''} of {per} GPUs, not "
            f"nodes={shown(nodes)}"
        )
    return per, gpus // per


__all__ = ["CLI_NAMES", "MAX_GPUS", "OUTPUT_FLAGS", "SEARCHED", "SHAPE_KEYS", "cli_keywords",
           "nodes_of"]  # fmt: skip
