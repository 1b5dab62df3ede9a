"""A dry run's compiled step (`compile=True`): the forward and backward graphs that
`torch.compile` would run, partitioned as it partitions them, run op by op on fake tensors.

`torch.compile` itself does not run under the dry run's tracker: TorchDynamo does not trace
frames while a dispatch mode (the fake tensor mode, PyTorch's memory tracker) is active, so
the module would run eagerly. The dry run therefore does what TorchDynamo hands to
AOTAutograd, without TorchDynamo: `functorch.compile.aot_function` traces the model's forward
and backward as one joint graph (with inductor's decompositions,
`torch._inductor.compile_fx.select_decomp_table`) and splits it with the min-cut partitioner
inductor uses (`min_cut_rematerialization_partition(compiler="inductor")`), which decides
what the backward reads from memory and what it recomputes (the same choice the compiled
step makes: tests/integration/test_compile_memory.py counts inductor's and this path's saved
tensors alike). The two graphs run through `torch.fx.Interpreter`, which frees each value
after its last use and takes its inputs boxed (the backward frees each saved tensor once
read), on the fake tensors, under the tracker.

What differs from a GPU's compiled step, and is said in the run's notes: inductor fuses
chains of pointwise ops into one kernel that never materialises their intermediates; here
every op's output exists until its last use, as in eager (the transient bytes of a forward
and of a recomputation are the eager ones). The graph holds no module structure: the
per-module peaks stop at the compiled module. The graphs are traced once, before the
tracker starts (one forward and backward of the batch under the same autocast), and the
gradients that trace made are dropped.

`compile_problem` says why a setup's compiled step cannot be simulated this way (then the
steps run eagerly and the formula's term "recomputed under torch.compile" is what stands
for compile; so does a forward that cannot be traced as one graph without TorchDynamo,
such as a transformers model's, whose mask building reads tensor values): an engine other than the plain loop (FSDP's hooks and DeepSpeed's engine run
around the module, outside one graph), activation checkpointing (a traced graph runs the
checkpointed region's forward without its recomputation), the activation offload's saved-
tensor hooks and QLoRA's 4-bit kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from workbench.config import TrainConfig
from workbench.display import fmt_bytes
from workbench.estimate.compiled import COMPILE_TERM
from workbench.train.batches import forward_and_loss


def compile_problem(config: TrainConfig, engine: str) -> str | None:
    """Why `config`'s compiled step cannot be simulated on `engine` (None: it can)."""
    if engine != "plain":
        return f"the {engine} engine runs around the module, outside one compiled graph"
    if str(config.activation_checkpointing) != "none":
        return "activation checkpointing inside a traced graph is not recomputed"
    if config.activation_offload:
        return "the activation offload's saved-tensor hooks are not traced"
    if config.qlora:
        return "QLoRA's 4-bit kernels are not traced"
    return None


def compile_note(problem: str | None, formula: Any) -> str:
    """The run's note on `compile`: how its compiled step ran (`problem` None), or why it
    ran eagerly and what the formula subtracts for compile instead."""
    peak = getattr(formula, "peak", None)
    term = peak.compile_not_kept_bytes if peak is not None else 0
    said = f"the formula's term {COMPILE_TERM!r}: {fmt_bytes(term)} of activations"
    if problem is None:
        return (
            "compile: the steps ran the forward and backward graphs torch.compile's "
            "partitioner makes (AOTAutograd, inductor's decompositions and min-cut "
            "partitioner), op by op on fake tensors: what the backward keeps is the compiled "
            "step's; inductor's fusion is not simulated (every op's output is made, as in "
            "eager), and the per-module peaks stop at the compiled module; " + said
        )
    return (
        f"compile: not simulated ({problem}): the steps ran eagerly; what compile does not "
        f"keep is {said}"
    )


def _interpreted(gm: torch.fx.GraphModule, _inputs: Any) -> Callable[[list[Any]], Any]:
    """A graph run op by op, each value freed after its last use, its inputs taken boxed."""

    def run(args: list[Any]) -> Any:
        return torch.fx.Interpreter(gm).boxed_run(args)

    run._boxed_call = True  # type: ignore[attr-defined]  # AOTAutograd's calling convention
    return run


class PartitionedModule(nn.Module):
    """`module`'s forward as the compiled step's joint graph, partitioned (module
    docstring); its parameters and buffers are `module`'s own."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        from functorch.compile import aot_function, min_cut_rematerialization_partition
        from torch._inductor.compile_fx import select_decomp_table

        self.module = module
        names = [n for n, _ in module.named_parameters()]
        buffer_names = [n for n, _ in module.named_buffers()]

        def functional(params: list[Any], buffers: list[Any], *args: Any, **kwargs: Any) -> Any:
            state = {**dict(zip(names, params, strict=True))}
            state.update(dict(zip(buffer_names, buffers, strict=True)))
            return torch.func.functional_call(module, state, args, kwargs)

        self._graphs = aot_function(
            functional,
            fw_compiler=_interpreted,
            bw_compiler=_interpreted,
            decompositions=select_decomp_table(),
            partition_fn=functools.partial(
                min_cut_rematerialization_partition, compiler="inductor"
            ),
        )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        params = [p for _, p in self.module.named_parameters()]
        buffers = [b for _, b in self.module.named_buffers()]
        return self._graphs(params, buffers, *args, **kwargs)


def partitioned(
    module: nn.Module, batch: Any, loss_fn: Any, autocast: Callable[[], Any], kernels: Any
) -> tuple[nn.Module, str | None]:
    """`module` as a `PartitionedModule`, its graphs traced with one forward and backward of
    `batch` (on fake tensors, under `autocast()` and the `kernels` function mode, before
    the tracker starts), and None; the trace's gradients dropped. A forward that cannot be
    traced as one graph without TorchDynamo (one that reads a tensor's value on the host,
    as transformers' mask building does: TorchDynamo would break the graph there) gives
    `module` itself and why."""
    try:
        compiled = PartitionedModule(module)
        with kernels:
            loss = forward_and_loss(compiled, batch, loss_fn, autocast)
            loss.backward()
        del loss
    except Exception as exc:  # the model's own code: any failure means "not traced"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return module, f"its forward cannot be traced as one graph ({type(exc).__name__}: {reason})"
    finally:
        for p in module.parameters():
            p.grad = None
    return compiled, None


__all__ = ["PartitionedModule", "compile_note", "compile_problem", "partitioned"]
