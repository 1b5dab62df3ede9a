"""The rate a GPU runs a training step's FLOPs at: the planner's efficiency, from evidence.

The step-time model divides a step's hardware FLOPs (`workbench.estimate.flops`: the model's
6 N + 12 L q s a token and what recomputation runs again) by the GPUs' dense peak times an
efficiency: the share of the peak the GPUs sustain on what they run (the hardware FLOP
utilisation, HFU, of a run whose communication hides behind compute). It comes from, in
order:

1. `plan(mfu=...)` / `--mfu` (`efficiency=` / `--efficiency`, the older name): yours;
2. `plan(calibrate=...)` / `--calibrate`: a measured step of the planned model on your GPU
   (`measured_efficiency`): its tokens a second x the hardware FLOPs a token over the
   GPUs' peak;
3. `PUBLISHED`: the median of published measurements of comparable runs on the GPU, each
   read as the rate its GPUs ran their hardware FLOPs at (a run's MFU x its hardware over
   model FLOPs: 1 without recomputation, about 4/3 with full recomputation), each cited;
4. for a GPU with no published run here, `FALLBACK` (the estimator's `DEFAULT_MFU`), said.

A published figure includes whatever communication its run exposed, so the default is a
little low for a run that hides it all and the model's own communication terms are added
on top; docs/planner.md ("Efficiency from evidence") gives each figure.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.estimate.flops import FlopCount
from workbench.estimate.schema import DEFAULT_MFU
from workbench.inputs import DuplicateKey, is_bool, is_int, no_duplicate_keys, shown, typed

#: the efficiency used for a GPU with no published run in `PUBLISHED`
FALLBACK = DEFAULT_MFU


@dataclass(frozen=True)
class Published:
    """One published measurement: the run, its GPU (catalog name), its MFU as published
    (or as recomputed with the one FLOP count where the source gives a throughput), the
    hardware over model FLOPs of its recomputation, and where it is published."""

    run: str
    gpu: str
    mfu: float
    hardware_over_model: float
    source: str

    @property
    def rate(self) -> float:
        """The share of the peak its GPUs ran their hardware FLOPs at."""
        return self.mfu * self.hardware_over_model


_TT = (
    "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1 (5,762 "
    "tokens/s/GPU; 57.9 GFLOP a token: 33.7% of the 989 TFLOP/s peak; the file says "
    "33%, on 500 W HBM2e H100s)"
)
_MOSAIC = "mosaicml/llm-foundry scripts/train/benchmarking/README.md"
_NARAYANAN = (
    "Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training on GPU Clusters "
    "Using Megatron-LM', Table 1 (% of the 312 TFLOP/s peak, counting the recomputed "
    "forward: hardware FLOPs)"
)
_LLAMA3 = (
    "Llama Team 2024, 'The Llama 3 Herd of Models', Table 4 (BF16 MFU 41% on 16,384 GPUs; "
    "recomputation not stated, read as none)"
)

#: catalog GPU -> published measurements of 16-bit training on it
PUBLISHED: dict[str, tuple[Published, ...]] = {
    "h100-80gb": (
        Published(
            "Llama 3.1 8B, 8 GPUs, FSDP, local batch 2, selective recomputation",
            "h100-80gb",
            0.337,
            (57.91 + 4.29) / 57.91,  # the attention core's forward again (4 L q s)
            _TT,
        ),
        Published(
            "MPT-7B, seq 2048, 8 GPUs, FSDP, micro-batch 6, no recomputation",
            "h100-80gb",
            0.4644,
            1.0,
            f"{_MOSAIC}, H100 80GB BF16 table (MFU 46.44)",
        ),
        Published(
            "MPT-13B, seq 2048, 8 GPUs, FSDP, micro-batch 2, no recomputation",
            "h100-80gb",
            0.3979,
            1.0,
            f"{_MOSAIC}, H100 80GB BF16 table (MFU 39.79)",
        ),
        Published(
            "MPT-30B, seq 2048, 8 GPUs, FSDP, micro-batch 3, full recomputation",
            "h100-80gb",
            0.3811,
            0.5082 / 0.3811,
            f"{_MOSAIC}, H100 80GB BF16 table (MFU 38.11, HFU 50.82)",
        ),
        Published(
            "Llama 3 405B, 16,384 GPUs, TP 8 PP 16 DP 128",
            "h100-80gb",
            0.41,
            1.0,
            _LLAMA3,
        ),
    ),
    "a100-80gb": (
        Published(
            "GPT 1.7B, 32 GPUs, data parallel, full recomputation",
            "a100-80gb",
            0.44 * 3 / 4,
            4 / 3,
            f"{_NARAYANAN}: 44%",
        ),
        Published(
            "GPT 145.6B, 1,536 GPUs, TP 8 PP 8, full recomputation",
            "a100-80gb",
            0.47 * 3 / 4,
            4 / 3,
            f"{_NARAYANAN}: 47%",
        ),
        Published(
            "GPT 1T, 3,072 GPUs, TP 8 PP 64, full recomputation",
            "a100-80gb",
            0.52 * 3 / 4,
            4 / 3,
            f"{_NARAYANAN}: 52%",
        ),
        Published(
            "MPT-7B, seq 2048, 8 GPUs, FSDP, micro-batch 6, no recomputation",
            "a100-80gb",
            0.6423,
            1.0,
            f"{_MOSAIC}, A100 80GB table (MFU 64.23)",
        ),
        Published(
            "MPT-13B, seq 2048, 8 GPUs, FSDP, micro-batch 2, no recomputation",
            "a100-80gb",
            0.5957,
            1.0,
            f"{_MOSAIC}, A100 80GB table (MFU 59.57)",
        ),
    ),
}
# the same compute die: the H200's and the A100 40GB's figures are their siblings'
PUBLISHED["h200-141gb"] = PUBLISHED["h100-80gb"]
PUBLISHED["a100-40gb"] = PUBLISHED["a100-80gb"]


@dataclass(frozen=True)
class Efficiency:
    """The efficiency a ranking uses and where it comes from (said on the plan)."""

    value: float
    source: str


def default_efficiency(gpu: str) -> Efficiency:
    """The published default for catalog GPU `gpu` (the median rate of `PUBLISHED`), or
    `FALLBACK` said as such."""
    rows = PUBLISHED.get(gpu)
    if not rows:
        return Efficiency(
            FALLBACK,
            f"efficiency {FALLBACK:.2f}: no published run on {gpu} in the table "
            "(workbench.planner.efficiency.PUBLISHED): the estimator's default; give --mfu "
            "or --calibrate",
        )
    value = statistics.median(r.rate for r in rows)
    return Efficiency(
        value,
        f"efficiency {value:.2f}: the median of {len(rows)} published runs on {gpu} "
        f"({', '.join(f'{r.rate:.2f}' for r in rows)}; docs/planner.md)",
    )


#: where a measured step comes from (said when `calibrate` holds none)
WHERE = (
    "a measured step comes from a Session (calibrate=session, or its run folder's "
    "log.jsonl, written when the config has a checkpoint_dir), a watched trainer "
    "(workbench.integrations: calibrate=observer), a list of StepRecords, or one record's "
    "to_dict(); train the planned model for a few steps on your GPU first"
)

#: the same for the command line, which reads files only
WHERE_CLI = (
    "a measured step comes from a step log file: a Session's run folder or its log.jsonl "
    "(written when the config has a checkpoint_dir), or a JSON file of step records (one "
    "record's to_dict(), or a list of them, such as an observer's records saved with "
    "json.dump); train the planned model for a few steps on your GPU first"
)


class CalibrateError(ValueError):
    """`calibrate` holds no usable measured step. `source` names it (the file as given, or
    what was given), `is_file` says it is a file, `problem` says what is wrong (from `key`,
    `value` and `allowed` when one entry of a step record is at fault), `hint` whether to
    say where a measured step comes from. `str()` is plan()'s wording; `cli_text()` the
    command's (`--calibrate FILE: ...`, the places a measured step comes from on the CLI)."""

    def __init__(
        self,
        source: Any,
        problem: str = "",
        *,
        is_file: bool = False,
        key: str | None = None,
        value: Any = None,
        allowed: str = "",
        hint: bool = True,
    ) -> None:
        self.source = source
        self.is_file = is_file
        self.key = key
        self.value = value
        self.allowed = allowed
        self.hint = hint
        self.problem = problem if key is None else f"{key}={shown(value)}: must be {allowed}"
        super().__init__(self._text(f"calibrate={shown(source)}", WHERE))

    def _text(self, head: str, where: str) -> str:
        return f"{head}: {self.problem}" + (f"; {where}" if self.hint else "")

    def cli_text(self) -> str:
        """The error said with the flag: `--calibrate FILE: ...`."""
        name = typed(self.source) if self.is_file else shown(self.source)
        return self._text(f"--calibrate {name}", WHERE_CLI)


