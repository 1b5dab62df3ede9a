"""Built-in models that train on a laptop CPU in seconds.

    module, dataset, loss_fn, info = build_model("tiny-gpt")            # defaults
    module, dataset, loss_fn, info = build_model("mlp", hidden=256, seed=1)

* `tiny-gpt`: character-level GPT on Shakespeare's sonnets (workbench/models/data/);
  options layers=4, hidden=128, heads=4, seq_len=64, dropout=0.1, text=None (a path),
  documents="stream" (every window of the character stream; "padded" or "packed": the
  text's documents, `workbench.models.gpt.DocumentDataset`, with an end-of-document
  token in the vocabulary; a Session sets it from `TrainConfig.documents`).
* `mlp`: regression on a fixed random teacher; options in_features=64, hidden=256,
  depth=3, out_features=16, samples=8192.
* `cnn`: 10-class classification of generated 16x16 images; options channels=16,
  image_size=16, classes=10, samples=4096.

Every model takes `seed` (default 0): weights and generated data are drawn from it
without touching the global RNG. `info` gives the shape facts the memory estimator
needs (`layers`, `hidden`, `heads`, `seq_len`, `vocab`; None where they do not apply).
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from workbench.inputs import shown
from workbench.rng import GLOBAL_RNG_LOCK

#: loss_fn(outputs, targets), or (outputs, batch) for tiny-gpt's document batches
LossFn = Callable[[Any, Any], torch.Tensor]


@dataclass(frozen=True)
class ModelInfo:
    """Shape facts of a built-in model (None where a fact does not apply)."""

    name: str
    n_params: int  # unique parameters (tied weights counted once)
    layers: int | None
    hidden: int | None
    heads: int | None
    seq_len: int | None
    vocab: int | None
    tokens_per_sample: int | None  # tokens per training sample (seq_len for token models)
    dropout: float | None = None
    attention: str | None = None  # the estimator's attention kernel ("eager", "sdpa")

    @property
    def is_transformer(self) -> bool:
        """True when the estimator's transformer activation formula applies."""
        return None not in (self.layers, self.hidden, self.heads, self.seq_len, self.vocab)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_OPTIONS: dict[str, dict[str, Any]] = {
    "tiny-gpt": dict(
        layers=4,
        hidden=128,
        heads=4,
        seq_len=64,
        dropout=0.1,
        text=None,
        documents="stream",
        seed=0,
    ),
    "mlp": dict(in_features=64, hidden=256, depth=3, out_features=16, samples=8192, seed=0),
    "cnn": dict(channels=16, image_size=16, classes=10, samples=4096, seed=0),
}

MODEL_NAMES: tuple[str, ...] = tuple(_OPTIONS)
#: tiny-gpt's `documents` option (`TrainConfig.documents`): the data's layout.
DOCUMENTS = ("stream", "padded", "packed")


def model_options(name: str) -> dict[str, Any]:
    """The options `name` accepts, with their defaults."""
    _check_name(name)
    return dict(_OPTIONS[name])


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or name not in _OPTIONS:
        raise ValueError(f"model={shown(name)}: must be one of {', '.join(MODEL_NAMES)}")


def _count(module: nn.Module) -> int:
    from workbench.modelstats import count_parameters

    return count_parameters(module)


#: Upper bound of each integer option: a built-in model is for a laptop (and a GPU check).
_OPTION_MAX: dict[str, int] = {
    "layers": 256,
    "hidden": 65536,
    "heads": 1024,
    "seq_len": 1 << 20,
    "in_features": 1 << 20,
    "depth": 256,
    "out_features": 1 << 20,
    "samples": 10_000_000,
    "channels": 4096,
    "image_size": 4096,
    "classes": 1 << 20,
    "seed": 2**63 - 1,
}
#: A built-in model above this many parameters (8 GB of fp32 weights), or data above this
#: many bytes, is refused before anything is allocated.
MAX_BUILTIN_PARAMS = 2_000_000_000
MAX_BUILTIN_DATA_BYTES = 4 << 30


