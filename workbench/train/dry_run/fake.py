"""What a dry run fakes: your module rebuilt on fake tensors, the example micro-batch, the
kernels a GPU would run, and the names of what failed.

* `fake_model` turns what the user hands over into a module whose parameters and buffers
  are `FakeTensor`s (shapes, dtypes and devices, no storage) on the simulated device:
  a built-in model name is built inside the fake mode; a zero-argument callable is called
  inside it (nothing it creates is allocated); an `nn.Module`, real or on the meta device,
  is copied with every parameter and buffer replaced by an empty fake tensor of the same
  shape, strides and dtype (ties kept: one fake per parameter object). Your module is never
  changed, moved or copied in memory.
* `fake_batch` does the same to the example micro-batch (a real tensor costs nothing: only
  its metadata is read), or makes one: a built-in model's dataset sample, or token ids of a
  `transformers` model's vocabulary (an encoder-decoder's decoder fed ids of their shape,
  so no `decoder_start_token_id` is needed to shift the labels).
* `GpuKernels`, when the simulation runs on the CPU (a CPU-only torch cannot fake CUDA
  tensors through autograd: it aborts the process), routes the two calls whose CPU kernels
  keep more than the CUDA ones: dropout keeps a 1-byte mask (`native_dropout`, as CUDA's
  fused kernel) instead of a mask in the input's dtype, and scaled-dot-product attention
  with dropout runs the fused kernel (which keeps a random seed, not an s x s mask).
* `unpacked_positions` answers transformers' packed-sequence check (its mask building
  reads the positions' values, which fake tensors do not have, so it builds an s x s mask)
  as a real batch of the model's own positions answers it: one sequence per row. Without
  it, every causal attention gets a materialised mask: sdpa keeps a float copy of it per
  layer and, with grouped-query attention, K and V repeated to every head, where a real
  run calls sdpa with `is_causal` and `enable_gqa` (Llama, 2 x 128 tokens: +4% of the
  forward end's total, what docs/dry_run.md once put down to the rotary embedding).
* `GroupedMatmuls` runs a mixture of experts' grouped matmuls (`torch._grouped_mm`, which
  transformers' Mixtral experts call in the weights' dtype) in fp32 and fp16 too, as a GPU
  does (torch's fake kernel takes bf16 alone).
* `shape_config` turns the estimator's keywords (a preset of a transformers family, with
  its shape overrides, or a shape) into the config.json that builds that model
  (`workbench.estimate.hf_shape.config_of`; a Mistral preset with Mistral's classes): the
  model `workbench estimate --simulate` and the estimator panel's dry run build; a bare
  parameter count is no model, and it says what to give.
* `ModuleStack` (forward hooks on the fake copy) and `OpRecorder` (a dispatch mode) name the
  innermost module and the operator running when something fails (`failure_problem`).

The fake mode is created with `allow_non_fake_inputs=True`, so a real tensor a module
keeps outside its parameters and buffers is read as metadata, never computed on.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from workbench.inputs import shown
from workbench.problems import SettingProblem
from workbench.train.batches import describe

#: Names a model in messages (never its repr, which may be pages long).
_MAX_NAME = 60


@dataclass(frozen=True)
class FakeModel:
    """A module on fake tensors and what is known of it. `kind`: "built-in",
    "transformers" or "module"; `twin`: the same module on the meta device (what the
    formula counts; None for a built-in, whose shape is its `info`); `sample`: one item of
    a built-in's dataset (fake); `n_params`: unique parameters (tied ones once)."""

    module: nn.Module
    name: str
    kind: str
    n_params: int
    loss_fn: Callable[..., torch.Tensor] | None = None
    info: Any = None  # workbench.models.ModelInfo of a built-in
    sample: Any = None
    twin: nn.Module | None = None
    blocks_note: str | None = None

    @property
    def hf_config(self) -> Any:
        return hf_config_of(self.module)