@dataclass(frozen=True)
class MeasuredStep:
    """What measured steps say for calibration: tokens a second over `world_size` GPUs (all
    the tokens of `steps` steps after warm-up over all their seconds), the recomputation and
    precision they ran with."""

    tokens_per_s: float
    world_size: int
    recompute: str
    precision: str
    steps: int
    source: str
    #: whether `source` is a file (a step log): said as such on the command line
    is_file: bool = False


def _record_dicts(calibrate: Any) -> tuple[list[dict[str, Any]], str]:
    """The step records `calibrate` holds, as dicts, and a name for them."""
    if isinstance(calibrate, (str, Path)):
        if not str(calibrate).strip():
            raise CalibrateError(calibrate, "is empty: give a path")
        path = Path(calibrate)
        if path.is_dir():
            path = path / "log.jsonl"
        lines = _read_log_tail(path)
        got = [d for d in lines if isinstance(d, dict) and d.get("type", "record") == "record"]
        return got, str(path)
    if isinstance(calibrate, dict):
        return [calibrate], "the step record given"
    if hasattr(calibrate, "records_since"):  # a Session or an observer
        items = list(calibrate.records_since(0))
        return [_as_dict(r) for r in items], f"{type(calibrate).__name__}'s steps"
    if isinstance(calibrate, (list, tuple)):
        return [_as_dict(r) for r in calibrate], "the step records given"
    if hasattr(calibrate, "tokens_per_s"):
        return [_as_dict(calibrate)], "the step record given"
    raise CalibrateError(calibrate, "not a measured step")


