"""What `export_job` refuses, checked before anything is written: every argument of an
export (format, GPUs and nodes, hostfile, model and its options, steps, folder) for the three
formats at once, each problem a `SettingProblem` naming the field, the value and what is
allowed (`check_export`: all of them; `export_job` raises them as one `ExportError`). The
built-in model's options are checked and its size measured on the meta device before
anything is allocated (a factory's, `"pkg.module:function"`, by `refusals`)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.config import (
    Documents,
    Engine,
    FsdpMode,
    OptimizerName,
    SettingProblem,
    TrainConfig,
    plain_value,
    problem_lines,
)
from workbench.deepspeed import to_deepspeed
from workbench.engines import ENGINES, engine_for, tp_problems
from workbench.export.problems import ExportProblem
from workbench.export.refusals import (
    factory_option_problems,
    factory_problems,
    format_problems,
    model_parallel_problems,
    model_problems,
    stale_format,
)
from workbench.inputs import InputFileError, is_int, plain_number, read_text, shown

#: The job's distributed strategy for the engine a config needs (`engine_for`), from the
#: engines' rows: data parallel replicas (DDP) when the config asks for neither DeepSpeed nor
#: FSDP; the model-parallel engines' are refused by the checks below where a format does
#: not carry them.
STRATEGY: dict[Engine, str] = {engine: row.export_strategy for engine, row in ENGINES.items()}

FORMATS = ("deepspeed", "fsdp", "lightning")

_FACTORY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_HOST_LINE = re.compile(r"^(\S+)\s+slots=(\d+)\s*$")

#: Upper bounds of the job's numbers: (bound, why a larger value is nonsense).
MAX_GPUS = (1024, "more ranks than one node runs")
MAX_NODES = (65536, "more nodes than any cluster has")
MAX_STEPS = (10**12, "longer than any training run")
#: the seed each format's script can take: torch's 64-bit generator; Lightning's
#: `seed_everything` (NumPy's) 32 bits
MAX_SEED = {
    "deepspeed": (2**64 - 1, "torch.manual_seed takes a 64-bit seed"),
    "fsdp": (2**64 - 1, "torch.manual_seed takes a 64-bit seed"),
    "lightning": (2**32 - 1, "Lightning's seed_everything takes a 32-bit seed"),
}
#: The job builds the model and its data whole in host memory on every rank; the export
#: measures them on the meta device (nothing allocated) for its estimate, and refuses
#: more than this (the built-in models' own bounds, `workbench.models.option_problems`,
#: come first and are tighter).
MAX_MODEL_BYTES = 64 * 2**30
#: The largest text a built-in tiny-gpt trains on (read at export to count its vocabulary).
MAX_TEXT_BYTES = 16 * 2**20


@dataclass
class Checked:
    """What `check_export` found: every problem, and what the export writes from."""

    problems: list[SettingProblem] = field(default_factory=list)
    out: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)
    host_path: Path | None = None
    host_text: str = ""  # the given hostfile's text, copied into the job
    ds: dict[str, Any] = field(default_factory=dict)
    info: Any | None = None  # the built-in model's ModelInfo (measured on the meta device)
    module: Any | None = None  # the built-in model, on the meta device


def check_export(
    config: TrainConfig | None,
    *,
    format: str = "deepspeed",
    gpus: Any,
    out_dir: Any,
    model: Any = "tiny-gpt",
    nodes: Any = 1,
    hostfile: Any = None,
    model_options: Any = None,
    steps: Any = None,
) -> list[SettingProblem]:
    """Every problem `export_job` would refuse these arguments for, as `SettingProblem`s
    (`str()` of each: its line; empty when it would write the job); nothing is written. `config` None: the settings are
    being reported elsewhere (the CLI's flags), so only the other arguments are checked."""
    return checked_export(
        config,
        format=format,
        gpus=plain_number(gpus),
        out_dir=out_dir,
        model=model,
        nodes=plain_number(nodes),
        hostfile=hostfile,
        model_options=model_options,
        steps=plain_number(steps),
    ).problems


def _bounded_int(
    name: str,
    value: Any,
    bound: tuple[int, str],
    problems: list[SettingProblem],
    *,
    minimum: int = 1,
) -> bool:
    """Whether `value` is an integer in [minimum, bound]; else a problem naming it."""
    top, why = bound
    if not is_int(value) or not minimum <= value <= top:
        problems.append(SettingProblem(name, value, _integer(minimum, top, why)))
        return False
    return True


def checked_export(
    config: TrainConfig | None,
    *,
    format: Any,
    gpus: Any,
    out_dir: Any,
    model: Any,
    nodes: Any,
    hostfile: Any,
    model_options: Any,
    steps: Any,
) -> Checked:
    """Every problem of an export's arguments (`config` None: the settings are reported
    elsewhere), and what `export_job` writes from: the model options to bake in, the
    hostfile, the DeepSpeed config, the built-in model measured on the meta device."""
    c = Checked()
    problems = c.problems
    if format not in FORMATS:
        problems.append(SettingProblem("format", format, f"must be one of {', '.join(FORMATS)}"))
    gpus_ok = _bounded_int("gpus", gpus, MAX_GPUS, problems)
    nodes_ok = _bounded_int("nodes", nodes, MAX_NODES, problems)
    if steps is not None and not is_int(steps) or is_int(steps) and not 1 <= steps <= MAX_STEPS[0]:
        message = _integer(1, *MAX_STEPS)
        problems.append(ExportProblem("steps", steps, message, unset="total_steps"))
    before = len(problems)
    c.options = _check_model(model, model_options, problems, out_dir)
    if config is not None:
        c.options = _with_documents(config, model, c.options, problems)
    if isinstance(model, str) and ":" not in model and len(problems) == before:
        measured = _measure(model, c.options, 0, problems)  # the seed changes no size
        if measured is not None:
            c.info, c.module = measured
    if hostfile is not None and format in FORMATS and format != "deepspeed":
        why = (
            f"is for DeepSpeed's launcher; the --format {format} job starts under torchrun on "
            "each node (its launch.sh says how): leave it out"
        )
        problems.append(ExportProblem("hostfile", hostfile, why, value_text=shown(str(hostfile))))
    else:
        c.host_path, c.host_text = _check_hostfile(hostfile, nodes, gpus, problems)
    c.out = _check_out_dir(out_dir, problems)
    stale = stale_format(c.out, format) if c.out is not None and format in FORMATS else None
    if stale is not None:
        problems.append(out_dir_problem(out_dir, stale))
    if config is None:
        return c
    if steps is None:
        _bounded_int("total_steps", int(config.total_steps), MAX_STEPS, problems)
    if format in MAX_SEED:
        _bounded_int("seed", int(config.seed), MAX_SEED[format], problems, minimum=0)
    engine = engine_for(config)  # the engine the config itself needs, on any cluster
    refused = ENGINES[engine].fsdp_export_refusal
    if format == "fsdp" and refused == "fsdp" and FsdpMode(config.fsdp) is FsdpMode.OFF:
        message = "--format fsdp needs an FSDP mode (full_shard, shard_grad_op, no_shard)"
        if engine is Engine.TENSOR_PARALLEL:  # what a plan of DDP x TP asks for
            message = (
                "no exported job carries plain data parallel (DDP) over tensor-parallel "
                "ranks: the FSDP job shards its data-parallel ranks with FSDP2; use "
                "full_shard or shard_grad_op with `tp` > 1"
            )
        problems.append(SettingProblem("fsdp", FsdpMode(config.fsdp).value, message))
    if format == "fsdp" and refused == "zero_stage":
        message = "--format fsdp exports PyTorch FSDP jobs"
        problems.append(SettingProblem("zero_stage", config.zero_stage, message))
    row = OptimizerName(config.optimizer).row
    for name, value, why in (
        (
            "optimizer_in_backward",
            bool(config.optimizer_in_backward),
            "the exported jobs step one optimizer after backward; a Session trains it",
        ),
        (
            "qlora",
            bool(config.qlora),
            "the exported jobs put LoRA's adapters on a base in its own dtype; QLoRA's 4-bit "
            "base (bitsandbytes) is not sharded by their engines here; a Session trains it",
        ),
        (  # what each optimizer's row says the jobs do not train
            "optimizer",
            bool(row.export_tp_reason) and format != "deepspeed" and config.tp > 1,
            row.export_tp_reason or "",
        ),
        ("optimizer", bool(row.export_reason), row.export_reason or ""),
    ):
        if value:
            problems.append(SettingProblem(name, plain_value(getattr(config, name)), why))
    problems += model_parallel_problems(format, config.tp, config.pp)
    if format in ("fsdp", "lightning") and int(config.tp) > 1 and gpus_ok and nodes_ok:
        problems += tp_problems(config, gpus * nodes)  # fsdp no_shard among them
        off = FsdpMode(config.fsdp) is FsdpMode.OFF
        if format == "lightning" and off and gpus * nodes > int(config.tp):
            problems.append(
                SettingProblem(
                    "fsdp",
                    "off",
                    "the Lightning job's ModelParallelStrategy runs its data-parallel ranks "
                    "through FSDP2, not plain data parallel: use full_shard or shard_grad_op "
                    f"with `tp` > 1 on more than `tp`={config.tp} GPUs",
                )
            )
    strategy = STRATEGY[engine]
    if format in FORMATS:
        problems += format_problems(config, format, strategy)
    if c.module is not None:
        problems += model_problems(config, c.module)
    if (
        gpus_ok
        and nodes_ok
        and format in FORMATS
        and (format == "deepspeed" or strategy == "deepspeed")
    ):
        try:
            c.ds = to_deepspeed(config, world_size=gpus * nodes)
        except ValueError as exc:
            problems += _config_problems(exc, config)
    return c


def _integer(minimum: int, top: int, why: str) -> str:
    return f"must be an integer >= {minimum}, at most {top:,} ({why})"


def _config_problems(exc: ValueError, config: TrainConfig) -> list[SettingProblem]:
    """What the DeepSpeed mapping refused `config` for, as the SettingProblems its error
    carries (`ConfigError.problems`); an error without them (a bug, not a setting) as one
    problem of the config as a whole, its text shown as it is."""
    carried = getattr(exc, "problems", None)
    if isinstance(carried, (list, tuple)) and carried:
        found = [p for p in carried if isinstance(p, SettingProblem)]
        if len(found) == len(carried):
            return found
    return [ExportProblem("config", config, str(exc), value_text="")]


def one_line(exc: BaseException) -> str:
    """A multi-problem ValueError as one line."""
    return "; ".join(problem_lines(exc))


def _check_model(
    model: Any, options: Any, problems: list[SettingProblem], out_dir: Any = None
) -> dict[str, Any]:
    """The model options to bake into the script, checked as far as possible here: for a
    built-in model against its documented options and bounds, before anything is built."""
    if options is None:
        options = {}
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        message = "must be a dict of option name -> value"
        problems.append(SettingProblem("model_options", options, message))
        return {}
    options = {k: plain_number(v) for k, v in options.items()}  # NumPy / torch: Python's
    for k, v in options.items():
        if not (v is None or isinstance(v, (bool, int, float, str))):
            message = "must be a number, string, bool or None"
            problems.append(_option_problem(k, v, message))
        elif isinstance(v, float) and not math.isfinite(v):
            problems.append(_option_problem(k, v, "must be a finite number"))
    if not isinstance(model, str):
        message = "must be a built-in model name or a factory 'pkg.module:function'"
        problems.append(SettingProblem("model", model, message))
        return dict(options)
    if ":" in model:
        if not _FACTORY.match(model):
            message = (
                "a factory must be written 'pkg.module:function' (dotted module path, a colon, "
                "a function name)"
            )
            problems.append(SettingProblem("model", model, message))
        else:
            unfound = factory_problems(model, out_dir)
            problems += unfound or factory_option_problems(model, options, out_dir)
        return dict(options)
    from workbench.models import MODEL_NAMES, model_options

    if model not in MODEL_NAMES:
        message = f"must be one of {', '.join(MODEL_NAMES)} or a factory 'pkg.module:function'"
        problems.append(SettingProblem("model", model, message))
        return dict(options)
    defaults = model_options(model)
    if "seed" in options:
        message = "the model is seeded from the config's seed; set `seed` there"
        problems.append(
            ExportProblem("model_options", options["seed"], message, option="seed", value_text="")
        )
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        allowed = ", ".join(k for k in defaults if k != "seed")
        problems.append(
            ExportProblem(
                "model_options",
                {k: options[k] for k in unknown},
                f"unknown for {shown(model)}; allowed: {allowed}",
                options=tuple(unknown),
                value_text="",
            )
        )
    text_refused = False
    if "text" in options and options["text"] is not None:
        text_refused = not _check_text(options["text"], problems)
    if "text" in options and options["text"] is not None and not text_refused:
        # the job runs in its own folder (launch.sh changes into it): the path as it is here
        options = {**options, "text": str(Path(options["text"]).expanduser().resolve())}
    from workbench.models import option_problems

    known = {k: v for k, v in options.items() if k in defaults and k != "seed"}
    if text_refused:  # said once, by the reader's own reason
        known.pop("text", None)
    for found in option_problems(model, known):  # each carries its option and value
        if found.option in defaults:
            problems.append(_option_problem(found.option, found.value, found.message))
        else:  # a size past what a built-in model is for
            problems.append(
                ExportProblem(
                    "model_options",
                    dict(known),
                    f"{shown(model)} has {found.message}",
                    options=tuple(known),
                    value_text=None if known else "",
                )
            )
    return dict(options)


def _with_documents(
    config: TrainConfig, model: Any, options: dict[str, Any], problems: list[SettingProblem]
) -> dict[str, Any]:
    """The model options with `config.documents` as tiny-gpt's `documents` option (every
    format's script trains the document batches through `model(**batch)` and the
    built-in's `loss_fn(outputs, batch)`); a problem naming `documents` for any other
    model (`workbench.models.spec.documents_problem`)."""
    from workbench.models.spec import documents_problem

    documents = Documents(config.documents).value
    problem = documents_problem(documents, model, None, None, options)
    given = options.get("documents")
    if problem is not None and given is not None and model == "tiny-gpt" and given != documents:
        message = (  # the option as the user gave it, not the setting they left alone
            "the layout is the `documents` setting, not a model option: drop the option "
            f"and set `documents` to {shown(given)}"
        )
        problem = _option_problem("documents", given, message)
    if problem is not None:
        problems.append(problem)
        return options
    return {**options, "documents": documents} if documents != "stream" else options


def _option_problem(option: str, value: Any, message: str) -> ExportProblem:
    """A problem with the model option `option` (given as `value`)."""
    return ExportProblem("model_options", value, message, option=option)


def _check_text(value: Any, problems: list[SettingProblem]) -> bool:
    """Whether a tiny-gpt `text` option is a UTF-8 file of at most MAX_TEXT_BYTES (read
    through `workbench.inputs`: no FIFO, device or directory); else a problem."""
    if not isinstance(value, str) or not value.strip():
        message = "must be the path of a UTF-8 text file or None"
        problems.append(_option_problem("text", value, message))
        return False
    try:
        read_text(value, what="text", max_bytes=MAX_TEXT_BYTES)
    except InputFileError as exc:
        problems.append(_option_problem("text", value, exc.reason))
        return False
    return True


def _measure(model: str, options: dict[str, Any], seed: int, problems: list[SettingProblem]) -> Any:
    """(the built-in model's ModelInfo, the module), built on the meta device (no memory allocated, any
    size); a problem line when it cannot be built or it and its data would take more than
    MAX_MODEL_BYTES in the job."""
    import torch

    from workbench.models import build_model

    try:
        with torch.device("meta"):
            module, dataset, _loss, info = build_model(model, seed=seed, **options)
    except (ValueError, RuntimeError, TypeError, OverflowError, MemoryError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        message = f"cannot build {shown(model)} with {shown(options)}: {text}"
        problems.append(ExportProblem("model_options", options, message, value_text=""))
        return None
    tensors = [*module.parameters(), *module.buffers()]
    tensors += [v for v in vars(dataset).values() if isinstance(v, torch.Tensor)]
    total = sum(t.numel() * t.element_size() for t in tensors)
    if total > MAX_MODEL_BYTES:
        given = ", ".join(f"{k}={v}" for k, v in options.items()) or "its defaults"
        message = (
            f"{shown(model)} with {given} has {info.n_params:,} parameters; with its "
            f"data {total / 2**30:,.1f} GiB in fp32: more than the "
            f"{MAX_MODEL_BYTES // 2**30} GiB limit (the job builds the model and its data whole "
            "in host memory on every rank)"
        )
        problems.append(ExportProblem("model_options", options, message, value_text=""))
        return None
    return info, module


#: The most bytes and host lines a hostfile may have.
MAX_HOSTFILE_BYTES = 1 << 20


def _check_hostfile(
    hostfile: Any, nodes: Any, gpus: Any, problems: list[SettingProblem]
) -> tuple[Path | None, str]:
    """The hostfile's path and text (to copy into the job), or None and its problems."""
    if hostfile is None:
        return None, ""
    if not isinstance(hostfile, (str, os.PathLike)) or not os.fspath(hostfile):
        message = "must be a path to a DeepSpeed hostfile"
        problems.append(SettingProblem("hostfile", hostfile, message))
        return None, ""
    given = os.fspath(hostfile)

    def problem(message: str) -> None:
        name = shown(given, limit=200)
        problems.append(ExportProblem("hostfile", given, message, value_text=name))

    try:
        path = Path(hostfile).expanduser().resolve()
        text = read_text(path, what="hostfile", max_bytes=MAX_HOSTFILE_BYTES)
    except InputFileError as exc:
        problem(f"cannot be read: {exc.reason}")
        return None, ""
    except (OSError, ValueError, RuntimeError) as exc:  # a NUL byte, a name too long, a loop
        problem(f"cannot be read ({exc})")
        return None, ""
    hosts = []
    lines: dict[str, list[int]] = {}  # each host's line numbers
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _HOST_LINE.match(line)
        if m is None or len(m.group(2)) > 6:
            problem(
                f"line {number} {shown(raw.strip())}: must be 'HOSTNAME slots=N' "
                f"(N at most {MAX_GPUS[0]})"
            )
            return None, ""
        hosts.append((m.group(1), int(m.group(2))))
        lines.setdefault(m.group(1), []).append(number)
    twice = [(host, numbers) for host, numbers in lines.items() if len(numbers) > 1]
    if twice:
        said = "; ".join(f"{shown(host)} on lines {_numbers(found)}" for host, found in twice[:3])
        more = f" and {len(twice) - 3} more host(s)" if len(twice) > 3 else ""
        problem(f"names a host more than once ({said}{more}): list each host on one line")
        return None, ""
    if is_int(nodes) and len(hosts) < nodes:
        problem(f"lists {len(hosts)} host(s); --nodes {nodes} needs at least {nodes}")
    if is_int(gpus):
        short = [h for h, slots in hosts[: nodes if is_int(nodes) else None] if slots < gpus]
        if short:
            problem(
                f"{shown(', '.join(short))[1:-1]} have fewer than {gpus} slots "
                f"(`gpus`={gpus} per node)"
            )
    return path, text


def _numbers(numbers: list[int], limit: int = 5) -> str:
    """Line numbers as `2, 4` (the first `limit`, then how many more)."""
    text = ", ".join(map(str, numbers[:limit]))
    return text + (f" and {len(numbers) - limit} more" if len(numbers) > limit else "")


def _check_out_dir(out_dir: Any, problems: list[SettingProblem]) -> Path | None:
    if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir).strip():
        problems.append(SettingProblem("out_dir", out_dir, "must be a directory path"))
        return None
    given = os.fspath(out_dir) if isinstance(out_dir, os.PathLike) else out_dir

    def problem(message: str) -> None:
        problems.append(out_dir_problem(given, message))

    try:
        out = Path(out_dir).expanduser().resolve()
        if out.exists() and not out.is_dir():
            problem("exists and is not a directory")
            return None
        existing = out if out.exists() else next(p for p in out.parents if p.exists())
        if not existing.is_dir():
            problem(f"{existing} is not a directory")
        elif not os.access(existing, os.W_OK | os.X_OK):
            problem(f"{existing} is not writable")
    except (OSError, ValueError, RuntimeError) as exc:  # a NUL byte, a name too long, a loop
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        problem(f"not a usable directory path ({reason})")
        return None
    return out


def out_dir_problem(given: Any, message: str) -> ExportProblem:
    """A problem with the folder `out_dir` names (its path shown up to 200 characters)."""
    return ExportProblem("out_dir", given, message, value_text=shown(given, limit=200))
