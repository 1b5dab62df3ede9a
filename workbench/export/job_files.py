"""The job file and the command line of every exported training script: `job.json` read
strictly and bounded, the model it names approved before it is built, and the one way a
script exits with an error (`fail`).

A factory is code, and a `job.json` is a file anyone may have edited: the factory it names
is imported only when the script's command line names it too (`--model SPEC`, equal to
job.json's; `launch.sh` passes it) or says `--trust-model-spec`; then the script prints
what it imports (module, where from, function). Otherwise it refuses, naming the spec and
the file. A built-in model name is data and always allowed. Nor does a job.json choose which
other file is read: the text file a built-in's `text` option names is read only when the
command line names the same path (`--text PATH`; `launch.sh` passes it). Files are read bounded: a
regular file only (no FIFO or device), at most 16 MiB, strict JSON (a key given twice,
NaN or Infinity refused).

The workbench ships it as `workbench/export/job_files.py` and copies it as is beside
`job_common.py` (which imports it and re-exports its names) in every export; it imports
nothing but the standard library.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import shlex
import stat
import sys
import tempfile
from typing import Any, NoReturn

JOB_NAME = "job.json"
JOB_KEYS = (
    "description",
    "model",
    "model_options",
    "seed",
    "steps",
    "num_workers",
    "pin_memory",
    "activation_checkpointing",
    "activation_offload",
    "exported_world_size",
)
SCRIPT = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "train"
#: a job's activation recomputation (True and False, older jobs' words, mean full and none)
RECOMPUTE = ("none", "selective", "full")


def fail(message: str) -> NoReturn:
    print(f"{SCRIPT}: error: {message}", file=sys.stderr)
    sys.exit(2)


#: a factory spec: a dotted module path, a colon, a function name
FACTORY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_STEPS = 10**12


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one object")
        out[key] = value
    return out


def _not_finite(text: str) -> Any:
    raise ValueError(f"{text}: JSON numbers must be finite")


def read_json_file(path: str, what: str) -> Any:
    """The strict JSON of the regular file `path` (at most MAX_FILE_BYTES); exits with a
    message naming `what` and the path for anything else."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            fail(f"{what} {path}: not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            fail(f"{what} {path}: {info.st_size:,} bytes, more than {MAX_FILE_BYTES:,}")
        with open(path, "rb") as f:
            text = f.read(MAX_FILE_BYTES + 1).decode("utf-8")
        return json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_not_finite,
            parse_float=lambda t: float(t) if math.isfinite(float(t)) else _not_finite(t),
        )
    except (OSError, ValueError, RecursionError) as exc:
        fail(f"{what} {path}: cannot be read ({' '.join(str(exc).split())[:300]})")


def number_in(value: Any, low: float, high: float) -> bool:
    """A finite int or float (not a bool) within [low, high]."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and low <= value <= high
    )


def int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def read_job(path: str, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The job description (`job.json`), every key present (JOB_KEYS and `extra`) and of
    its type; every problem named at once."""
    job = read_json_file(path, "the job description")
    if not isinstance(job, dict):
        fail(f"{path}: must hold a JSON object")
    missing = [k for k in (*JOB_KEYS, *extra) if k not in job]
    if missing:
        fail(f"{path}: missing {', '.join(missing)}")
    checks = {
        "model": isinstance(job["model"], str) and 0 < len(job["model"]) <= 300,
        "model_options": isinstance(job["model_options"], dict),
        "seed": int_in(job["seed"], 0, 2**64 - 1),
        "steps": int_in(job["steps"], 1, MAX_STEPS),
        "num_workers": int_in(job["num_workers"], 0, 1024),
        "pin_memory": isinstance(job["pin_memory"], bool),
        "activation_checkpointing": isinstance(job["activation_checkpointing"], bool)
        or job["activation_checkpointing"] in RECOMPUTE,
        "activation_offload": isinstance(job["activation_offload"], bool),
        "exported_world_size": int_in(job["exported_world_size"], 1, 2**26),
    }
    for key in extra:
        checks[key] = isinstance(job[key], dict if key == "config" else str)
    bad = [f"{k}={repr(job[k])[:80]}" for k, ok in checks.items() if not ok]
    if bad:
        fail(f"{path}: not a job this script writes: {', '.join(bad)}")
    return dict(job)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """`--model SPEC` and `--trust-model-spec` (see the module docstring)."""
    parser.add_argument(
        "--model",
        metavar="SPEC",
        default=None,
        help="the model job.json names; a factory 'pkg.module:function' is imported only "
        "when named here too (launch.sh does)",
    )
    parser.add_argument(
        "--trust-model-spec",
        action="store_true",
        help="import the factory job.json names without naming it with --model",
    )
    parser.add_argument(
        "--text",
        metavar="PATH",
        default=None,
        help="the text file job.json's model options name (tiny-gpt's `text`); it is read "
        "only when named here too (launch.sh does)",
    )


