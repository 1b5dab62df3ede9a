"""The checks of a launch's arguments, before anything starts: every problem at once,
each naming its argument, this machine's limits (cores, GPUs) included; and the
checkpoints a launch resumes (the newest step every rank has, the model that saved it).

Every problem is a `SettingProblem` (the argument, the value, the message; other arguments
named between backticks), all of them raised together in one `LaunchError`; the command line
writes them with its flags from that data. The number checks (`integer_problem`,
`seconds_problem`, `options_problem`) accept NumPy scalars and refuse bools; the ladder
checks its own arguments with them.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench.config import Device, Precision, TrainConfig, runtime_problems
from workbench.engines import engine_problems
from workbench.inputs import InputFileError, is_bool, is_int, read_json, shown
from workbench.problems import SettingProblem, listing
from workbench.train.launch.commands import LAUNCHERS

#: Local ranks one launch starts (per node): more processes than one machine runs.
MAX_RANKS = 1024
#: The step a launch trains to: TrainConfig's own horizon limit (longer than any run).
MAX_STEPS = 10**12
#: torch threads per rank: more than any machine has cores.
MAX_THREADS = 1024
#: A launch's timeout in seconds (30 days); leave it None for no limit.
MAX_TIMEOUT = 30 * 24 * 3600.0


class LaunchError(ValueError):
    """A launch that cannot start: `.problems` holds every problem of its arguments as a
    `SettingProblem` (the argument, the value, what is allowed), and the text is made from
    them."""

    def __init__(self, problems: Sequence[SettingProblem]) -> None:
        self.problems = list(problems)
        lines = [str(p) for p in self.problems]
        super().__init__(listing(lines, "invalid launch", "problems in the launch"))


def integer_problem(
    name: str, value: Any, minimum: int, maximum: int, why: str, *, meaning: str = ""
) -> SettingProblem | None:
    """The problem of `value` when it is no integer in [minimum, maximum] (a NumPy
    integer counts, and is kept as the Python int it holds), else None. `why`: why a
    larger one is nonsense; `meaning`: what the value is, said when it is no integer."""
    extra = f" ({meaning})" if meaning else ""
    if not is_int(value):
        return SettingProblem(name, value, f"must be an integer >= {minimum}{extra}")
    if value < minimum:
        return SettingProblem(name, int(value), f"must be an integer >= {minimum}{extra}")
    if value > maximum:
        return SettingProblem(name, int(value), f"must be at most {maximum:,} ({why})")
    return None


def seconds_problem(name: str, value: Any, maximum: float = MAX_TIMEOUT) -> SettingProblem | None:
    """The problem of a timeout that is not None and not a finite number of seconds in
    (0, maximum], else None."""
    if value is None:
        return None
    ok = isinstance(value, numbers.Real) and not is_bool(value)
    try:
        finite = ok and math.isfinite(value) and value > 0
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        return SettingProblem(
            name, value, "must be a finite number of seconds > 0, or None (no limit)"
        )
    if value > maximum:
        return SettingProblem(
            name,
            value,
            f"must be at most {maximum:,.0f} seconds (30 days); leave it out (None) for no limit",
        )
    return None


def options_problem(name: str, options: Any) -> SettingProblem | None:
    """The problem of model options that are not None and not a mapping of option names
    to JSON values (the ranks get them as JSON: finite numbers, no objects), else None."""
    if options is None:
        return None
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        return SettingProblem(name, options, "must be a dict of option names (strings) and values")
    try:
        json.dumps(options, allow_nan=False, default=json_number)
    except (TypeError, ValueError) as exc:
        return SettingProblem(name, options, f"must hold JSON values only (finite numbers): {exc}")
    return None


def json_number(value: Any) -> Any:
    """A NumPy scalar as the Python number it holds (`json.dumps(..., default=json_number)`)."""
    if is_int(value):
        return int(value)
    if isinstance(value, numbers.Real) and not is_bool(value):
        return float(value)
    raise TypeError(f"{shown(value)} is not JSON data")


def uses_cuda(config: TrainConfig) -> bool:
    """Whether the ranks of `config` train on GPUs (device "cuda", or "auto" with one)."""
    device = Device(config.device)
    if device is Device.CPU:
        return False
    import torch

    return device is Device.CUDA or torch.cuda.is_available()


def _check_model(model: Any) -> list[SettingProblem]:
    from workbench.models.spec import spec_problems

    return spec_problems(model)


def model_problems(
    config: TrainConfig, ranks: int, model: Any, options: dict[str, Any] | None
) -> list[SettingProblem]:
    """What every rank would refuse of a built-in model, found here before any process
    starts: its options (`workbench.models.option_problems`: unknown ones, ranges, tiny-gpt's
    text and size), and what a rank's Session checks of the model it builds
    (`workbench.train.changes.session_problems`: `tp` and `pp` against its heads and layers,
    recomputation, LoRA, the attention kernel), on the meta device (nothing allocated). A
    factory 'pkg.module:function' is the user's code: the ranks call it, not this check."""
    import torch

    from workbench.models import MODEL_NAMES, build_model, option_problems
    from workbench.models.spec import builtin_options, documents_problem
    from workbench.train.changes import session_problems

    if not isinstance(model, str) or model not in MODEL_NAMES:
        return []
    documents = str(config.documents)
    wrong = documents_problem(documents, model, None, None, options)
    if wrong is not None:
        return [wrong]
    opts = builtin_options(options, seed=int(config.seed), documents=documents)
    given = options or {}
    found = option_problems(model, opts)
    if found:
        return [SettingProblem("model_options", given, str(p)) for p in found]
    try:
        with torch.device("meta"):
            module, dataset, _loss, _info = build_model(model, **opts)
    except (ValueError, RuntimeError, TypeError, OverflowError, MemoryError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        return [
            SettingProblem("model_options", given, f"model {shown(model)} cannot be built: {text}")
        ]
    device = torch.device("cuda" if uses_cuda(config) else "cpu")
    return session_problems(
        config, set(), model=module, device=device, world_size=ranks, data=dataset
    )


def ranks_problem(config: TrainConfig, ranks: Any) -> SettingProblem | None:
    """The problem when `ranks` local processes do not fit this machine (cores or GPUs)."""
    bad = integer_problem("ranks", ranks, 1, MAX_RANKS, "more local ranks than one machine runs")
    if bad:
        return bad
    ranks = int(ranks)
    if uses_cuda(config):
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if ranks > gpus:
            return SettingProblem(
                "ranks",
                ranks,
                f"this machine has {gpus} CUDA GPU(s); use at most {gpus} ranks (one per "
                "GPU), or `device`='cpu'",
            )
    else:
        cores = os.cpu_count() or 1
        if ranks > cores:
            return SettingProblem(
                "ranks",
                ranks,
                f"this machine has {cores} CPU core(s); use at most {cores} ranks on CPU "
                "(multi-node runs: see --print-command)",
            )
    return None


def check_ranks(config: TrainConfig, ranks: Any) -> None:
    """LaunchError unless `ranks` local processes fit this machine (cores or GPUs)."""
    bad = ranks_problem(config, ranks)
    if bad:
        raise LaunchError([bad])


def checkpoint_dir_problems(
    checkpoint_dir: str | os.PathLike[str],
    ranks: int,
    resume: str | os.PathLike[str] | None,
    resume_at: int | None,
) -> list[SettingProblem]:
    """Why the ranks must not save into `checkpoint_dir`'s `rank-<r>` folders (empty when
    they may), found before any process starts and as each rank's Session would find it
    (`checkpoints.run_folder_problem`): another run's checkpoints or log there; or, when
    `checkpoint_dir` is the folder resumed from, a rank's checkpoints newer than the step
    every rank resumes from (`resume_at`), which its saves would overwrite."""
    from workbench.train import checkpoints as ckpt

    problems = []
    root = Path(checkpoint_dir)
    for r in range(ranks):
        folder = root / f"rank-{r}"
        run, home, step = "", False, 0
        if resume is not None and resume_at is not None:
            step = resume_at
            home = os.path.realpath(folder) == os.path.realpath(Path(resume) / f"rank-{r}")
            if home:
                found = ckpt.manifest_run(
                    ckpt.manifest_path(folder / ckpt.checkpoint_name(resume_at))
                )
                run = found if isinstance(found, str) and found != ckpt.UNREADABLE else ""
        problem = ckpt.run_folder_problem(
            folder,
            run,
            step,
            own_unlabeled=home,
            log=folder / "log.jsonl",
            log_is_own=home,
        )
        if problem is not None:
            problems.append(
                SettingProblem("checkpoint_dir", str(checkpoint_dir), f"rank-{r}/ {problem}")
            )
            break  # one rank's folder says it; the others are alike
    return problems


def resume_step(resume: str | os.PathLike[str], ranks: int) -> int:
    """The newest step for which every rank 0..ranks-1 has a checkpoint under `resume`
    (each a regular file: a FIFO or device there would block a rank); LaunchError naming
    `resume` otherwise."""
    from workbench.train import checkpoints as ckpt

    def refused(message: str) -> LaunchError:
        return LaunchError([SettingProblem("resume", str(resume), message)])

    try:
        root = Path(resume)
        if not root.is_dir():
            raise refused("not a directory of rank-<r> checkpoints")
        common: set[int] | None = None
        for r in range(ranks):
            files = ckpt.list_checkpoints(root / f"rank-{r}")
            if not files:
                raise refused(
                    f"no checkpoint for rank {r} (rank-{r}/step-N.pt); resume with the rank "
                    "count that saved it"
                )
            steps = {int(p.stem.split("-")[1]) for p in files}
            common = steps if common is None else common & steps
        if not common:
            raise refused("the ranks have no checkpoint step in common")
        step = max(common)
        for r in range(ranks):
            path = root / f"rank-{r}" / ckpt.checkpoint_name(step)
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise refused(f"rank-{r}/{path.name} is not a regular file")
    except OSError as exc:  # a name too long, no permission
        raise refused(f"cannot be read ({exc.strerror or exc})") from None
    return step


def resume_payload_problem(
    resume: str | os.PathLike[str], ranks: int, step: int
) -> SettingProblem | None:
    """The first rank checkpoint of step `step` under `resume` that a rank's Session would
    refuse (`checkpoints.load`: size and SHA-256 against its manifest, the safe loader,
    the payload's layout), found before any process starts; each file is read once here
    and released before the next."""
    from workbench.train import checkpoints as ckpt

    for r in range(ranks):
        path = Path(resume) / f"rank-{r}" / ckpt.checkpoint_name(step)
        try:
            ckpt.load(path)
        except ckpt.CheckpointError as exc:
            return SettingProblem(
                "resume", str(resume), f"rank-{r}/{path.name}: {exc.reason}; nothing was started"
            )
    return None


def resume_model_problem(
    resume: str | os.PathLike[str],
    ranks: int,
    step: int,
    model: str,
    options: dict[str, Any] | None = None,
) -> SettingProblem | None:
    """The problem when the checkpoints a launch resumes were not trained as `model` (with
    `options`: a built-in model's options, each compared with its default filled in; the
    seed, the sample count and the documents layout change no weight and are not compared).

    The ranks always build the model the caller names; the model a checkpoint's manifest
    names is only compared with it, never imported (a factory a file names is code the
    user did not choose). A manifest that cannot be read is left to the ranks' own load,
    which verifies it."""
    from workbench.models.spec import is_factory
    from workbench.train import checkpoints as ckpt

    for r in range(ranks):
        path = Path(resume) / f"rank-{r}" / ckpt.checkpoint_name(step)
        manifest = ckpt.manifest_path(path)
        try:
            data = read_json(manifest, what="manifest", max_bytes=ckpt.MAX_MANIFEST_BYTES)
        except InputFileError:
            continue
        saved = data.get("model") if isinstance(data, dict) else None
        name = saved.get("name") if isinstance(saved, dict) else None
        if name == model and options is not None and isinstance(saved, dict):
            differ = _options_differ(model, saved.get("options"), options)
            if differ:
                then, now = differ
                return SettingProblem(
                    "model_options",
                    options,
                    f"rank-{r}/{path.name} was trained with {shown(then)} and this launch "
                    f"builds {shown(now)}: its weights would not fit the model; resume with "
                    "the model options that saved it",
                )
        if name is None or name == model:
            continue
        if isinstance(name, str) and is_factory(name):
            return SettingProblem(
                "resume",
                str(resume),
                f"rank-{r}/{path.name} names the model factory {shown(name)}, and this "
                f"launch trains `model`={shown(model)}; a checkpoint cannot choose code to "
                "run, so nothing of it was imported; resume with the model that saved it",
            )
        return SettingProblem(
            "resume",
            str(resume),
            f"rank-{r}/{path.name} holds model {shown(name)}, and this launch trains "
            f"`model`={shown(model)}; resume with the model (and `model_options`) that saved it",
        )
    return None


#: a built-in model's options that change no weight: not compared on resume
_DATA_ONLY = frozenset({"seed", "samples", "documents"})


def _options_differ(
    model: str, saved: Any, given: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the saved values, the given ones) of a built-in model's options that differ, each
    with its default filled in; None where they agree or the model is not built in."""
    from workbench.models import model_options

    if not isinstance(saved, dict):
        return None
    try:
        defaults = model_options(model)
    except ValueError:  # a factory: its options are its own
        return None
    then, now = {**defaults, **saved}, {**defaults, **given}
    keys = sorted(k for k in {*then, *now} if k not in _DATA_ONLY and then.get(k) != now.get(k))
    if not keys:
        return None
    return {k: then.get(k) for k in keys}, {k: now.get(k) for k in keys}


def launch_problems(
    config: Any,
    ranks: Any,
    model: Any,
    steps: Any,
    launcher: Any,
    timeout: Any,
    on_record: Any,
    model_options: Any,
    threads: Any = None,
) -> list[SettingProblem]:
    """Every problem of a launch's arguments, each naming its argument (empty when it can
    start); this machine's limits (cores, GPUs, what it can run) included."""
    problems: list[SettingProblem] = []
    if not isinstance(config, TrainConfig):
        problems.append(SettingProblem("config", config, "must be a workbench.TrainConfig"))
    bad_ranks = integer_problem(
        "ranks", ranks, 1, MAX_RANKS, "more local ranks than one machine runs"
    )
    for bad in (
        bad_ranks,
        integer_problem(
            "steps",
            steps,
            1,
            MAX_STEPS,
            "longer than any training run",
            meaning="the step to train to",
        ),
        seconds_problem("timeout", timeout),
        None
        if threads is None
        else integer_problem(
            "threads", threads, 1, MAX_THREADS, "more threads than any machine has cores"
        ),
        options_problem("model_options", model_options),
    ):
        if bad:
            problems.append(bad)
    if launcher not in LAUNCHERS:
        problems.append(
            SettingProblem("launcher", launcher, f"must be one of {', '.join(LAUNCHERS)}")
        )
    if on_record is not None and not callable(on_record):
        problems.append(SettingProblem("on_record", on_record, "must be callable(record) or None"))
    problems += _check_model(model)
    if not isinstance(config, TrainConfig):
        return problems
    # what the ranks could not run here (an optimizer a Session does not train, adam8bit
    # included; an NVMe path), said up front
    problems += runtime_problems(config)
    prec = Precision(config.precision)
    if prec is Precision.AMP_FP16:
        problems.append(
            SettingProblem(
                "precision",
                prec.value,
                "several ranks train through DeepSpeed; use 'fp16' (DeepSpeed's loss-scaled "
                "fp16, GPUs only) or 'amp-bf16'",
            )
        )
    if prec is Precision.FP16 and not uses_cuda(config):
        problems.append(
            SettingProblem(
                "precision", prec.value, "DeepSpeed does not support fp16 on CPU; use 'bf16'"
            )
        )
    if bad_ranks is None:
        problems += engine_problems(config, int(ranks))
        machine = ranks_problem(config, ranks)
        if machine:
            problems.append(machine)
        if options_problem("model_options", model_options) is None:
            # what a rank would refuse of the model (given the options as the ranks get
            # them: JSON), said here once (not again per rank)
            said = {(p.field, p.message) for p in problems}
            as_sent = json.loads(json.dumps(model_options or {}, default=json_number))
            problems += [
                p
                for p in model_problems(config, int(ranks), model, as_sent or None)
                if (p.field, p.message) not in said
            ]
    return problems


def validate_launch(
    config: Any,
    ranks: Any,
    model: Any,
    steps: Any,
    launcher: Any,
    timeout: Any,
    on_record: Any,
    model_options: Any,
    threads: Any = None,
) -> None:
    """LaunchError naming every problem of a launch's arguments (`launch_problems`)."""
    problems = launch_problems(
        config, ranks, model, steps, launcher, timeout, on_record, model_options, threads
    )
    if problems:
        raise LaunchError(problems)
