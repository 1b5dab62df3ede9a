"""What `workbench estimate` prints: the report of one estimate, the ZeRO stages side by
side, the GPU catalog and the model presets (plain text from the estimator's results; the
command's parsing lives in `workbench.cli.estimate`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from workbench.cli import json_text


def _fmt(value: int | None, unit: int) -> str:
    return "-" if value is None else f"{value / unit:,.2f}"


def _count(n: float) -> str:
    if n >= 1e15:
        return f"{n:.4g}"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.4g}{suffix}"
    return f"{n:g}"


def _duration(seconds: float) -> str:
    if seconds >= 86400 * 1e6:
        return f"{seconds / 86400:.3g} days"
    if seconds >= 86400:
        return f"{seconds / 86400:,.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} hours"
    return f"{seconds:,.0f} s"


#: How an offload device is named.
_DEVICE_NAMES = {"cpu": "CPU", "nvme": "NVMe"}


def offload_devices(e: Any, asked: Mapping[str, str | None] | None) -> dict[str, str | None]:
    """{"offload_optimizer": "cpu" / "nvme" / None, "offload_params": ...}: where estimate
    `e` offloads each (None: it does not; `asked`: the devices the flags or the DeepSpeed
    config name, "cpu" where they name none), for the report and the JSON."""
    asked = asked or {}
    return {
        name: (asked.get(name) or "cpu") if getattr(e, name) else None
        for name in ("offload_optimizer", "offload_params")
    }


def _offload_label(e: Any, asked: Mapping[str, str | None] | None) -> str:
    """ "offloaded to CPU", "offloaded to NVMe" or "offloaded to CPU and NVMe"."""
    used = {d for d in offload_devices(e, asked).values() if d is not None} or {"cpu"}
    return "offloaded to " + " and ".join(_DEVICE_NAMES[d] for d in sorted(used))


def _headline(e: Any, asked: Mapping[str, str | None] | None = None) -> str:
    gpus = f"{e.gpus} GPU" + ("s" if e.gpus > 1 else "")
    source = e.model or (os.path.basename(e.hf_config) if e.hf_config else None)
    count = f"{_count(e.n_params)} parameters"
    if e.experts:
        count += f", {_count(e.active_params)} active: {e.experts_per_token} of {e.experts} experts"
    name = f"{source} ({count})" if source else None
    parts = [name or f"{_count(e.n_params)} parameters", e.precision, e.optimizer]
    parts += [f"FSDP {e.fsdp}" if e.fsdp != "off" else f"ZeRO stage {e.zero_stage}", gpus]
    if e.context_parallel > 1:
        split = (
            f"tp {e.tensor_parallel} x pp {e.pipeline_parallel} x cp {e.context_parallel} x "
            f"dp {e.data_parallel // e.context_parallel}"
        )
        parts.append(split + (" (sequence parallel)" if e.sequence_parallel else ""))
    elif e.tensor_parallel > 1 or e.pipeline_parallel > 1:
        split = f"tp {e.tensor_parallel} x pp {e.pipeline_parallel} x dp {e.data_parallel}"
        parts.append(split + (" (sequence parallel)" if e.sequence_parallel else ""))
    devices = offload_devices(e, asked)
    if devices["offload_optimizer"]:
        parts.append(f"optimizer offload to {_DEVICE_NAMES[devices['offload_optimizer']]}")
    if devices["offload_params"]:
        parts.append(f"parameter offload to {_DEVICE_NAMES[devices['offload_params']]}")
    if e.layers is not None:
        parts.append(f"micro-batch {e.micro_batch}, checkpointing {e.checkpointing}")
        parts.append(f"{e.attention} attention" + ("" if e.dropout else ", no dropout"))
    if e.grad_accum > 1:
        parts.append(f"{e.grad_accum} micro-batches per step")
    if e.lora_rank:
        parts.append(
            f"LoRA rank {e.lora_rank}: {_count(e.lora_params)} adapter parameters train "
            f"({e.trainable_fraction:.2%})"
            + (f", {_count(e.qlora_params)} base weights in 4-bit NF4" if e.qlora_params else "")
        )
    return ", ".join(parts)


def _shape_line(e: Any) -> str:
    """The architecture in one line: what the activations and the split were computed for."""
    heads = f"{e.heads} heads" + (f" ({e.kv_heads} kv)" if e.kv_heads != e.heads else "")
    embeddings = "tied" if e.tied_embeddings else "untied"
    return (
        f"shape: {e.layers} layers, hidden {e.hidden}, {heads}, {e.mlp} MLP {e.ffn_hidden} "
        f"with {e.activation_function}, "
        f"vocab {e.vocab}, sequence {e.seq_len}, {e.norm} ({e.norm_impl})"
        + (" with query and key norms" if e.qk_norm else "")
        + (" and norms of each block's output" if e.post_norms else "")
        + f", biases {e.bias}, "
        f"{e.positions} positions, {embeddings} embeddings"
        + (f", {e.eager_softmax} softmax" if e.attention == "eager" else "")
    )


def report(
    e: Any,
    unit: int,
    unit_name: str,
    asked: Mapping[str, str | None] | None = None,
    notes: Sequence[str] = (),
) -> str:
    act = (
        _fmt(e.activation_bytes, unit)
        if e.activation_bytes is not None
        else f"not counted ({e.activation_note}: --simulate)"
        if e.activation_note
        else "not counted (no shape: give --model, --hf-config or --layers --hidden --heads "
        "--seq-len --vocab)"
    )
    rows = [(f"peak of a step, at the {e.peak.phase}", _fmt(e.peak_bytes, unit))]
    for name, value in e.peak.terms.items():
        label = f"{name} ({e.optimizer_impl})" if name == "optimizer step temporaries" else name
        rows.append((f"  {label}", _fmt(value, unit)))
    rows += [
        ("CUDA context and allocator reserve", _fmt(e.overhead_bytes, unit)),
        ("peak + reserve", _fmt(e.required_bytes, unit)),
    ]
    if e.reserve is not None and e.reserve.given_bytes is None:
        r = e.reserve
        rows += [
            ("  allocated peak (max_memory_allocated)", _fmt(e.peak_bytes, unit)),
            (
                "  reserved peak (+ allocator, rounding)",
                _fmt(e.peak_bytes + r.allocator_bytes, unit),
            ),
            ("  nvidia-smi (+ CUDA context, NCCL)", _fmt(e.required_bytes, unit)),
        ]
    rows += [
        ("model states at rest", ""),
        ("  parameters", _fmt(e.params_bytes, unit)),
        ("  gradients", _fmt(e.grads_bytes, unit)),
        ("  optimizer states", _fmt(e.optimizer_bytes, unit)),
        ("stored activations", act),
        ("states + activations", _fmt(e.total_bytes, unit)),
    ]
    if e.cpu_offload_bytes:
        rows.append((_offload_label(e, asked), _fmt(e.cpu_offload_bytes, unit)))
    for name, value in e.peak.host_terms.items():
        rows.append((name, _fmt(value, unit)))
    width = max(len(r[1]) for r in rows if r[1][:1].isdigit() or r[1] == "-")
    label_width = max(len(r[0]) for r in rows) + 2
    lines = [_headline(e, asked)]
    if e.layers is not None:
        lines.append(_shape_line(e))
    lines += [f"note: {note}" for note in notes]
    if e.shard_params != e.n_params:
        lines.append(
            f"parameters per GPU before ZeRO: {_count(e.shard_params)} (tensor-parallel share "
            f"of the largest pipeline stage), sharded over {e.data_parallel} data-parallel GPUs"
        )
    lines.append(f"per GPU, {unit_name} ({'2^30' if unit_name == 'GiB' else '10^9'} bytes):")
    lines += [
        f"  {label:<{label_width}}{value:>{width}}"
        if value[:1].isdigit() or value == "-"
        else f"  {label:<{label_width}}{value}".rstrip()
        for label, value in rows
    ]
    saving = e.peak.chunked_loss_saving_bytes
    if saving:
        lines.append(
            f"chunked cross-entropy (--loss-chunks 8) would lower the peak by "
            f"{_fmt(saving, unit)} {unit_name}"
        )
    if e.gpu is not None:
        verdict = "fits" if e.fits else "does NOT fit"
        lines.append(
            f"{e.gpu}: {_fmt(e.gpu_memory_bytes, unit)} {unit_name} per GPU -> the peak + "
            f"reserve {verdict}"
            + (
                f" ({_fmt(abs(e.margin_bytes), unit)} {unit_name} "
                + ("to spare)" if e.fits else f"over; the largest term is {e.largest_term[0]})")
                if e.margin_bytes is not None
                else ""
            )
            + e.without_activations
        )
        if e.layers is not None:
            mmb = e.max_micro_batch
            lines.append(
                "largest micro-batch that fits: "
                + (str(mmb) if mmb is not None else "none (not even 1)")
            )
    if e.train_flops is not None:
        if e.layers is None:  # a parameter count: every parameter multiplied, no attention
            line = f"compute: 6 x params x tokens = {e.model_flops or e.train_flops:.3g} FLOPs"
        else:
            line = f"compute: {e.model_flops or e.train_flops:.3g} model FLOPs (6 N + 12 L q s a token)"
        if e.model_flops is not None and e.train_flops > e.model_flops:
            line += f", {e.train_flops:.3g} with the {e.checkpointing} recomputation"
        if e.train_seconds is not None:
            line += f"; {_duration(e.train_seconds)} on {e.gpus} x {e.gpu} at {e.utilisation_text}"
            if e.cost is not None:
                cost = f"{e.cost:,.0f}" if e.cost < 1e12 else f"{e.cost:.3g}"
                line += f"; cost {cost} at {e.price_per_gpu_hour:g} per GPU-hour"
        elif e.gpu is None:
            line += " (name a --gpu for time and cost)"
        else:
            line += f" ({e.gpu} has no {e.precision} tensor rate in its data sheet: time not known)"
        lines.append(line)
    if unit_name == "GiB":
        lines.append("(--units gb prints decimal GB, 10^9 bytes, the ZeRO paper's unit)")
    return "\n".join(lines)


def stages_table(
    stages: Sequence[Any],
    unit: int,
    unit_name: str,
    asked: Mapping[str, str | None] | None = None,
) -> str:
    head = [f"per GPU, {unit_name}"] + [f"stage {e.zero_stage}" for e in stages]
    rows: list[list[str]] = [
        ["parameters"] + [_fmt(e.params_bytes, unit) for e in stages],
        ["gradients"] + [_fmt(e.grads_bytes, unit) for e in stages],
        ["optimizer states"] + [_fmt(e.optimizer_bytes, unit) for e in stages],
        ["activations"] + [_fmt(e.activation_bytes, unit) for e in stages],
        ["states + activations"] + [_fmt(e.total_bytes, unit) for e in stages],
        ["peak of a step"] + [_fmt(e.peak_bytes, unit) for e in stages],
        [_offload_label(stages[-1], asked)] + [_fmt(e.cpu_offload_bytes, unit) for e in stages],
    ]
    if stages[0].gpu is not None:
        rows.append([f"fits {stages[0].gpu}"] + ["yes" if e.fits else "no" for e in stages])
        rows.append(["margin (- over)"] + [_fmt(e.margin_bytes, unit) for e in stages])
        if stages[0].layers is not None:
            rows.append(["max micro-batch"] + [str(e.max_micro_batch or "none") for e in stages])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    out = [
        _headline(stages[0], asked).replace(f"ZeRO stage {stages[0].zero_stage}", "ZeRO stages 0-3")
    ]
    for r in [head, *rows]:
        out.append(
            r[0].ljust(widths[0])
            + "".join(f"  {c:>{w}}" for c, w in zip(r[1:], widths[1:], strict=True))
        )
    if stages[0].activation_bytes is None:
        out.append(
            "activations not counted: no shape (give --model, --hf-config or --layers --hidden "
            "--heads --seq-len --vocab)"
        )
    return "\n".join(out)


def gpu_table(*, as_json: bool) -> str:
    from workbench.estimate import GPUS

    if as_json:
        return json_text({"gpus": [vars(g) for g in GPUS.values()]})
    head = ["name", "GiB seen", "FP16 TFLOPS", "BF16", "FP32", "TF32", "description"]
    rows = [
        [
            g.name,
            f"{g.memory_bytes / (1 << 30):.2f}",
            f"{g.peak_fp16_flops / 1e12:g}",
            "-" if g.peak_bf16_flops is None else f"{g.peak_bf16_flops / 1e12:g}",
            f"{g.peak_fp32_flops / 1e12:g}",
            "-" if g.peak_tf32_flops is None else f"{g.peak_tf32_flops / 1e12:g}",
            g.description,
        ]
        for g in GPUS.values()
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [head, *rows]
    ]
    lines.append(
        "dense peak rates from vendor data sheets (sources in workbench/estimate/catalog.py)"
    )
    return "\n".join(lines)


def model_table(*, as_json: bool) -> str:
    from workbench.estimate import PRESETS

    if as_json:
        return json_text(
            {
                "models": [
                    {
                        "name": m.name,
                        "family": m.family,
                        "n_params": m.n_params,
                        **m.architecture.to_dict(),
                        "source": m.source,
                    }
                    for m in PRESETS
                ]
            }
        )
    head = ["name", "family", "params", "layers", "hidden", "heads", "kv", "MLP", "vocab", "seq"]
    rows = [
        [
            m.name,
            m.family,
            _count(m.n_params),
            str(a.layers),
            str(a.hidden),
            str(a.heads),
            str(a.kv_heads),
            f"{a.mlp} {a.ffn_hidden}",
            str(a.vocab),
            str(a.seq_len),
        ]
        for m in PRESETS
        for a in (m.architecture,)
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [head, *rows]
    ]
    lines.append(
        "parameter counts computed from the shapes; sources in workbench/estimate/presets.py "
        "(--list-models --json prints them)"
    )
    return "\n".join(lines)


__all__ = ["gpu_table", "model_table", "offload_devices", "report", "stages_table"]
