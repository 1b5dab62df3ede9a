"""workbench.compress on the built-in models: INT8 dynamic quantization, magnitude pruning
(unstructured and structured), the measurements and the before/after report.

Sizes are checked against hand counts from the layer shapes, removed units against the
outputs of the unpruned model (a unit whose weights are all zero contributes nothing, so
removing it must leave the outputs exactly as they were), and every failure against the
untouched original model.
"""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch
from torch import nn

from workbench import Session, TrainConfig
from workbench.compress import (
    PrunedSelfAttention,
    compress,
    disk_bytes,
    evaluate,
    find_groups,
    held_out_split,
    load_trained,
    prune_structured,
    prune_unstructured,
    quantize_int8,
    weights_bytes,
    zero_fraction,
)
from workbench.models import build_model
from workbench.modelstats import count_parameters

SMALL_MLP = {"in_features": 16, "hidden": 32, "depth": 2, "out_features": 4, "samples": 256}
SMALL_CNN = {"channels": 4, "image_size": 8, "classes": 3, "samples": 128}


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    now = model.state_dict()
    return set(now) == set(before) and all(
        type(now[k]) in (torch.Tensor, nn.Parameter) and torch.equal(now[k], v)
        for k, v in before.items()
    )


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


# --------------------------------------------------------------------------- quantization


def test_torchao_int8_stores_int8_rows_and_keeps_the_outputs_close(tiny) -> None:
    model, data, _, _ = build_model("mlp", **SMALL_MLP)
    before = _snapshot(model)
    x = torch.stack([data[i][0] for i in range(32)])
    with torch.no_grad():
        expected = model(x)
    done = quantize_int8(model)
    assert done.method == "int8" and done.layers == ("net.0", "net.2", "net.4")
    assert "torchao" in done.notes[0]
    with torch.no_grad():
        got = done.model(x)
    assert (got - expected).abs().max() < 0.02 * expected.abs().max()
    # hand count: int8 weight + one fp32 scale and one int8 zero point per output row, fp32 bias
    hand = sum(
        m.out_features * m.in_features + m.out_features * (4 + 1 + 4) for m in _linears(model)
    )
    assert weights_bytes(done.model) == hand
    assert weights_bytes(model) == 4 * count_parameters(model)
    assert _same(model, before) and all(type(m.weight) is nn.Parameter for m in _linears(model))


def test_torch_ao_engine_uses_one_scale_per_tensor(tiny) -> None:
    model = build_model("mlp", **SMALL_MLP)[0]
    done = quantize_int8(model, engine="torch.ao")
    assert "quantize_dynamic" in done.notes[0]
    assert not _linears(done.model)  # all replaced by dynamic quantized linear layers
    # int8 weight, its scale (float64) and zero point (int64), the fp32 bias, and the
    # module's own output scale (fp32) and zero point (int64) kept in its state dict
    hand = sum(
        m.out_features * m.in_features + 16 + 4 * m.out_features + 4 + 8 for m in _linears(model)
    )
    assert weights_bytes(done.model) == hand
    assert zero_fraction(done.model) is not None


def test_int8_leaves_a_tied_head_out_and_keeps_the_tie(tiny) -> None:
    gpt = build_model("tiny-gpt", **tiny)[0]
    done = quantize_int8(gpt)
    assert "head" not in done.layers and any(
        s.startswith("head:") and "tied" in s for s in done.skipped
    )
    assert done.model.head.weight is done.model.wte.weight
    with pytest.raises(ValueError, match="'head' shares its weight with wte.weight"):
        quantize_int8(gpt, layers=["head"])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"layers": ["net.1"]},
            r"'net.1' is a GELU, which INT8 dynamic quantization does not support",
        ),
        ({"layers": ["nope"]}, r"'nope' is not a layer of this model"),
        ({"engine": "onnx"}, r"engine='onnx': must be one of 'torchao', 'torch.ao'"),
    ],
)
def test_int8_bad_input_is_refused_and_the_model_untouched(kwargs, match) -> None:
    model = build_model("mlp", **SMALL_MLP)[0]
    before = _snapshot(model)
    with pytest.raises(ValueError, match=match):
        quantize_int8(model, **kwargs)
    assert _same(model, before)


def test_int8_on_a_model_without_linear_layers_names_what_it_has() -> None:
    convs = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 3))
    with pytest.raises(ValueError, match=r"supports nn.Linear layers .* Conv2d x2, ReLU x1"):
        quantize_int8(convs)


# --------------------------------------------------------------------------- unstructured pruning