def _approx_size(name: str, o: dict[str, Any], vocab: int = 0) -> tuple[int, int]:
    """(parameters, data bytes) of a built-in model with valid options, from its shape
    (`vocab`: tiny-gpt's vocabulary, `text_vocab`)."""
    if name == "tiny-gpt":  # TinyGPT's count: 12Lh^2 + 13Lh + Vh + sh + 2h
        h, layers = o["hidden"], o["layers"]
        return layers * (12 * h * h + 13 * h) + (vocab + o["seq_len"] + 2) * h, 0
    if name == "mlp":
        h = o["hidden"]
        params = o["in_features"] * h + (o["depth"] - 1) * h * h + h * o["out_features"]
        return params, o["samples"] * (o["in_features"] + o["out_features"]) * 4
    c, size = o["channels"], o["image_size"]
    params = 9 * c + 18 * c * c + 2 * c * (size // 4) ** 2 * o["classes"]
    return params, o["samples"] * size * size * 4


class OptionProblem(str):
    """One problem of a built-in model's options: the line of text ("model 'mlp':
    hidden=100000: must be ...") that also carries its parts as data, so a front end writes
    its own words from `model`, `option` (None for the model as a whole), `value` and
    `message` without reading the text back."""

    model: str
    option: str | None
    value: Any
    message: str

    def __new__(
        cls, model: str, option: str | None, value: Any, message: str, *, text: str = ""
    ) -> OptionProblem:
        head = f"model {shown(model)}: " + (f"{option}={shown(value)}: " if option else "")
        self = super().__new__(cls, text or head + message)
        self.model, self.option, self.value, self.message = model, option, value, message
        return self


def _regular_file(path: str) -> bool:
    try:
        return os.path.isfile(path)
    except (OSError, ValueError):  # a NUL byte, a name too long
        return False


def _exists(path: str) -> bool:
    try:
        return os.path.exists(path)
    except (OSError, ValueError):
        return False


def text_vocab(text: str | None, documents: str = "stream") -> tuple[int | None, str | None]:
    """(tiny-gpt's vocabulary for the text at `text`, None) or (None, why the text cannot be
    read): its distinct characters, one more for the end-of-document token of a `documents`
    layout other than "stream". The file is read bounded (`workbench.inputs.read_text`: a
    regular UTF-8 file of at most `gpt.MAX_TEXT_BYTES`); None is the built-in sonnets."""
    from workbench.inputs import InputFileError, read_text
    from workbench.models.gpt import DEFAULT_TEXT, MAX_TEXT_BYTES

    try:
        chars = read_text(text or DEFAULT_TEXT, what="text", max_bytes=MAX_TEXT_BYTES)
    except InputFileError as exc:
        return None, exc.reason
    return len(set(chars)) + (documents != "stream"), None


def options_from_file(name: Any, options: Any, source: str) -> list[OptionProblem]:
    """The problems of built-in model options read from the file `source` (a checkpoint's
    manifest, a job.json) rather than given by the user: an option that makes the workbench
    read another file (tiny-gpt's `text`). A file read never chooses which other file the
    workbench reads; the caller refuses these unless the user names the same value
    themselves. Empty for anything else (the options' own checks are `option_problems`)."""
    if name != "tiny-gpt" or not isinstance(options, dict) or options.get("text") is None:
        return []
    return [
        OptionProblem(
            name,
            "text",
            options["text"],
            f"named by {source}; a file read cannot choose which other file the workbench "
            "reads: pass the text yourself (model_options={'text': PATH}, or leave it out for "
            "the built-in sonnets)",
        )
    ]


def option_problems(name: Any, options: dict[str, Any]) -> list[OptionProblem]:
    """Every problem with `options` for the built-in model `name` (empty when it can be
    built), found without building anything: unknown options, values outside their
    ranges, shapes that do not fit together, and sizes past what a built-in model is for.
    Each is its line of text and its parts as data (`OptionProblem`)."""
    if name not in _OPTIONS:
        message = f"must be one of {', '.join(MODEL_NAMES)}"
        return [
            OptionProblem(
                shown(name), "model", name, message, text=f"model={shown(name)}: {message}"
            )
        ]
    if not isinstance(options, dict):
        return [OptionProblem(name, "options", options, "must be a dict of options")]
    allowed = _OPTIONS[name]
    p: list[OptionProblem] = []
    unknown = sorted((k for k in options if k not in allowed), key=str)
    if unknown:
        names = ", ".join(shown(k)[1:-1] if isinstance(k, str) else shown(k) for k in unknown)
        p.append(
            OptionProblem(
                name,
                None,
                unknown,
                f"unknown option(s) {names}; allowed: "
                + ", ".join(f"{k}={shown(v)}" for k, v in allowed.items()),
            )
        )
    opts = {**allowed, **{k: v for k, v in options.items() if k in allowed}}
    bad = set()
    for key, value in opts.items():
        if key in ("text", "dropout", "documents"):
            continue
        low, high = (0 if key == "seed" else 1), _OPTION_MAX[key]
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            value = opts[key] = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            bad.add(key)
            p.append(
                OptionProblem(name, key, value, f"must be an integer >= {low}, at most {high:,}")
            )
    if name == "tiny-gpt":
        dropout, text = opts["dropout"], opts["text"]
        if (
            not isinstance(dropout, numbers.Real)
            or isinstance(dropout, bool)
            or not 0 <= dropout < 1
        ):
            p.append(OptionProblem(name, "dropout", dropout, "must be a number in [0, 1)"))
        if opts["documents"] not in DOCUMENTS:
            p.append(
                OptionProblem(
                    name, "documents", opts["documents"], f"must be one of {', '.join(DOCUMENTS)}"
                )
            )
        if text is not None and (not isinstance(text, str) or not text):
            p.append(OptionProblem(name, "text", text, "must be a path to a text file or None"))
            bad.add("text")
        elif text is not None and not _regular_file(text):
            why = "not a regular file" if _exists(text) else "no such file"
            p.append(OptionProblem(name, "text", text, f"{why} (a text file to train on)"))
            bad.add("text")
        if not bad & {"hidden", "heads"} and opts["hidden"] % opts["heads"]:
            p.append(
                OptionProblem(
                    name, "heads", opts["heads"], f"must divide hidden={opts['hidden']} evenly"
                )
            )
    if name == "cnn" and "image_size" not in bad and opts["image_size"] % 4:
        p.append(OptionProblem(name, "image_size", opts["image_size"], "must be a multiple of 4"))
    vocab, vocab_text = 0, ""
    if name == "tiny-gpt" and not bad:  # the vocabulary the text really gives, read bounded
        vocab_or_none, unreadable = text_vocab(opts["text"], str(opts["documents"]))
        if vocab_or_none is None:
            p.append(OptionProblem(name, "text", opts["text"], f"cannot be read: {unreadable}"))
            bad.add("text")
        else:
            vocab = vocab_or_none
            vocab_text = f"; its text's vocabulary: {vocab:,} characters"
    if not bad:
        params, data = _approx_size(name, opts, vocab)
        if params > MAX_BUILTIN_PARAMS:
            p.append(
                OptionProblem(
                    name,
                    None,
                    params,
                    f"about {params / 1e9:,.1f}B parameters: more than the "
                    f"{MAX_BUILTIN_PARAMS / 1e9:g}B a built-in model may have (8 GB of fp32 "
                    f"weights{vocab_text}); use your own module for a large model",
                )
            )
        if data > MAX_BUILTIN_DATA_BYTES:
            p.append(
                OptionProblem(
                    name,
                    None,
                    data,
                    f"about {data / 2**30:,.1f} GiB of generated data: more than "
                    f"{MAX_BUILTIN_DATA_BYTES >> 30} GiB; ask for fewer samples",
                )
            )
    return p


def build_model(name: str, /, **options: Any) -> tuple[nn.Module, Dataset[Any], LossFn, ModelInfo]:
    """(module, dataset, loss_fn, info) of the built-in model `name`.

    Raises ValueError for an unknown name or option (an option called `name` included),
    listing every problem (`option_problems`: tiny-gpt's size with the vocabulary of its
    text), before anything is allocated.
    """
    _check_name(name)
    problems = option_problems(name, options)
    if problems:
        raise ValueError(problems[0] if len(problems) == 1 else "; ".join(problems))
    allowed = _OPTIONS[name]
    opts = {
        **allowed,
        **{
            k: (int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v)
            for k, v in options.items()
        },
    }
    seed = opts.pop("seed")
    # seeded under the process's RNG lock: a Session training in a background thread
    # draws its dropout from the same global generator (workbench.rng)
    with GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "tiny-gpt":
            return _tiny_gpt(**opts)
        if name == "mlp":
            return _mlp(seed=seed, **opts)
        return _cnn(seed=seed, **opts)


def _tiny_gpt(
    *,
    layers: int,
    hidden: int,
    heads: int,
    seq_len: int,
    dropout: float,
    text: str | None,
    documents: str,
) -> tuple[nn.Module, Dataset[Any], LossFn, ModelInfo]:
    from workbench.models.gpt import (
        CharDataset,
        DocumentDataset,
        TinyGPT,
        document_loss,
        lm_loss,
        load_text,
    )

    dataset: CharDataset | DocumentDataset
    loss: LossFn = lm_loss
    if documents == "stream":
        dataset = CharDataset(load_text(text), seq_len)
    else:
        dataset, loss = DocumentDataset(load_text(text), seq_len, documents), document_loss
    module = TinyGPT(
        vocab=dataset.vocab,
        seq_len=seq_len,
        layers=layers,
        hidden=hidden,
        heads=heads,
        dropout=float(dropout),
    )
    info = ModelInfo(
        name="tiny-gpt",
        n_params=_count(module),
        layers=layers,
        hidden=hidden,
        heads=heads,
        seq_len=seq_len,
        vocab=dataset.vocab,
        tokens_per_sample=seq_len,
        dropout=float(dropout),
        attention="megatron",  # unfused, Megatron's fused softmax (workbench/models/gpt.py)
    )
    return module, dataset, loss, info


def _mlp(
    *, in_features: int, hidden: int, depth: int, out_features: int, samples: int, seed: int
) -> tuple[nn.Module, Dataset[Any], LossFn, ModelInfo]:
    from workbench.models.synthetic import MLP, teacher_regression

    module = MLP(in_features=in_features, hidden=hidden, depth=depth, out_features=out_features)
    data = teacher_regression(
        samples=samples, in_features=in_features, out_features=out_features, seed=seed + 1
    )
    info = ModelInfo(
        name="mlp",
        n_params=_count(module),
        layers=depth,
        hidden=hidden,
        heads=None,
        seq_len=None,
        vocab=None,
        tokens_per_sample=None,
    )
    return module, data, nn.functional.mse_loss, info


def _cnn(
    *, channels: int, image_size: int, classes: int, samples: int, seed: int
) -> tuple[nn.Module, Dataset[Any], LossFn, ModelInfo]:
    from workbench.models.synthetic import SmallCNN, teacher_images

    module = SmallCNN(channels=channels, image_size=image_size, classes=classes)
    data = teacher_images(samples=samples, image_size=image_size, classes=classes, seed=seed + 1)
    info = ModelInfo(
        name="cnn",
        n_params=_count(module),
        layers=2,
        hidden=channels,
        heads=None,
        seq_len=None,
        vocab=None,
        tokens_per_sample=None,
    )
    return module, data, nn.functional.cross_entropy, info


__all__ = [
    "DOCUMENTS",
    "MODEL_NAMES",
    "ModelInfo",
    "OptionProblem",
    "build_model",
    "model_options",
    "option_problems",
    "options_from_file",
    "text_vocab",
]
