"""Built-in models that train on a laptop CPU in seconds.

    module, dataset, loss_fn, info = build_model("tiny-gpt")            # defaults
    module, dataset, loss_fn, info = build_model("mlp", hidden=256, seed=1)

* `tiny-gpt`: character-level GPT on Shakespeare's sonnets (workbench/models/data/);
  options layers=4, hidden=128, heads=4, seq_len=64, dropout=0.1, text=None (a path).
* `mlp`: regression on a fixed random teacher; options in_features=64, hidden=256,
  depth=3, out_features=16, samples=8192.
* `cnn`: 10-class classification of generated 16x16 images; options channels=16,
  image_size=16, classes=10, samples=4096.

Every model takes `seed` (default 0): weights and generated data are drawn from it
without touching the global RNG. `info` gives the shape facts the memory estimator
needs (`layers`, `hidden`, `heads`, `seq_len`, `vocab`; None where they do not apply).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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

    @property
    def is_transformer(self) -> bool:
        """True when the estimator's transformer activation formula applies."""
        return None not in (self.layers, self.hidden, self.heads, self.seq_len, self.vocab)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_OPTIONS: dict[str, dict[str, Any]] = {
    "tiny-gpt": dict(layers=4, hidden=128, heads=4, seq_len=64, dropout=0.1, text=None, seed=0),
    "mlp": dict(in_features=64, hidden=256, depth=3, out_features=16, samples=8192, seed=0),
    "cnn": dict(channels=16, image_size=16, classes=10, samples=4096, seed=0),
}

MODEL_NAMES: tuple[str, ...] = tuple(_OPTIONS)


def model_options(name: str) -> dict[str, Any]:
    """The options `name` accepts, with their defaults."""
    _check_name(name)
    return dict(_OPTIONS[name])


def _check_name(name: Any) -> None:
    if name not in _OPTIONS:
        raise ValueError(f"model={name!r}: must be one of {', '.join(MODEL_NAMES)}")


def _count(module: nn.Module) -> int:
    from workbench.modelstats import count_parameters

    return count_parameters(module)


def build_model(name: str, **options: Any) -> tuple[nn.Module, Dataset[Any], LossFn, ModelInfo]:
    """(module, dataset, loss_fn, info) of the built-in model `name`.

    Raises ValueError for an unknown name or option, listing what is allowed.
    """
    _check_name(name)
    allowed = _OPTIONS[name]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"model {name!r}: unknown option(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(f'{k}={v!r}' for k, v in allowed.items())}"
        )
    opts = {**allowed, **options}
    for key, value in opts.items():
        if key in ("text", "dropout"):
            continue
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or value < (0 if key == "seed" else 1)
        ):
            raise ValueError(
                f"model {name!r}: {key}={value!r}: must be an integer >= {0 if key == 'seed' else 1}"
            )
    seed = opts.pop("seed")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "tiny-gpt":
            return _tiny_gpt(**opts)
        if name == "mlp":
            return _mlp(seed=seed, **opts)
        return _cnn(seed=seed, **opts)


def _tiny_gpt(
    *, layers: int, hidden: int, heads: int, seq_len: int, dropout: float, text: str | None
) -> tuple[nn.Module, Dataset[Any], LossFn, ModelInfo]:
    from workbench.models.gpt import CharDataset, TinyGPT, lm_loss, load_text

    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout < 1:
        raise ValueError(f"model 'tiny-gpt': dropout={dropout!r}: must be a number in [0, 1)")
    if hidden % heads:
        raise ValueError(f"model 'tiny-gpt': heads={heads}: must divide hidden={hidden} evenly")
    dataset = CharDataset(load_text(text), seq_len)
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
    )
    return module, dataset, lm_loss, info


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

    if image_size % 4:
        raise ValueError(f"model 'cnn': image_size={image_size}: must be a multiple of 4")
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


__all__ = ["MODEL_NAMES", "ModelInfo", "build_model", "model_options"]
