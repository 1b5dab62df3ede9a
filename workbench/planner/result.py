"""What `plan(...)` returns: each setup as a `Plan` (its settings, per-GPU peak, step time,
MFU and HFU) and the ranking as a `PlanResult` (fitting plans fastest first, why the first
wins, the fastest plan per memory budget, the training time and cost, the table `workbench
plan` prints and the JSON it writes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.planner.hardware import Cluster
from workbench.planner.steptime import StepTime

_GIB = 1 << 30


def _step_text(seconds: float) -> str:
    """A step's time in ms below ten seconds, in s above (51.8 s, not 51848.2ms)."""
    if seconds < 10:
        return f"{seconds * 1e3:.1f}ms"
    return f"{seconds:.1f}s"


@dataclass(frozen=True)
class Plan:
    """One setup: its TrainConfig settings, per-GPU peak, whether it fits, its step time."""

    settings: dict[str, Any]
    engine: str
    tp: int
    pp: int
    dp: int
    peak_bytes: int
    required_bytes: int
    fits: bool
    time: StepTime
    tokens_per_step: int
    peak_terms: dict[str, int]
    mfu: float
    #: planner-only choices the Session does not train (another trainer's: torchtitan,
    #: Megatron): the pipeline schedule, float8, HSDP; workbench.planner.schedules
    extras: tuple[str, ...] = ()
    #: hardware FLOP utilisation: the recomputed forward counted (`estimate.flops`)
    hfu: float = 0.0
    #: context-parallel size: each sequence split over this many GPUs (a planner-only
    #: choice: torchtitan's; "cp N" among the extras); tp x pp x cp x dp = the GPUs
    cp: int = 1

    @property
    def step_seconds(self) -> float:
        return self.time.step_seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_seconds

    def label(self) -> str:
        """A short name: engine, layout, micro-batch x accumulation, checkpointing."""
        s = self.settings
        parts = [self.engine]
        if s.get("offload_optimizer", "none") != "none":
            parts.append("offload opt")
        if s.get("offload_params", "none") != "none":
            parts.append("offload params")
        parts.append(f"tp{self.tp} pp{self.pp} dp{self.dp}")
        parts.append(f"mb{s['micro_batch']}x{s['grad_accum']}")
        ckpt = s.get("activation_checkpointing", "none")
        if ckpt == "full":
            parts.append("ckpt")
        elif ckpt == "selective":
            parts.append("sel-ckpt")
        if s.get("attention") == "eager":
            parts.append("eager")
        if s.get("optimizer") == "adam8bit":
            parts.append("adam8bit")
        if s.get("precision") == "bf16-true":
            parts.append("bf16-true")
        if s.get("lora_rank"):
            parts.append(f"lora r{s['lora_rank']}")
        if s.get("compile"):
            parts.append("compile")
        return " ".join(parts + list(self.extras))

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label(),
            "settings": dict(self.settings),
            "engine": self.engine,
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "cp": self.cp,
            "fits": self.fits,
            "peak_bytes": self.peak_bytes,
            "required_bytes": self.required_bytes,
            "step_seconds": self.step_seconds,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "extras": list(self.extras),
            "hfu": self.hfu,
            "time_terms": dict(self.time.terms),
            "peak_terms": dict(self.peak_terms),
        }