@dataclass(frozen=True)
class FakeBatch:
    """The micro-batch the step feeds (`value`: what `batches.forward` receives), its
    leading dimension, its sequence length when it holds token ids, its description and
    whether the user gave it."""

    value: Any
    micro_batch: int
    seq_len: int | None
    text: str
    given: bool


def hf_config_of(module: Any) -> Any:
    """A `transformers` module's config (None for any other module)."""
    config = getattr(module, "config", None)
    if callable(getattr(config, "to_dict", None)) and isinstance(
        getattr(config, "model_type", None), str
    ):
        return config
    return None


def model_name(model: Any) -> str:
    """A short name for messages: the built-in name, a module's class, a function's name."""
    if isinstance(model, str):
        text = model
    elif isinstance(model, nn.Module):
        text = type(model).__name__
    elif callable(model):
        text = getattr(model, "__qualname__", None) or type(model).__name__
    else:
        text = shown(model)
    return text if len(text) <= _MAX_NAME else text[: _MAX_NAME - 3] + "..."


def unique_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Every parameter object once (tied weights are one object)."""
    return list(module.parameters())


def count_unique(module: nn.Module) -> int:
    """Parameters of a fake module, each parameter object once. (The package's counter,
    `workbench.modelstats.count_parameters`, tells storages apart by address, and every
    fake tensor's address is 0.) An FSDP DTensor counts its global size."""
    return sum(p.numel() for p in unique_parameters(module))


def _empty(
    t: torch.Tensor, device: torch.device | str, floating: torch.dtype | None = None
) -> torch.Tensor:
    """An empty tensor of `t`'s shape, strides and dtype on `device` (fake when called
    inside a fake mode, on "meta" for a twin); a floating `t` in `floating` when given."""
    dtype = floating if floating is not None and t.is_floating_point() else t.dtype
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=dtype, device=device)


def cast_copy(module: nn.Module, dtype: torch.dtype, fake_mode: Any) -> nn.Module:
    """A fake copy of the fake `module` with its floating parameters and buffers in
    `dtype` (what `module.to(dtype)` makes; `to` itself cannot swap fake parameters)."""
    device = next(module.parameters()).device
    with fake_mode:
        return _copy_with(module, lambda t: _empty(t, device, dtype))


def _sharded_problem(module: nn.Module, name: str) -> SettingProblem | None:
    for p in module.parameters():
        if hasattr(p, "ds_numel") or hasattr(p, "_local_tensor"):
            return SettingProblem(
                "model",
                name,
                "its parameters are already sharded (DeepSpeed ZeRO-3 or FSDP): pass the "
                "unsharded module, or a function that builds it",
            )
    return None


