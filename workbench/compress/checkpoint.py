"""A trained model to compress, from a file a Session wrote.

`load_trained(path)` reads a Session checkpoint (`session.save_checkpoint()`: the model's
name and options are in it) or a weights file (`session.save_weights()`, with `model=`
naming the model), rebuilds the model with `workbench.models.build_model` (or a factory
"pkg.module:function") and loads the trained weights into it. It also returns the
model's data set and loss, so the command line can measure held-out quality.

A checkpoint is data: loading one never imports or runs code the file chooses. A factory
the checkpoint names is refused (`UntrustedSpecError`) unless the caller passes it as
`model=` or says `trusted=True` (see `workbench.models.spec.factory_from_file`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.inputs import shown
from workbench.models import options_from_file
from workbench.models.spec import factory_from_file, is_factory, load_factory, spec_problems
from workbench.problems import ConfigError, SettingProblem


@dataclass
class Trained:
    """A rebuilt model with its trained weights, its data set and loss."""

    model: nn.Module
    dataset: Any
    loss_fn: Any
    name: str
    options: dict[str, Any] = field(default_factory=dict)
    step: int | None = None  # the optimizer step of a checkpoint
    path: str = ""


#: What `load_trained` reads, said after a refusal of something else.
ALLOWED = (
    "give a Session checkpoint (step-N.pt with its step-N.json manifest beside it, or a "
    "folder of them) or a weights file (session.save_weights(), torch.save of a state dict "
    "of tensors)"
)


def _read(path: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """(weights by name, the checkpoint payload or None for a plain weights file). A
    refusal names `path` as given (never a file it was not), says why in the user's terms
    and what is allowed."""
    from workbench.train import checkpoints

    given = os.fspath(path)
    tensor_file = checkpoints.manifest_path(given).with_suffix(".pt")
    if given.endswith(".json") and os.path.isfile(given) and not os.path.lexists(tensor_file):
        raise _path_error(
            path,
            f"a JSON file, not a checkpoint (a checkpoint's manifest step-N.json sits beside "
            f"its tensor file; no {tensor_file.name} is there); {ALLOWED}",
        )
    try:
        payload = checkpoints.load(path)
    except ValueError:
        if os.path.isdir(path) or checkpoints.manifest_path(path).is_file():
            raise  # a checkpoint folder, or a checkpoint with its manifest: its own error
        if not os.path.isfile(path):  # a FIFO or a device would block or never end
            raise _path_error(path, f"not a regular file; {ALLOWED}") from None
        try:  # torch's safe loader: a pickle naming other objects is refused unread
            weights = checkpoints.safe_load(path)
        except checkpoints.CheckpointError as refused:
            reason = refused.reason + (f"; {refused.hint}" if refused.hint else "")
            raise _path_error(
                path,
                "neither a Session checkpoint (no manifest beside it) nor a weights file "
                f"({reason}); {ALLOWED}",
            ) from None
        if not isinstance(weights, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()
        ):
            raise _path_error(path, f"not a state dict of tensors; {ALLOWED}") from None
        return weights, None
    backend = payload.get("backend") or {}
    weights = dict(backend.get("model") or {})
    weights.update(payload.get("buffers") or {})
    if not weights:
        raise _path_error(payload["path"], "the checkpoint holds no model weights")
    return weights, payload


def load_trained(
    path: str | os.PathLike[str],
    *,
    model: str | None = None,
    model_options: dict[str, Any] | None = None,
    trusted: bool = False,
) -> Trained:
    """The model a checkpoint or weights file was trained as, with its weights loaded.

    `model`: a built-in name or factory "pkg.module:function" (your choice, so a factory
    given here is imported); required for a weights file, and for a checkpoint of your own
    module. `model_options` override the saved ones. `trusted`: honour a factory the
    checkpoint itself names (it is code: only for a file you trust). ValueError for a
    missing file, an unknown model, weights that do not fit (a `ConfigError` naming `path`,
    `model` or `model_options`, other arguments named between backticks), a file that is
    no checkpoint, or (`UntrustedSpecError`) a factory named by the file when not
    `trusted`.
    """
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ConfigError([SettingProblem("path", path, "must be a checkpoint or weights file")])
    if not os.path.exists(path):
        raise _path_error(path, "no such file or directory")
    weights, payload = _read(path)
    saved = (payload or {}).get("model") or {}
    name = model or saved.get("name")
    if not name:
        raise _path_error(
            path,
            "the checkpoint holds your own module; pass `model` (a built-in name or a factory "
            "'pkg.module:function')"
            if payload is not None
            else "a weights file does not say which model it holds; pass `model` (tiny-gpt, "
            "mlp, cnn or a factory 'pkg.module:function') and its `model_options`",
        )
    if model is None:  # the file chose the model: a factory only when trusted
        factory = factory_from_file(name, source=f"checkpoint {str(path)!r}", trusted=trusted)
    else:
        problems = spec_problems(name)
        if problems:
            raise ConfigError(problems)
        factory = load_factory(name) if is_factory(name) else None
    saved_options = saved.get("options") if name == saved.get("name") else None
    if saved_options is not None and not (
        isinstance(saved_options, dict) and all(isinstance(k, str) for k in saved_options)
    ):
        raise _path_error(
            path,
            f"the checkpoint's model options {shown(saved_options)} are not a mapping of "
            "option names",
        )
    options = dict(saved_options or {})
    if model_options is not None and not isinstance(model_options, dict):
        raise ConfigError(
            [SettingProblem("model_options", model_options, "must be a dict of options")]
        )
    file_problems = options_from_file(name, options, source=f"checkpoint {shown(str(path))}")
    if file_problems and (model_options or {}).get("text") is None:
        raise ConfigError([SettingProblem("model_options", p.value, str(p)) for p in file_problems])
    options.update(model_options or {})
    if factory is not None:
        made = factory(**options)
        if not (
            isinstance(made, (tuple, list))
            and len(made) in (3, 4)
            and isinstance(made[0], nn.Module)
        ):
            raise ConfigError(
                [
                    SettingProblem(
                        "model",
                        name,
                        "the factory must return (module, dataset, loss_fn[, info]), got "
                        f"{shown(made)}",
                    )
                ]
            )
        module, dataset, loss_fn = made[0], made[1], made[2]
    else:
        from workbench.models import build_model

        module, dataset, loss_fn, _ = build_model(name, **options)
    _load_weights(module, weights, str(path))
    return Trained(
        model=module,
        dataset=dataset,
        loss_fn=loss_fn,
        name=name,
        options=options,
        step=int(payload["step"]) if payload is not None else None,
        path=str(payload["path"] if payload is not None else path),
    )


def _load_weights(module: nn.Module, weights: dict[str, torch.Tensor], path: str) -> None:
    """Load by name; every parameter (tied ones once) must be there, with its shape."""
    own = module.state_dict()
    unknown = sorted(set(weights) - set(own))
    wrong = sorted(
        f"{k} {tuple(v.shape)} vs the model's {tuple(own[k].shape)}"
        for k, v in weights.items()
        if k in own and tuple(v.shape) != tuple(own[k].shape)
    )
    needed = {name for name, _ in module.named_parameters()}  # a tied weight once
    missing = sorted(needed - set(weights))
    problems = []
    if unknown:
        problems.append(f"weights the model does not have: {', '.join(unknown[:8])}")
    if wrong:
        problems.append(f"shapes that differ: {', '.join(wrong[:8])}")
    if missing:
        problems.append(f"parameters missing: {', '.join(missing[:8])}")
    if problems:
        raise _path_error(
            path,
            f"the weights do not fit the model ({'; '.join(problems)}); check `model` and "
            "`model_options`",
        )
    module.load_state_dict(weights, strict=False)


def _path_error(path: str | os.PathLike[str], message: str) -> ConfigError:
    return ConfigError([SettingProblem("path", str(path), message)])