@dataclass
class PlanResult:
    """The ranked plans (fitting ones first, fastest first) and what the search saw."""

    plans: list[Plan]
    unfit: list[Plan]
    cluster: Cluster
    global_batch: int
    seq_len: int
    searched: int
    notes: list[str] = field(default_factory=list)
    tokens: float | None = None
    price_per_gpu_hour: float | None = None
    headroom: float = 0.0
    #: the efficiency the ranking used and where it comes from (`planner.efficiency`)
    efficiency: float = 0.0
    efficiency_source: str = ""
    #: the model's layer shape (hidden, heads, ffn_hidden, mlp): what the GPU probe builds
    model_shape: dict[str, Any] = field(default_factory=dict)

    @property
    def best(self) -> Plan:
        return self.plans[0]

    def why(self, top: int = 3) -> list[str]:
        """Why the first plan beats each of the next: the term that differs the most."""
        out = []
        for other in self.plans[1:top]:
            deltas = {k: other.time.terms.get(k, 0.0) - v for k, v in self.best.time.terms.items()}
            term, delta = max(deltas.items(), key=lambda kv: kv[1])
            gap = other.step_seconds - self.best.step_seconds
            if gap > 1e-6 * self.best.step_seconds:
                out.append(
                    f"{self.best.label()} beats {other.label()} by {gap * 1e3:.1f} ms a step: "
                    f"{term} {delta * 1e3:+.1f} ms there"
                )
            elif other.time.data_parallel > self.best.time.data_parallel:
                hidden = (
                    " (their data-parallel communication hidden behind compute)"
                    if not other.time.data_parallel_exposed
                    else ""
                )
                out.append(
                    f"{self.best.label()} ties with {other.label()}{hidden} and communicates less: "
                    f"{self.best.time.data_parallel * 1e3:.1f} ms against "
                    f"{other.time.data_parallel * 1e3:.1f} ms a step"
                )
            else:
                out.append(
                    f"{self.best.label()} ties with {other.label()} and needs less memory: "
                    f"{self.best.required_bytes / _GIB:.1f} GiB against "
                    f"{other.required_bytes / _GIB:.1f} GiB a GPU"
                )
        return out

    @property
    def usable_bytes(self) -> float:
        """A GPU's memory less the headroom kept free."""
        return self.cluster.gpu.memory_bytes * (1 - self.headroom)

    def by_budget(self) -> list[tuple[int, Plan]]:
        """The fastest plan whose per-GPU peak fits each smaller memory budget (the GPU
        catalog's capacities, as PyTorch sees them, up to this GPU's, each less the
        headroom): a budget is listed where its fastest plan changes from the smaller
        budget's, and this GPU's own always."""
        from workbench.estimate import GPUS

        own = self.cluster.gpu.memory_bytes
        budgets = sorted({g.memory_bytes for g in GPUS.values() if g.memory_bytes < own})
        out: list[tuple[int, Plan]] = []
        for budget in [*budgets, own]:
            fitting = [p for p in self.plans if p.required_bytes <= budget * (1 - self.headroom)]
            if not fitting:
                continue
            if out and out[-1][1] is fitting[0]:
                if budget != own:
                    continue
                out.pop()  # this GPU's own budget stands for the smaller one's same plan
            out.append((budget, fitting[0]))
        return out

    def train_time(self, plan: Plan) -> tuple[float | None, float | None]:
        """(seconds, cost) to train `tokens` with `plan`, when tokens (and a price) given."""
        if self.tokens is None:
            return None, None
        seconds = self.tokens / plan.tokens_per_s
        cost = None
        if self.price_per_gpu_hour is not None:
            cost = seconds / 3600 * self.cluster.gpus * self.price_per_gpu_hour
        return seconds, cost

    def text(self, top: int = 10) -> str:
        c = self.cluster
        lines = [
            f"{len(self.plans)} of {self.searched} setups fit {c.nodes} x {c.gpus_per_node} "
            f"{c.gpu.name} at global batch {self.global_batch} x {self.seq_len} tokens",
            "",
        ]
        shown = self.plans[:top]
        labels = [p.label() for p in shown]
        steps = [_step_text(p.step_seconds) for p in shown]
        name_w = max([48, *map(len, labels)])
        step_w = max([9, *map(len, steps)])
        lines.append(
            f"{'#':>3}  {'plan':<{name_w}} {'peak/GPU':>9} {'step':>{step_w}} {'tokens/s':>10} "
            f"{'MFU':>5} {'HFU':>5}"
        )
        for i, (p, label, step) in enumerate(zip(shown, labels, steps, strict=True), 1):
            lines.append(
                f"{i:>3}  {label:<{name_w}} {p.required_bytes / _GIB:>7.1f}Gi "
                f"{step:>{step_w}} {p.tokens_per_s:>10,.0f} {p.mfu:>5.0%} {p.hfu:>5.0%}"
            )
        seconds, cost = self.train_time(self.best)
        if seconds is not None:
            money = f", ${cost:,.0f}" if cost is not None else ""
            lines.append(f"\n{self.tokens:,.0f} tokens with #1: {seconds / 86400:,.1f} days{money}")
        lines += ["", "Why #1:"] + [f"  {w}" for w in self.why()]
        if self.plans:
            spare = self.usable_bytes - self.best.required_bytes
            lines.append(
                f"  it fits with {spare / _GIB:.1f} GiB to spare: "
                f"{self.best.required_bytes / _GIB:.1f} of {self.usable_bytes / _GIB:.1f} GiB "
                "(the allocated peak, the allocator's reserve, the CUDA context, NCCL's buffers)"
            )
        lines += ["", "Fastest plan per memory budget:"]
        lines += [f"  {b / _GIB:>6.2f} GiB: {p.label()}" for b, p in self.by_budget()]
        if self.unfit:
            lines += ["", "Faster setups that do not fit (the largest term of each peak):"]
            for p in self.unfit[:3]:
                term, size = max(p.peak_terms.items(), key=lambda kv: kv[1])
                over = (p.required_bytes - self.usable_bytes) / _GIB
                lines.append(
                    f"  {p.label()}: {p.required_bytes / _GIB:.1f} GiB, over by {over:.1f} GiB: "
                    f"the largest term is {term} ({size / _GIB:.1f} GiB)"
                )
        lines += ["", f"Bandwidths: {c.source}"]
        lines += [f"Network: {c.network_source}"] if c.network_source else []
        lines += self.notes
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": {
                "gpu": self.cluster.gpu.name,
                "gpus_per_node": self.cluster.gpus_per_node,
                "nodes": self.cluster.nodes,
                "intra_node_bytes_per_s": self.cluster.intra_node,
                "inter_node_bytes_per_s": self.cluster.inter_node,
                "node_network_bytes_per_s": self.cluster.node_network,
                "intra_bus_bytes_per_s": self.cluster.fabric.intra_bus,
                "network_factor": self.cluster.network_factor,
                "network_source": self.cluster.network_source,
                "source": self.cluster.source,
            },
            "global_batch": self.global_batch,
            "seq_len": self.seq_len,
            "searched": self.searched,
            "headroom": self.headroom,
            "efficiency": self.efficiency,
            "efficiency_source": self.efficiency_source,
            "plans": [p.to_dict() for p in self.plans],
            "unfit": [p.to_dict() for p in self.unfit[:10]],
            "why": self.why(),
            "by_budget": [
                {"budget_bytes": b, "plan": p.label(), "required_bytes": p.required_bytes}
                for b, p in self.by_budget()
            ],
            "train": dict(zip(("seconds", "cost"), self.train_time(self.best), strict=True))
            | {"tokens": self.tokens, "price_per_gpu_hour": self.price_per_gpu_hour},
            "notes": list(self.notes),
        }
