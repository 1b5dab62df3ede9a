"""A pinned layout: `plan(pin={...})` / `workbench plan --pin tp=8,pp=16,...` plans only the
setups with the pinned tensor-, pipeline-, context- and data-parallel sizes, engine,
micro-batch and recomputation (e.g. a published run's own layout, to compare its predicted time with its
measured one). A pin that cannot run is refused saying what must divide what.
"""

from __future__ import annotations

from typing import Any

from workbench.inputs import shown

#: what can be pinned, and what each takes
PINNABLE = {
    "tp": "tensor-parallel size (divides the GPUs a node, the heads and the widths)",
    "pp": "pipeline stages (divides the layers)",
    "dp": "data-parallel size (tp x pp x cp x dp = the GPUs; divides the global batch)",
    "cp": "context-parallel size (the sequence split over cp GPUs; seq_len a multiple of "
    "2 x cp; engine ddp, zero1, full_shard or shard_grad_op)",
    "engine": "ddp, zero1, zero2, zero3, full_shard or shard_grad_op",
    "micro_batch": "samples a micro-batch (divides the global batch / dp)",
    "checkpointing": "none, selective or full",
}
_RECOMPUTE = ("none", "selective", "full")


def read_pin(pin: Any, engines: tuple[str, ...]) -> dict[str, Any]:
    """`pin` as a dict (text "tp=8,pp=2" as the command takes it), each value checked
    alone; ValueError naming the key, the value and what is allowed."""
    if pin is None:
        return {}
    if isinstance(pin, str):
        parsed: dict[str, Any] = {}
        for part in (p.strip() for p in pin.split(",")):
            if not part:
                continue
            key, eq, value = part.partition("=")
            if not eq:
                raise ValueError(
                    f"pin={shown(pin)}: each pin is KEY=VALUE ({', '.join(PINNABLE)}), "
                    "comma-separated, e.g. tp=8,pp=2,engine=ddp"
                )
            key = key.strip()
            if key in parsed and parsed[key] != value.strip():
                raise ValueError(
                    f"pin={shown(pin)}: {key} is pinned twice ({key}={parsed[key]}, "
                    f"{key}={value.strip()}); pin each once"
                )
            parsed[key] = value.strip()
        if not parsed:
            raise ValueError(
                f"pin={shown(pin)}: names nothing to pin; give KEY=VALUE pairs "
                f"({', '.join(PINNABLE)}), comma-separated, e.g. tp=8,pp=2,engine=ddp, or "
                "leave it out"
            )
        pin = parsed
    if not isinstance(pin, dict):
        raise ValueError(f"pin={shown(pin)}: must be a dict of {', '.join(PINNABLE)}")
    out: dict[str, Any] = {}
    for key, value in pin.items():
        if key not in PINNABLE:
            raise ValueError(
                f"pin={shown(key)}: not pinnable; allowed: "
                + "; ".join(f"{k}: {v}" for k, v in PINNABLE.items())
            )
        if key == "engine":
            if value not in engines:
                raise ValueError(f"pin engine={shown(value)}: must be one of {', '.join(engines)}")
            out[key] = value
        elif key == "checkpointing":
            if value not in _RECOMPUTE:
                raise ValueError(
                    f"pin checkpointing={shown(value)}: must be one of {', '.join(_RECOMPUTE)}"
                )
            out[key] = value
        else:
            number = value
            if isinstance(value, str) and value.isascii() and value.isdigit():
                number = int(value)
            if isinstance(number, bool) or not isinstance(number, int) or number < 1:
                raise ValueError(f"pin {key}={shown(value)}: must be an integer >= 1")
            out[key] = number
    return out


def pin_text(pin: dict[str, Any]) -> str:
    """A pin as the command takes it: `tp=8,pp=2,engine=zero1`."""
    return ",".join(f"{k}={v}" for k, v in pin.items())


def check_pin(
    pin: dict[str, Any],
    *,
    gpus: int,
    gpus_per_node: int,
    layers: int,
    global_batch: int,
    dims: dict[str, int | None],
    seq_len: int | None = None,
    engines: tuple[str, ...] = (),
) -> None:
    """ValueError saying what must divide what when the pinned sizes cannot lay out
    `gpus` GPUs of `gpus_per_node` a node for a model of `layers` layers (and widths
    `dims`) at `global_batch` samples of `seq_len` tokens, on one of `engines`."""
    tp, pp, dp, mb = (pin.get(k) for k in ("tp", "pp", "dp", "micro_batch"))
    cp = pin.get("cp")
    if cp is not None and cp > 1:
        from workbench.planner.space import CP_ENGINES

        if seq_len is not None and seq_len % (2 * cp):
            raise ValueError(
                f"pin cp={cp}: 2 x cp = {2 * cp} must divide seq_len={seq_len} (torch's load "
                "balancer splits each sequence into 2 x cp chunks of equal length)"
            )
        if engines and not set(engines) & set(CP_ENGINES):
            raise ValueError(
                f"pin cp={cp}: context parallelism is planned with an engine that reduces "
                f"over dp x cp ({', '.join(CP_ENGINES)}: torchtitan's FSDP, Megatron-LM's "
                f"DDP and distributed optimizer); the engines planned are {', '.join(engines)}"
            )
    if tp is not None:
        if gpus_per_node % tp:
            raise ValueError(
                f"pin tp={tp}: must divide the {gpus_per_node} GPUs of a node (a "
                "tensor-parallel group stays inside one node, on NVLink)"
            )
        for name, size in dims.items():
            if size and size % tp:
                raise ValueError(f"pin tp={tp}: must divide {name}={size}")
    if pp is not None and layers % pp:
        raise ValueError(
            f"pin pp={pp}: must divide layers={layers} (every stage holds the same whole "
            "number of layers)"
        )
    sizes = {k: v for k, v in (("tp", tp), ("pp", pp), ("cp", cp), ("dp", dp)) if v is not None}
    product = 1
    for v in sizes.values():
        product *= v
    said = " x ".join(f"{k} {v}" for k, v in sizes.items())
    if len(sizes) == 1:  # one size: no product to show
        said = next(f"{k}={v}" for k, v in sizes.items())
    else:
        said += f" = {product}"
    if {"tp", "pp", "dp"} <= sizes.keys() and product != gpus:
        whole = "tp x pp x cp x dp" if cp is not None else "tp x pp x dp"
        raise ValueError(f"pin {said}: must be the {gpus} GPUs ({whole})")
    if gpus % product:
        raise ValueError(f"pin {said}: must divide the {gpus} GPUs (tp x pp x cp x dp = the GPUs)")
    if dp is not None and global_batch % dp:
        raise ValueError(
            f"pin dp={dp}: must divide global_batch={global_batch} (each data-parallel "
            "replica takes the same number of samples)"
        )
    if mb is not None:
        replicas = dp if dp is not None else None
        if replicas is not None and (global_batch // replicas) % mb:
            raise ValueError(
                f"pin micro_batch={mb}: must divide global_batch / dp = {global_batch} / "
                f"{replicas} = {global_batch // replicas} (whole micro-batches a step)"
            )
        if global_batch % mb:
            raise ValueError(f"pin micro_batch={mb}: must divide global_batch={global_batch}")


__all__ = ["PINNABLE", "check_pin", "pin_text", "read_pin"]