@pytest.mark.parametrize("sparsity", [-0.1, 1, 1.5, math.nan, True, "0.5"])
def test_sparsity_outside_zero_to_one_is_refused(sparsity) -> None:
    model = build_model("mlp", **SMALL_MLP)[0]
    before = _snapshot(model)
    for fn in (prune_unstructured, prune_structured):
        with pytest.raises(ValueError, match=r"sparsity=.*: must be a number in \[0, 1\)"):
            fn(model, sparsity)
    assert _same(model, before)


def test_unstructured_pruning_is_global_permanent_and_changes_no_size() -> None:
    model = build_model("mlp", **SMALL_MLP)[0]
    before = _snapshot(model)
    done = prune_unstructured(model, 0.6)
    weights = [m.weight for m in _linears(done.model)]
    total = sum(w.numel() for w in weights)
    zeros = sum(int((w == 0).sum()) for w in weights)
    assert zeros == round(0.6 * total)  # one threshold over all layers
    kept = torch.cat([w.abs().flatten() for w in weights])
    originals = torch.cat([m.weight.abs().flatten() for m in _linears(model)])
    assert kept[kept > 0].min() >= originals.kthvalue(zeros).values  # the smallest went
    # permanent: plain parameters, no masks or hooks left
    sd = done.model.state_dict()
    assert not [k for k in sd if k.endswith(("_orig", "_mask"))]
    assert all(not m._forward_pre_hooks for m in done.model.modules())
    assert weights_bytes(done.model) == weights_bytes(model)
    assert zero_fraction(done.model) == pytest.approx(zeros / total)
    assert _same(model, before)


def test_unstructured_pruning_of_a_quantized_model_is_refused() -> None:
    q = quantize_int8(build_model("mlp", **SMALL_MLP)[0]).model
    with pytest.raises(ValueError, match="not a plain floating-point tensor"):
        prune_unstructured(q, 0.5, layers=["net.0"])
    with pytest.raises(ValueError, match="not a plain floating-point tensor"):
        prune_structured(q, 0.5)


# --------------------------------------------------------------------------- structured pruning