def _copy_with(module: nn.Module, make: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    """A deep copy of `module` whose parameters and buffers are `make(tensor)` (one new
    tensor per tensor object, so tied weights stay tied); nothing of `module` changes."""
    memo: dict[int, Any] = {}
    for _, p in module.named_parameters(remove_duplicate=False):
        if id(p) not in memo:
            memo[id(p)] = nn.Parameter(make(p), requires_grad=p.requires_grad)
    for _, b in module.named_buffers(remove_duplicate=False):
        if id(b) not in memo:
            memo[id(b)] = make(b)
    return copy.deepcopy(module, memo)


def meta_twin(module: nn.Module) -> nn.Module:
    """`module` on the meta device (what the formula counts: no storage, ties kept)."""
    return _copy_with(module, lambda t: _empty(t, "meta"))


def fake_model(
    model: Any,
    options: Mapping[str, Any] | None,
    fake_mode: Any,
    device: torch.device,
) -> FakeModel | list[SettingProblem]:
    """`model` on fake tensors on `device` (see the module docstring), or its problems."""
    name = model_name(model)
    if isinstance(model, str):
        return _built_in(model, dict(options or {}), fake_mode, device)
    if options:
        return [
            SettingProblem(
                "model_options", dict(options), "options are for a built-in model name only"
            )
        ]
    if isinstance(model, nn.Module):
        problem = _sharded_problem(model, name)
        if problem is not None:
            return [problem]
        twin = meta_twin(model)
        with fake_mode:
            module = _copy_with(model, lambda t: _empty(t, device))
        return _described(module, name, twin)
    if not callable(model):
        return [
            SettingProblem(
                "model",
                name,
                "must be a built-in model name, a torch nn.Module or a function that builds one",
            )
        ]
    try:
        with fake_mode, torch.device(device), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built = model()
    except Exception as exc:  # the user's constructor: report it, naming the model
        return [SettingProblem("model", name, f"building it on fake tensors failed: {_text(exc)}")]
    if not isinstance(built, nn.Module):
        return [
            SettingProblem(
                "model",
                name,
                f"the function returned {type(built).__name__}, not a torch nn.Module",
            )
        ]
    problem = _sharded_problem(built, name)
    if problem is not None:
        return [problem]
    return _described(built, type(built).__name__, meta_twin(built))


def _described(module: nn.Module, name: str, twin: nn.Module) -> FakeModel:
    config = hf_config_of(module)
    for part in module.modules():  # an encoder-decoder's decoder holds a copy of its own
        part_config = hf_config_of(part)
        if part_config is not None and getattr(part_config, "use_cache", False):
            part_config.use_cache = False  # the fake copy's own: trained without a KV cache
    kind = "transformers" if config is not None else "module"
    return FakeModel(module, name, kind, count_unique(module), twin=twin)


def _built_in(
    name: str, options: dict[str, Any], fake_mode: Any, device: torch.device
) -> FakeModel | list[SettingProblem]:
    from workbench.models import build_model, option_problems

    problems = option_problems(name, options)
    if problems:
        return [
            SettingProblem("model", name, p.message)
            if p.option == "model"
            else SettingProblem(
                "model_options", {p.option: p.value} if p.option else options, p.message
            )
            for p in problems
        ]
    with fake_mode, torch.device(device), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fake tensors' addresses read while counting
        module, dataset, loss_fn, info = build_model(name, **options)
        sample = dataset[0]
    n = count_unique(module)
    return FakeModel(
        module, name, "built-in", n, loss_fn=loss_fn, info=replace(info, n_params=n), sample=sample
    )


# ---------------------------------------------------------------------- a preset or a shape
#: The estimator's shape keywords a preset's architecture takes as overrides.
SHAPE_KEYS = (
    "layers",
    "hidden",
    "heads",
    "seq_len",
    "vocab",
    "kv_heads",
    "ffn_hidden",
    "mlp",
    "norm",
    "bias",
    "positions",
    "tied_embeddings",
    "parallel_residual",
    "activation_function",
    "qk_norm",
    "post_norms",
)


def architecture_of(kwargs: Mapping[str, Any]) -> Any:
    """The `Architecture` of estimator keywords (a preset `model` with its shape
    overrides, or a shape), or None when they name none."""
    from workbench.estimate import Architecture
    from workbench.estimate.presets import find_model

    shape = {k: kwargs[k] for k in SHAPE_KEYS if kwargs.get(k) is not None}
    try:
        if kwargs.get("model") is not None:
            preset = find_model(kwargs["model"])
            return None if isinstance(preset, str) else preset.architecture.replace(**shape)
        return Architecture.create(**shape)
    except (TypeError, ValueError):
        return None


def shape_config(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(the transformers config.json, as a dict, that builds the model the estimator
    keywords name: a preset of a transformers family, or a shape;
    `workbench.estimate.hf_shape.config_of`), or (None, what is missing)."""
    from workbench.estimate.hf_shape import config_of

    arch = architecture_of(kwargs)
    family = _preset_family(kwargs)
    if arch is None:
        given = "a parameter count" if kwargs.get("n_params") is not None else "no model"
        return None, (
            f"{given} is not a model to build: give a preset of a transformers family "
            "(gpt2, llama, mistral, mixtral, qwen, pythia), a config.json, or a shape "
            "(layers, hidden, heads)"
        )
    config = config_of(arch)
    if config is None:
        return None, (
            "no transformers model builds this shape (a decoder of the Llama, Mixtral, "
            "GPT-2 or GPT-NeoX kind)"
        )
    if family == "mistral" and config.get("model_type") == "llama":  # its own classes
        config = {k: v for k, v in config.items() if k not in ("attention_bias", "mlp_bias")}
        config["model_type"] = "mistral"
    return config, None


def _preset_family(kwargs: Mapping[str, Any]) -> str | None:
    from workbench.estimate.presets import find_model

    preset = find_model(kwargs.get("model")) if kwargs.get("model") is not None else None
    return None if preset is None or isinstance(preset, str) else preset.family


# ---------------------------------------------------------------------- the micro-batch
def _is_pair(batch: Any) -> bool:
    return isinstance(batch, (tuple, list)) and len(batch) == 2


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [v for v in value.values() if isinstance(v, torch.Tensor)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def expected_batch(fm: FakeModel, micro_batch: int) -> str | None:
    """What the model takes, when it is known (a built-in's sample, a transformers
    model's token ids)."""
    if fm.kind == "built-in" and isinstance(fm.sample, Mapping):
        shapes = ", ".join(f"{k} ({micro_batch}, {t.shape[0]})" for k, t in fm.sample.items())
        return f"a dict of int64 {shapes}"
    if fm.kind == "built-in" and fm.sample is not None:
        x, y = fm.sample
        return (
            f"an (inputs, targets) pair of shapes ({micro_batch}, "
            f"{', '.join(map(str, x.shape))}) {str(x.dtype).removeprefix('torch.')} and "
            f"({', '.join(map(str, (micro_batch, *y.shape)))}) "
            f"{str(y.dtype).removeprefix('torch.')}"
        )
    config = fm.hf_config
    if config is not None:
        longest = context_length(config)
        limit = f" <= {longest}" if longest else ""
        return (
            f"a dict with input_ids (and labels) of shape (batch, sequence{limit}), int64 token "
            f"ids below {getattr(config, 'vocab_size', '?')}"
        )
    return None


#: The config keys that give a transformers model's context length, the first one set used.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length")


def context_length(config: Any) -> int | None:
    """A transformers model's context length: the first of `CONTEXT_KEYS` its config (the
    model's config object, or a config.json read as a dict) sets to an integer > 0; the
    sequence a dry run made of token ids runs when none is given."""
    for key in CONTEXT_KEYS:
        value = config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def fake_batch(
    fm: FakeModel,
    batch: Any,
    *,
    micro_batch: int,
    seq_len: int | None,
    fake_mode: Any,
    device: torch.device,
) -> FakeBatch | list[SettingProblem]:
    """The micro-batch the dry run feeds (see the module docstring), or its problems."""
    if batch is None:
        return _made_batch(fm, micro_batch, seq_len, fake_mode, device)
    if seq_len is not None:
        return [
            SettingProblem(
                "seq_len", seq_len, "give `seq_len` or a `batch`, not both (the batch has a shape)"
            )
        ]
    problem = _batch_type_problem(fm, batch, micro_batch) or _decoder_start_problem(fm, batch)
    if problem is not None:
        return [problem]
    memo: dict[int, torch.Tensor] = {}

    def fake(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if id(value) not in memo:
                made = _empty(value, device)
                memo[id(value)] = made.requires_grad_(value.requires_grad)
            return memo[id(value)]
        if isinstance(value, Mapping):
            return {k: fake(v) for k, v in value.items()}
        if isinstance(value, (tuple, list)):
            return (
                type(value)(fake(v) for v in value)
                if isinstance(value, tuple)
                else [fake(v) for v in value]
            )
        return value

    text = describe(batch)
    with fake_mode:
        if isinstance(batch, torch.Tensor):
            ids = fake(batch)
            value: Any = _token_batch(fm, ids) if fm.kind == "transformers" else (ids, ids)
        else:
            value = fake(batch)
    tensors = _tensors(
        value["input_ids"] if isinstance(value, Mapping) and "input_ids" in value else value
    )
    first = tensors[0]
    if first.dim() == 0:
        return [
            SettingProblem(
                "batch",
                text,
                "its first tensor is a scalar: a micro-batch has a leading batch dimension",
            )
        ]
    ids = first.dim() >= 2 and not first.is_floating_point()
    return FakeBatch(value, int(first.shape[0]), int(first.shape[1]) if ids else None, text, True)


def _batch_type_problem(fm: FakeModel, batch: Any, micro_batch: int) -> SettingProblem | None:
    text = describe(batch)
    expects = expected_batch(fm, micro_batch)
    hint = f"; the model takes {expects}" if expects else ""
    if isinstance(batch, torch.Tensor):
        token_model = fm.kind == "transformers" or (fm.kind == "built-in" and fm.info.vocab)
        if token_model and not batch.is_floating_point() and batch.dim() == 2:
            return None
        if token_model:
            return SettingProblem(
                "batch",
                text,
                f"a single tensor is read as (batch, sequence) integer token ids, this one is "
                f"{str(batch.dtype).removeprefix('torch.')} of {batch.dim()} dimension(s){hint}",
            )
        return SettingProblem(
            "batch",
            text,
            "a single tensor is read as token ids of a language model; for this model give an "
            f"(inputs, targets) pair with loss_fn, or a dict of its keyword arguments{hint}",
        )
    if isinstance(batch, Mapping):
        if not batch or not _tensors(batch):
            return SettingProblem("batch", text, f"a dict must hold the model's tensors{hint}")
        if not all(isinstance(k, str) for k in batch):
            return SettingProblem("batch", text, "a dict's keys must be the model's argument names")
        return None
    if _is_pair(batch) and _tensors(batch[0]):
        return None
    return SettingProblem(
        "batch",
        text,
        "must be a torch tensor of token ids, a dict of the model's keyword arguments "
        f"(e.g. {{'input_ids': ..., 'labels': ...}}) or an (inputs, targets) pair{hint}",
    )


def _made_batch(
    fm: FakeModel, micro_batch: int, seq_len: int | None, fake_mode: Any, device: torch.device
) -> FakeBatch | list[SettingProblem]:
    if fm.kind == "built-in":
        if seq_len is not None:
            return [
                SettingProblem(
                    "seq_len",
                    seq_len,
                    "a built-in model's sequence length is its option: "
                    "model_options={'seq_len': ...}",
                )
            ]
        if isinstance(fm.sample, Mapping):  # tiny-gpt's documents: a dict of its arguments
            with fake_mode:
                value = {
                    k: torch.empty((micro_batch, *t.shape), dtype=t.dtype, device=device)
                    for k, t in fm.sample.items()
                }
            x = fm.sample["idx"]
        else:
            x, y = fm.sample
            with fake_mode:
                value = (
                    torch.empty((micro_batch, *x.shape), dtype=x.dtype, device=device),
                    torch.empty((micro_batch, *y.shape), dtype=y.dtype, device=device),
                )
        seq = int(x.shape[0]) if x.dim() == 1 and not x.is_floating_point() else None
        return FakeBatch(value, micro_batch, seq, f"{micro_batch} samples of its dataset", False)
    config = fm.hf_config
    if config is None:
        return [
            SettingProblem(
                "batch",
                None,
                "give an example micro-batch: what this module takes is not known (a tensor of "
                "token ids, a dict of its keyword arguments, or an (inputs, targets) pair; only "
                "its shapes and dtypes are read)",
            )
        ]
    if not isinstance(getattr(config, "vocab_size", None), int):
        # a multimodal model (Gemma 3's, LLaVA's): its language model's tokens
        config = getattr(config, "text_config", None) or config
    vocab = getattr(config, "vocab_size", None)
    longest = context_length(config)
    s = seq_len if seq_len is not None else longest
    if not isinstance(vocab, int) or s is None:
        return [
            SettingProblem(
                "batch",
                None,
                "give an example micro-batch or `seq_len`: the model's config names no "
                "vocabulary size or context length",
            )
        ]
    with fake_mode:
        ids = torch.empty((micro_batch, s), dtype=torch.int64, device=device)
        value = _token_batch(fm, ids)
    text = f"{micro_batch} x {s} token ids" + ("" if seq_len else " (its context length)")
    if "decoder_input_ids" in value:
        text += ", as many decoder_input_ids (the labels shifted right, as the model makes them)"
    return FakeBatch(value, micro_batch, s, text, False)


def _decoder_takes_ids(fm: FakeModel) -> bool:
    """Whether `fm` is an encoder-decoder (t5, mt5, bart, ...) whose forward takes
    `decoder_input_ids`."""
    config = fm.hf_config
    if config is None or getattr(config, "is_encoder_decoder", False) is not True:
        return False
    try:
        return "decoder_input_ids" in inspect.signature(fm.module.forward).parameters
    except (TypeError, ValueError):  # a forward without a signature
        return False


def _token_batch(fm: FakeModel, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """A transformers model's keyword arguments for the token ids `ids` (called in the
    fake mode): the ids as their own labels; an encoder-decoder's decoder fed ids of the
    same shape, as a seq2seq collator makes them from the labels, so no config key is
    needed (given labels alone, the model shifts them right itself, starting with its
    config's `decoder_start_token_id`, which a t5 config.json may lack)."""
    if not _decoder_takes_ids(fm):
        return {"input_ids": ids, "labels": ids}
    return {"input_ids": ids, "decoder_input_ids": torch.empty_like(ids), "labels": ids}


#: What an encoder-decoder reads from its config to make `decoder_input_ids` from labels.
_SHIFT_KEYS = ("decoder_start_token_id", "pad_token_id")


def _decoder_start_problem(fm: FakeModel, batch: Any) -> SettingProblem | None:
    """The problem of a dict batch with labels and no decoder inputs for an
    encoder-decoder whose config lacks a key the model shifts the labels with."""
    if not isinstance(batch, Mapping) or "labels" not in batch or not _decoder_takes_ids(fm):
        return None
    if "decoder_input_ids" in batch or "decoder_inputs_embeds" in batch:
        return None
    config = fm.hf_config
    missing = [k for k in _SHIFT_KEYS if getattr(config, k, None) is None]
    if not missing:
        return None
    source = getattr(config, "name_or_path", "") or ""  # where it was loaded from, if known
    of = f" ({shown(source)})" if source else ""
    return SettingProblem(
        "batch",
        describe(batch),
        f"{fm.name} is an encoder-decoder: given labels without decoder_input_ids it makes "
        f"them by shifting the labels right, and its config{of} has no "
        f"{' and no '.join(missing)}: add decoder_input_ids to the batch, or set "
        f"{', '.join(missing)} in the config (t5-small's config.json sets "
        "decoder_start_token_id and pad_token_id to 0)",
    )


# ---------------------------------------------------------------------- GPU kernels on CPU
class GpuKernels(TorchFunctionMode):
    """Routes dropout and attention-with-dropout to the kernels a GPU runs (see the module
    docstring); every other call passes unchanged."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func is F.dropout:
            x, p, training, inplace = _dropout_args(args, kwargs)
            if training and 0.0 < p < 1.0 and not inplace:
                return torch.native_dropout(x, p, True)[0]
        elif func is F.scaled_dot_product_attention:
            if len(args) > 4:
                args = (*args[:4], 0.0, *args[5:])
            elif kwargs.get("dropout_p"):
                kwargs["dropout_p"] = 0.0
        return func(*args, **kwargs)


@contextlib.contextmanager
def unpacked_positions(fm: FakeModel, fb: FakeBatch) -> Iterator[None]:
    """While the steps run: a `transformers` model fed neither `position_ids` nor an
    `attention_mask` numbers each row's tokens 0 .. s - 1 itself, and transformers'
    `find_packed_sequence_indices` (which reads those values to find packed sequences)
    finds none on a real batch: it says so here, where fake tensors have no values to read
    and it would report packing. So the causal mask is skipped for sdpa (`is_causal`) as in
    a real step; every other model and batch runs as it is."""
    batch = fb.value
    given = set(batch) if isinstance(batch, Mapping) else set()
    if fm.kind != "transformers" or given & {"position_ids", "attention_mask"}:
        yield
        return
    try:
        from transformers import masking_utils
    except ImportError:  # no transformers: no such check
        yield
        return
    found = getattr(masking_utils, "find_packed_sequence_indices", None)
    if found is None:  # a transformers without the check
        yield
        return
    masking_utils.find_packed_sequence_indices = _one_sequence_per_row  # type: ignore[attr-defined]
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = found  # type: ignore[attr-defined]


def _one_sequence_per_row(position_ids: torch.Tensor) -> None:
    """What `find_packed_sequence_indices` returns for positions 0 .. s - 1 on every row."""
    return None


class GroupedMatmuls(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Runs `aten._grouped_mm` (a mixture of experts' matmuls: transformers' MoE experts,
    torchtitan's) on fake tensors of any floating dtype. torch's fake kernel takes bf16
    alone, while a GPU's runs fp32 and fp16 too (a Mixtral trained in fp32, or under
    autocast, whose experts call it in the weights' dtype); its output is made here with the
    shape the fake kernel gives (every other call, and a bf16 one, passes unchanged). Entered
    under the memory tracker, so the tracker counts the output as the kernel's."""

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.ops.aten._grouped_mm.default:
            made = _grouped_mm_output(*args, **kwargs)
            if made is not None:
                return made
        return func(*args, **kwargs)


def _grouped_mm_output(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor | None:
    """The output of `_grouped_mm(a, b, offs)` for floating inputs other than bf16 (the
    shapes of torch's fake kernel: (S, K) x (G, K, N) -> (S, N); (K, S) x (S, N) -> (G, K, N);
    (G, M, K) x (K, N) -> (M, N), all with offsets; (G, M, K) x (G, K, N) -> (G, M, N)
    without); None for bf16, mixed dtypes, or what the kernel refuses (torch's own check
    then says why)."""
    if a.dtype != b.dtype or not a.is_floating_point() or a.dtype == torch.bfloat16:
        return None
    if a.dim() not in (2, 3) or b.dim() not in (2, 3) or a.size(-1) != b.size(-2):
        return None
    batched = a.dim() == 3 and b.dim() == 3  # a batched matmul: no offsets
    if (offs is None) != batched:
        return None
    groups = 0 if offs is None else offs.size(0)
    if a.dim() == 2:
        size = [a.size(0), b.size(-1)] if b.dim() == 3 else [groups, a.size(0), b.size(1)]
    else:
        size = [a.size(1), b.size(1)] if b.dim() == 2 else [a.size(0), a.size(1), b.size(-1)]
    return torch.empty(size, dtype=out_dtype or a.dtype, device=a.device)


def _dropout_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, float, bool, bool]:
    names = ("input", "p", "training", "inplace")
    values: dict[str, Any] = {"p": 0.5, "training": True, "inplace": False}
    values.update(dict(zip(names, args, strict=False)))
    values.update(kwargs)
    return values["input"], float(values["p"]), bool(values["training"]), bool(values["inplace"])


# ---------------------------------------------------------------------- what failed
class OpRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Remembers the last operator dispatched (the one running when something fails)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.last: Any = None

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        from torch.distributed.tensor import DTensor

        if any(t is DTensor for t in types):  # let DTensor run its local operators
            return NotImplemented
        self.last = func
        return func(*args, **(kwargs or {}))


class ModuleStack:
    """Forward hooks on every module of a fake copy: the names of the modules running now
    (the innermost last; left in place when a forward raises) and the first leaf module
    that ran (what the model takes first). `remove()` takes the hooks off."""

    def __init__(self, module: nn.Module) -> None:
        root = type(module).__name__
        self.running: list[str] = []
        self.first_leaf: nn.Module | None = None
        self._handles: list[Any] = []
        for name, sub in module.named_modules():
            label = name or root
            leaf = next(iter(sub.children()), None) is None
            self._handles.append(sub.register_forward_pre_hook(self._enter(label, sub, leaf)))
            self._handles.append(sub.register_forward_hook(self._leave))

    def _enter(self, label: str, module: nn.Module, leaf: bool) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any) -> None:
            self.running.append(label)
            if leaf and self.first_leaf is None:
                self.first_leaf = module

        return hook

    def _leave(self, _module: nn.Module, _args: Any, _out: Any) -> None:
        if self.running:
            self.running.pop()

    @property
    def innermost(self) -> str | None:
        return self.running[-1] if self.running else None

    def reset(self) -> None:
        self.running.clear()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _text(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_leaf_takes(module: nn.Module | None) -> str | None:
    if isinstance(module, nn.Embedding):
        return f"integer ids below {module.num_embeddings} (its first layer is an Embedding)"
    if isinstance(module, nn.Linear):
        return f"inputs whose last dimension is {module.in_features} (its first layer is a Linear)"
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return f"inputs of {module.in_channels} channels (its first layer is a {type(module).__name__})"
    return None


#: Why an operator cannot run on fake tensors, by the fake mode's exception.
_FAKE_WHY = {
    "DataDependentOutputException": "reads a tensor's value on the host (.item(), .tolist(), "
    "a Python `if` on a tensor, ...), and a dry run has shapes, not values",
    "DynamicOutputShapeException": "returns a shape that depends on the values (nonzero, "
    "masked_select, unique, ...), which fake tensors cannot know",
    "UnsupportedOperatorException": "has no fake-tensor implementation",
    "UnsupportedFakeTensorException": "cannot take fake tensors",
}


def failure_problem(
    exc: BaseException,
    *,
    phase: str,
    fm: FakeModel,
    batch: FakeBatch,
    stack: ModuleStack,
    recorder: OpRecorder,
) -> tuple[SettingProblem, str | None, str | None]:
    """(the problem, the module, the operator) of an exception raised by a fake step: a
    failure of the fake tensors names `model`; any other failure in the forward names
    `batch` when the user gave it (the shape or type the model did not take), else
    `model`."""
    module = stack.innermost
    func = getattr(exc, "func", None) or recorder.last
    operator = str(func) if func is not None else None
    where = f"module {shown(module)}" if module else f"the {phase}"
    op = f", operator {operator}" if operator else ""
    why = _FAKE_WHY.get(type(exc).__name__)
    if why is not None:
        message = (
            f"cannot run on fake tensors: in {where}{op}: the operator {why}; the formula's "
            "estimate still answers (`formula` of this error, or workbench.estimate_memory)"
        )
        return SettingProblem("model", fm.name, message), module, operator
    expects = expected_batch(fm, batch.micro_batch) or _first_leaf_takes(stack.first_leaf)
    takes = f"; the model takes {expects}" if expects else ""
    if batch.given and phase == "forward":
        message = f"the model's forward failed on it in {where}{op}: {_text(exc)}{takes}"
        return SettingProblem("batch", batch.text, message), module, operator
    message = f"its {phase} failed on fake tensors in {where}{op}: {_text(exc)}"
    return SettingProblem("model", fm.name, message), module, operator


__all__ = [
    "CONTEXT_KEYS",
    "SHAPE_KEYS",
    "FakeBatch",
    "FakeModel",
    "GpuKernels",
    "GroupedMatmuls",
    "ModuleStack",
    "OpRecorder",
    "architecture_of",
    "cast_copy",
    "context_length",
    "count_unique",
    "expected_batch",
    "failure_problem",
    "fake_batch",
    "fake_model",
    "hf_config_of",
    "meta_twin",
    "model_name",
    "shape_config",
]