#: the most of a log read: its last 16 MiB (thousands of steps; the steady ones are last)
LOG_TAIL_BYTES = 16 << 20


def _read_log_tail(path: Path) -> list[Any]:
    """The JSON values of a run's log (one a line) or of a JSON file (a record, a list of
    them), reading at most its last `LOG_TAIL_BYTES`: a regular file only (a FIFO is refused,
    never waited on), strictly (`_strict_json`: a key twice refused; a line that is no JSON
    at all, such as a line cut by a crash, is passed over); CalibrateError naming the file
    otherwise."""
    from workbench.inputs import InputFileError, open_regular

    try:
        with open_regular(path, what="calibrate") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - LOG_TAIL_BYTES))
            data = f.read(LOG_TAIL_BYTES)
    except InputFileError as exc:
        raise CalibrateError(str(path), exc.reason, is_file=True) from None
    text = data.split(b"\0", 1)[0].decode("utf-8", errors="replace")
    whole = size <= LOG_TAIL_BYTES
    if whole:
        value = _strict_json(text, path, "")
        if value is not _NOT_JSON:
            return value if isinstance(value, list) else [value]
    lines = text.splitlines()
    if not whole and lines:
        lines = lines[1:]  # the first line read is cut
    out: list[Any] = []
    for number, line in enumerate(lines, 1):
        value = _strict_json(line, path, f"line {number}: " if whole else "")
        if value is not _NOT_JSON:
            out.append(value)
    return out


#: what `_strict_json` returns for text that is no JSON at all
_NOT_JSON = object()


def _strict_json(text: str, path: Path, where: str) -> Any:
    """The JSON value of `text`, read as `workbench.inputs.parse_json` reads a settings file
    but for one thing: a number that is not finite (NaN, Infinity, 1e400) is kept as a
    `_NonFinite` holding its text, refused (`_checked`) only in the entries calibration reads,
    since a Session's own log writes a diverged loss as NaN. `_NOT_JSON` when it is no JSON
    at all; CalibrateError naming the file (and `where` in it) for a key given twice in one
    object or an integer too long to read."""
    try:
        return json.loads(
            text,
            object_pairs_hook=no_duplicate_keys,
            parse_float=_finite_or_text,
            parse_constant=_NonFinite,
        )
    except DuplicateKey as dup:
        problem = f"key {shown(dup.key)} appears twice in one object (which one is meant?)"
    except (json.JSONDecodeError, RecursionError):
        return _NOT_JSON
    except ValueError:  # Python reads no integer of more than 4,300 digits
        problem = "not valid JSON (an integer of more than 4,300 digits)"
    raise CalibrateError(str(path), where + problem, is_file=True, hint=False)