def approve_model(
    job: dict[str, Any],
    model: str | None,
    trusted: bool,
    source: str,
    text: str | None = None,
) -> bool:
    """Whether the job's model may be built: a built-in name always; a factory when the
    command line named it too (`model`, which must equal job.json's) or `trusted`, after
    printing what will be imported. A built-in's `text` option (the file tiny-gpt trains
    on) is read only when the command line names the same path (`text`, `--text`): a job
    file never chooses which other file is read. Exits with a refusal naming the spec (or
    the text) and `source`."""
    spec = job["model"]
    if model is not None and model != spec:
        fail(
            f"--model {model!r}: {source} names the model {spec!r}; give the same model "
            "(or re-export the job for another)"
        )
    if ":" not in spec:
        approve_text(job, text, source)
        return True
    if not FACTORY.match(spec):
        fail(f"{source}: model {spec!r}: a factory must be written 'pkg.module:function'")
    module_name, _, function = spec.partition(":")
    if model is None and not trusted:
        fail(
            f"{source}: model {spec!r} names Python code to import and run (module "
            f"{module_name!r}, function {function!r}); a job file cannot choose code to run, "
            f"so it is not imported. Name it yourself: {SCRIPT} --model {spec} (launch.sh "
            "does), or pass --trust-model-spec if you trust this file"
        )
    sys.path.insert(0, os.getcwd())  # as `python -m` finds modules in the current folder
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        found = None
    origin = "not importable here" if found is None else (found.origin or "a namespace package")
    why = "named by --model" if model is not None else "trusted with --trust-model-spec"
    if os.environ.get("RANK", "0") == "0":
        print(
            f"{SCRIPT}: model {spec!r} ({why}): importing module {module_name!r} from "
            f"{origin} and calling {function}(**model_options)",
            file=sys.stderr,
        )
    return True


def approve_text(job: dict[str, Any], text: str | None, source: str) -> None:
    """Exit with a refusal unless the file a built-in model's `text` option names is the
    one the command line names (`--text`), or neither names one (the built-in sonnets)."""
    options = job["model_options"]
    given = options.get("text") if isinstance(options, dict) else None
    if given is None and text is None:
        return
    if given is None:
        fail(
            f"--text {repr(text)[:200]}: {source} trains on the built-in sonnets (no text option); "
            "re-export the job with the text"
        )
    if text is None:
        fail(
            f"{source}: model option text={repr(given)[:200]} names a file to train on; a job "
            "file cannot choose which file is read, so it is not read. Name it yourself: "
            f"{SCRIPT} --text {shlex.quote(str(given))} (launch.sh does)"
        )
    if text != given:
        fail(
            f"--text {repr(text)[:200]}: {source} names the text {repr(given)[:200]}; give the same "
            "path (or re-export the job for another text)"
        )


def check_world_size(job: dict[str, Any], world: int, running: str, reexport: str) -> None:
    """Stop a run on another number of ranks than `job` was exported for, before it trains:
    the global batch (micro-batch x grad-accum x data-parallel ranks) and the learning rate
    were chosen for that many, as train_deepspeed.py's train_batch_size check keeps them.
    `running`: how this run counts its ranks; `reexport`: the export command for them."""
    exported = int(job["exported_world_size"])
    if world == exported:
        return
    config = job.get("config") or {}
    micro, accum = int(config.get("micro_batch", 1)), int(config.get("grad_accum", 1))
    replicas = max(1, exported // max(1, int(config.get("tp", 1))))
    fail(
        f"{JOB_NAME}: exported_world_size={exported}: the job was exported for world size "
        f"{exported} (global batch {micro * accum * replicas} = micro {micro} x accum {accum} "
        f"x {replicas} data-parallel rank(s)); this run has {running}. Launch {exported} "
        f"ranks, or re-export with `{reexport}`"
    )


def writable_folder(path: str, flag: str, make: bool = False) -> None:
    """`path` is a folder, or a path to make one at, this process can write in; else exits
    naming `flag` (before training: nothing trained is lost). It writes there for real (a
    permission bit says nothing to root, nor of /proc) and removes what it wrote. `make`:
    the folder and any missing parents are made now (a checkpoint folder); otherwise the
    parent must be a writable folder already and nothing is made (`--save-dir`)."""
    if not path or os.path.exists(path) and not os.path.isdir(path):
        fail(f"{flag} {path!r}: must be a folder (or a path to make one at), not a file")
    full = os.path.abspath(path)
    parent = os.path.dirname(full)
    if not make and (not os.path.isdir(parent) or not os.access(parent, os.W_OK)):
        fail(f"{flag} {path!r}: its parent {parent!r} is not a writable folder")
    try:  # a file in it, or a folder beside where it will be: unique names, no rank races
        if make:
            os.makedirs(full, exist_ok=True)
        if os.path.isdir(full):
            with tempfile.TemporaryFile(dir=full):
                pass
        else:
            os.rmdir(tempfile.mkdtemp(dir=parent))
    except OSError as exc:
        fail(f"{flag} {path!r}: cannot write there ({exc.strerror or exc})")