def _zero_then_prune(model: nn.Module, unit: str, sparsity: float, x: torch.Tensor) -> nn.Module:
    """In every group of `unit`, zero the weights (and biases) that produce as many units
    as structured pruning at `sparsity` removes there (for heads, their readers' columns
    too), so those units contribute nothing; prune; the outputs must not change."""
    g = torch.Generator().manual_seed(0)
    modules = dict(model.named_modules())
    with torch.no_grad():
        for group in find_groups(model, unit):
            n = math.floor(sparsity * group.units + 1e-9)
            units = sorted(torch.randperm(group.units, generator=g)[:n].tolist())
            for cut in group.producers + (group.consumers if unit == "heads" else ()):
                w = modules[cut.layer].weight
                moved = w.movedim(cut.dim, 0)
                view = moved.reshape(cut.sections, group.units, cut.block, -1).clone()
                view[:, units] = 0
                w.copy_(view.reshape(moved.shape).movedim(0, cut.dim))
                bias = modules[cut.layer].bias
                if cut.dim == 0 and bias is not None:
                    bias.view(cut.sections, group.units, cut.block)[:, units] = 0
        expected = model.eval()(x)
    done = prune_structured(model, sparsity, unit=unit)
    with torch.no_grad():
        got = done.model.eval()(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    return done.model


def test_channels_of_the_mlp_go_and_the_outputs_stay() -> None:
    model, data, _, _ = build_model("mlp", **SMALL_MLP)
    x = torch.stack([data[i][0] for i in range(8)])
    assert [g.name for g in find_groups(model, "channels")] == [
        "net.0 -> net.2",
        "net.2 -> net.4",
    ]
    pruned = _zero_then_prune(model, "channels", 4 / 32, x)
    assert [tuple(m.weight.shape) for m in _linears(pruned)] == [(28, 16), (28, 28), (4, 28)]
    assert pruned.net[0].out_features == 28 and pruned.net[2].in_features == 28
    # the default: every group loses half its channels
    half = prune_structured(model, 0.5).model
    assert [tuple(m.weight.shape) for m in _linears(half)] == [(16, 16), (16, 16), (4, 16)]
    assert weights_bytes(half) < weights_bytes(model)


def test_channels_of_the_cnn_go_through_the_flatten_into_the_classifier() -> None:
    model, data, _, _ = build_model("cnn", **SMALL_CNN)
    x = torch.stack([data[i][0] for i in range(8)])
    names = [g.name for g in find_groups(model, "channels")]
    assert names == ["features.0 -> features.3", "features.3 -> classifier"]
    pruned = _zero_then_prune(model, "channels", 3 / 8, x)
    assert pruned.features[0].out_channels == 3 and pruned.features[3].in_channels == 3
    assert pruned.features[3].out_channels == 5
    assert pruned.classifier.in_features == 5 * (8 // 4) ** 2


def test_heads_of_tiny_gpt_go_and_the_outputs_stay(tiny) -> None:
    gpt, data, _, _ = build_model("tiny-gpt", **{**tiny, "heads": 4, "dropout": 0.0})
    x = torch.stack([data[i][0] for i in range(4)])
    assert [g.name for g in find_groups(gpt, "heads")] == [
        "blocks.0.attn heads",
        "blocks.1.attn heads",
    ]
    pruned = _zero_then_prune(gpt, "heads", 0.5, x)
    attn = pruned.blocks[0].attn
    assert isinstance(attn, PrunedSelfAttention) and attn.heads == 2 and attn.head_dim == 8
    assert attn.qkv.weight.shape == (3 * 16, 32) and attn.proj.weight.shape == (32, 16)
    assert pruned.head.weight is pruned.wte.weight  # the tie survives the copy


def test_tiny_gpt_mlp_channels_and_sparsity_zero(tiny) -> None:
    gpt, data, _, _ = build_model("tiny-gpt", **{**tiny, "dropout": 0.0})
    x = torch.stack([data[i][0] for i in range(4)])
    pruned = _zero_then_prune(gpt, "channels", 0.25, x)
    assert (
        pruned.blocks[1].mlp.fc.out_features == 96
        and pruned.blocks[1].mlp.fc_proj.in_features == 96
    )
    same = prune_structured(gpt, 0.0, unit="heads").model
    assert weights_bytes(same) == weights_bytes(gpt)


def test_structured_pruning_where_nothing_can_be_traced_says_why() -> None:
    mlp = build_model("mlp", **SMALL_MLP)[0]
    with pytest.raises(ValueError, match=r"heads found nothing .* nn.MultiheadAttention"):
        prune_structured(mlp, 0.5, unit="heads")
    with pytest.raises(ValueError, match=r"channels found nothing it can remove in this Linear"):
        prune_structured(nn.Linear(4, 4), 0.5)
    with pytest.raises(ValueError, match=r"unit='rows': must be one of 'channels', 'heads'"):
        prune_structured(mlp, 0.5, unit="rows")


# --------------------------------------------------------------------------- measurements


def test_disk_bytes_is_the_saved_file(tmp_path) -> None:
    model = build_model("cnn", **SMALL_CNN)[0]
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    assert disk_bytes(model) == os.path.getsize(path)


def test_evaluate_gives_the_mean_loss_and_accuracy() -> None:
    model, data, loss_fn, _ = build_model("cnn", **SMALL_CNN)
    x = torch.stack([data[i][0] for i in range(len(data))])
    y = torch.stack([data[i][1] for i in range(len(data))])
    with torch.no_grad():
        out = model(x)
    quality = evaluate(model, data, loss_fn, batch_size=48)  # batches of 48, 48, 32
    assert quality.samples == len(data)
    assert quality.loss == pytest.approx(float(loss_fn(out, y)), rel=1e-5)
    assert quality.accuracy == pytest.approx(float((out.argmax(1) == y).float().mean()))
    mlp, mdata, mloss, _ = build_model("mlp", **SMALL_MLP)
    assert evaluate(mlp, mdata, mloss).accuracy is None  # regression: no accuracy


def test_held_out_split_keeps_text_windows_apart(tiny) -> None:
    data = build_model("tiny-gpt", **tiny)[1]
    train, held = held_out_split(data, 0.1)
    assert len(held) == int(len(data) * 0.1)
    last_train, first_held = train.indices[-1], held.indices[0]
    assert last_train + tiny["seq_len"] + 1 < first_held  # no character in both
    mlp_data = build_model("mlp", **SMALL_MLP)[1]
    train, held = held_out_split(mlp_data, 0.25)
    assert (len(train), len(held)) == (192, 64)
    with pytest.raises(ValueError, match=r"fraction=1.2: must be a number in \(0, 1\)"):
        held_out_split(mlp_data, 1.2)


# --------------------------------------------------------------------------- the report


def test_compress_reports_every_method_against_the_model_before() -> None:
    model, data, loss_fn, _ = build_model("cnn", **SMALL_CNN)
    before = _snapshot(model)
    _, held = held_out_split(data, 0.25)
    report = compress(
        model, held, loss_fn, methods=["int8", "prune", "channels", "channels+int8"], repeats=3
    )
    assert [r.method for r in report.rows] == [
        "before",
        "int8",
        "prune",
        "channels",
        "channels+int8",
    ]
    b = report.before.figures
    assert b.params_bytes == weights_bytes(model) and b.held_out_samples == len(held)
    assert b.accuracy is not None and b.latency_samples == 3
    prune_v, channels_v = report.verdict("prune"), report.verdict("channels")
    assert prune_v.size_ratio == 1.0 and prune_v.size == "same"
    assert (
        channels_v.size == "smaller"
        and report.verdict("channels+int8").size_ratio < channels_v.size_ratio
    )
    # the compressed copies come with the report; the model itself is untouched
    assert set(report.models) == {"int8", "prune", "channels", "channels+int8"}
    assert report.row("prune").figures.zero_fraction == pytest.approx(0.5, abs=0.01)
    assert _same(model, before)
    text = str(report)
    assert "held-out loss" in text and "accuracy" in text
    # pruned weights are zeros at the same size: it pays only if measured faster, and the
    # text says so exactly when it does not (either way the timing on this machine went)
    assert prune_v.pays is (prune_v.latency == "faster")
    assert ("prune: does not pay on this hardware" in text) is (not prune_v.pays)
    # smaller: it pays unless its held-out quality fell beyond the tolerance, said if so
    assert channels_v.size == "smaller" and channels_v.pays is (channels_v.quality != "lost")
    lost = "channels: does not pay as it is (it loses quality)"
    assert (lost in text) is (not channels_v.pays)
    assert ("channels: does not pay on this hardware" in text) is False
    assert report.to_dict()["rows"][0]["method"] == "before"
    assert report.chart_png().startswith(b"\x89PNG")


def test_compress_reports_every_bad_argument_at_once() -> None:
    model, data, loss_fn, _ = build_model("mlp", **SMALL_MLP)
    with pytest.raises(ValueError, match="3 problems") as info:
        compress(model, data, loss_fn, methods=["int9", "int8+channels"], sparsity=1.0)
    message = str(info.value)
    assert "unknown method 'int9'" in message and "int8 must come last" in message
    assert "sparsity=1.0" in message


def test_load_trained_rebuilds_a_checkpointed_model(tmp_path, tiny) -> None:
    with Session(TrainConfig(micro_batch=4), model="tiny-gpt", model_options=tiny) as s:
        s.run(optimizer_steps=2)
        path = s.save_checkpoint(tmp_path)
        weights = s.state_dict()
        s.save_weights(tmp_path / "weights.pt")
    trained = load_trained(path)
    assert trained.name == "tiny-gpt" and trained.step == 2 and trained.options["layers"] == 2
    for k, v in trained.model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    plain = load_trained(tmp_path / "weights.pt", model="tiny-gpt", model_options=tiny)
    assert torch.equal(plain.model.wte.weight, weights["wte.weight"]) and plain.step is None
    with pytest.raises(ValueError, match="a weights file does not say which model"):
        load_trained(tmp_path / "weights.pt")
    with pytest.raises(ValueError, match="the weights do not fit the model"):
        load_trained(tmp_path / "weights.pt", model="mlp")


def _storages(t: torch.Tensor) -> list[int]:
    """The addresses of the memory a tensor holds: a plain tensor's storage, or the inner
    tensors' of a tensor subclass (torchao's quantized weights: data and scales); an
    unknown kind of tensor fails rather than being skipped."""
    if type(t) in (torch.Tensor, nn.Parameter):
        return [t.untyped_storage().data_ptr()]
    flatten = getattr(t, "__tensor_flatten__", None)
    assert flatten is not None, f"a {type(t).__name__} whose memory this test cannot see"
    names, _ = flatten()
    return [ptr for name in names for ptr in _storages(getattr(t, name))]


def test_compressed_copies_do_not_share_tensors_with_the_original() -> None:
    model = build_model("mlp", **SMALL_MLP)[0]
    own = {ptr for p in model.parameters() for ptr in _storages(p)}
    kinds = set()
    for done in (
        prune_unstructured(model, 0.5),
        prune_structured(model, 0.5),
        quantize_int8(model),
    ):
        values = list(done.model.state_dict().values())
        kinds |= {type(t).__name__ for t in values}
        theirs = {ptr for t in values for ptr in _storages(t)}
        assert theirs and not own & theirs
    # the quantized weights are tensor subclasses, and their inner tensors were compared
    assert kinds - {"Tensor", "Parameter"}, kinds
    assert copy.deepcopy(quantize_int8(model).model) is not None  # quantized copies copy


def test_compress_cancel_is_checked_and_stops_before_any_work() -> None:
    import threading

    from workbench.compress import CompressionCancelled, compress
    from workbench.models import build_model

    model, data, loss_fn, _ = build_model(
        "mlp", in_features=8, hidden=16, depth=1, out_features=2, samples=32
    )
    with pytest.raises(ValueError, match=r"cancel='stop': must be a threading.Event or None"):
        compress(model, data, loss_fn, methods=["prune"], cancel="stop")
    stop = threading.Event()
    stop.set()
    with pytest.raises(CompressionCancelled):
        compress(model, data, loss_fn, methods=["prune"], cancel=stop)