class _NonFinite:
    """A JSON number that is not finite (NaN, Infinity, 1e400), shown as written."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _finite_or_text(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _as_dict(record: Any) -> dict[str, Any]:
    if isinstance(record, dict):
        return record
    if hasattr(record, "to_dict"):
        return dict(record.to_dict())
    return {k: getattr(record, k, None) for k in _KEYS}


_KEYS = (
    "tokens_per_s",
    "step_seconds",
    "world_size",
    "activation_checkpointing",
    "precision",
    "warmup",
    "skipped",
)


def _checked(record: dict[str, Any], name: str, is_file: bool) -> None:
    """CalibrateError naming the first entry of `record` calibration cannot read: a token
    rate that is no number, a world size that is no integer >= 1, a recomputation or a
    precision the Session does not train with, a warm-up or skipped flag that is not true
    or false, a step time that is no finite number >= 0. A missing entry (or null) is its
    default."""
    from workbench.choices import Precision
    from workbench.estimate.flops import RECOMPUTE

    def bad(key: str, allowed: str) -> CalibrateError:
        return CalibrateError(
            name, key=key, value=record[key], allowed=allowed, is_file=is_file, hint=False
        )

    rate = record.get("tokens_per_s")
    if rate is not None and (is_bool(rate) or not isinstance(rate, (int, float))):
        raise bad("tokens_per_s", "a finite number of tokens a second")
    size = record.get("world_size")
    if size is not None and (not is_int(size) or size < 1):
        raise bad("world_size", "an integer >= 1")
    for key, allowed in (
        ("activation_checkpointing", RECOMPUTE),
        ("precision", tuple(p.value for p in Precision)),
    ):
        value = record.get(key)
        if value is not None and (not isinstance(value, str) or value not in allowed):
            raise bad(key, f"one of {', '.join(allowed)}")
    for key in ("warmup", "skipped"):
        if record.get(key) is not None and not is_bool(record[key]):
            raise bad(key, "true or false")
    seconds = record.get("step_seconds")
    if seconds is not None and (
        is_bool(seconds)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise bad("step_seconds", "a finite number of seconds >= 0")


def measured_step(calibrate: Any) -> MeasuredStep:
    """The measured step of `calibrate` (see `WHERE`): the steps after warm-up with a token
    rate, of the last world size and settings seen, their tokens over their seconds
    (`tokens_per_s`). CalibrateError (a ValueError) saying where a measured step comes from
    when it holds none, and naming the entry of a step record it cannot read (`_checked`)."""
    records, name = _record_dicts(calibrate)
    is_file = isinstance(calibrate, (str, Path))
    for r in records:
        if r.get("tokens_per_s") is not None:
            _checked(r, name, is_file)
    usable = [
        r
        for r in records
        if isinstance(r.get("tokens_per_s"), (int, float))
        and math.isfinite(r["tokens_per_s"])
        and r["tokens_per_s"] > 0
        and not r.get("skipped")
    ]
    steady = [r for r in usable if not r.get("warmup")] or usable
    if not steady:
        what = "no step with a token rate (tokens_per_s)" if records else "no step record"
        raise CalibrateError(name, f"{what} in it", is_file=is_file)
    last = steady[-1]
    key = ("world_size", "activation_checkpointing", "precision")
    same = [r for r in steady if all(r.get(k) == last.get(k) for k in key)]
    return MeasuredStep(
        tokens_per_s=_tokens_per_s(same),
        world_size=int(last.get("world_size") or 1),
        recompute=str(last.get("activation_checkpointing") or "none"),
        precision=str(last.get("precision") or "fp32"),
        steps=len(same),
        source=name,
        is_file=is_file,
    )


def _tokens_per_s(steps: list[dict[str, Any]]) -> float:
    """The token rate of `steps` (each with a token rate > 0): all their tokens over all
    their seconds (`workbench.rates.throughput`), never the median of each step's rate,
    which under a loader that delivers in bursts is one of the fast steps' rates. Records
    that do not all give their step time (a hand-written `{"tokens_per_s": ...}`) count as
    steps of the same tokens, as steps of one setting are: n over the sum of 1 / rate, the
    same ratio of sums."""
    from workbench.rates import throughput

    if all(r.get("step_seconds") is not None for r in steps):
        rate = throughput(
            {"step_seconds": r["step_seconds"], "tokens_per_s": r["tokens_per_s"]} for r in steps
        ).tokens_per_s
        if rate:
            return rate
    return float(len(steps) / sum(1.0 / r["tokens_per_s"] for r in steps))


def measured_efficiency(step: MeasuredStep, count: FlopCount, peak_flops: float) -> Efficiency:
    """The rate `step`'s GPUs ran the planned model's hardware FLOPs at: its tokens a second
    x the hardware FLOPs a token (`count`, with the step's recomputation) over its GPUs x
    `peak_flops`; ValueError when it is not a share of the peak (a step of another model,
    or the peak of another GPU)."""
    hardware = count.hardware_per_token(step.recompute)
    value = hardware * step.tokens_per_s / (step.world_size * peak_flops)
    mfu = count.model_per_token() * step.tokens_per_s / (step.world_size * peak_flops)
    if not 1e-3 <= value <= 1.0:
        raise CalibrateError(
            step.source,
            f"{step.tokens_per_s:,.0f} tokens/s on {step.world_size} GPU(s) is {value:.3g} of "
            "the peak for this model (must be from 0.001 to 1): was the step the planned "
            "model's, at its sequence, on this GPU?",
            is_file=step.is_file,
            hint=False,
        )
    return Efficiency(
        value,
        f"efficiency {value:.2f} measured from your step ({step.source}: "
        f"{step.tokens_per_s:,.0f} tokens/s, the tokens of {step.steps} step(s) after "
        f"warm-up over their seconds, on {step.world_size} GPU(s), {step.recompute} "
        f"recomputation: MFU {mfu:.2f}, HFU {value:.2f})",
    )


def resolve(
    given: float | None,
    rate: float,
    name: str,
    calibrate: Any,
    count: FlopCount,
    hw: Any,
    precision: str | None = None,
) -> Efficiency:
    """The efficiency the ranking uses (`workbench.planner.efficiency`): given, measured
    from `calibrate`, or the published default of the GPU. A measured step carries to the
    plans only on the same kind of peak: an fp32 step to plans pinned to fp32 (`precision`),
    a 16-bit one to the 16-bit plans (CalibrateError else)."""
    if given is not None:
        flag = "--mfu" if name == "mfu" else "--efficiency"
        return Efficiency(rate, f"efficiency {rate:.2f}: given ({name}=, {flag})")
    if calibrate is not None:
        step = measured_step(calibrate)
        planned_fp32 = precision == "fp32"
        if (step.precision == "fp32") != planned_fp32:
            want = "an fp32 step" if planned_fp32 else "a bf16 or fp16 step"
            plans = "fp32 (pinned)" if planned_fp32 else "16-bit precisions"
            raise CalibrateError(
                step.source,
                f"the step ran {step.precision} and the plans run {plans}: the share of one "
                "peak a step reaches does not carry to the other (fp32 and 16-bit matmuls run "
                f"on different units); calibrate with {want}, or pin precision="
                f"{step.precision} (--precision)",
                is_file=step.is_file,
                hint=False,
            )
        sixteen = step.precision != "fp32"
        peak = hw.gpu.peak_flops(sixteen, bf16="bf16" in step.precision)
        return measured_efficiency(step, count, peak or hw.gpu.peak_fp32_flops)
    return default_efficiency(hw.gpu.name)


__all__ = [
    "FALLBACK",
    "PUBLISHED",
    "WHERE",
    "WHERE_CLI",
    "CalibrateError",
    "Efficiency",
    "MeasuredStep",
    "Published",
    "default_efficiency",
    "measured_efficiency",
    "measured_step",
    "resolve",
]
