"""Sequence packing of the built-in text (`TrainConfig.documents`): the documents, the
block-diagonal attention, the per-token loss, the padding each layout costs, a Session
training both layouts, the estimator's mask term against the measured one, and where the
setting is refused (another model or data, a live change) or exported."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from workbench import TrainConfig
from workbench.config import ConfigError
from workbench.models import build_model, option_problems
from workbench.models.gpt import (
    IGNORE,
    DocumentDataset,
    TinyGPT,
    document_loss,
    load_text,
    split_documents,
)
from workbench.prediction import predict_memory
from workbench.train.session import Session

REPO = Path(__file__).resolve().parents[2]
SMALL = {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 64}


@pytest.fixture(scope="module")
def text() -> str:
    return load_text()


def _batch(data: DocumentDataset, rows: list[int]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([data[i][k] for i in rows]) for k in data[0]}


def test_each_sonnet_is_one_document(text: str) -> None:
    docs = split_documents(text)
    headings = [ln for ln in text.split("\n") if ln.strip() and set(ln.strip()) <= set("IVXLC")]
    assert len(docs) == len(headings) == 41
    assert docs[0].startswith("From fairest creatures") and "SONNETS" not in docs[0]
    assert all(len(d.split("\n")) == 14 for d in docs)  # fourteen lines each
    assert not any(d.strip() in headings for d in docs)
    # a text without headings: its paragraphs
    assert split_documents("one\ntwo\n\n\nthree\n") == ["one\ntwo", "three"]


def test_the_padding_each_layout_costs_is_what_the_documents_give(text: str) -> None:
    """Padding fraction from the data, computed by hand from the documents' lengths."""
    s = 1024
    lengths = [len(d) + 1 for d in split_documents(text)]  # each with its end token
    padded = DocumentDataset(text, s, "padded").report()
    packed = DocumentDataset(text, s, "packed").report()
    real_padded = sum(min(n, s) for n in lengths)
    assert padded.slot_tokens == len(lengths) * s and padded.real_tokens == real_padded
    assert padded.padding_fraction == pytest.approx(1 - real_padded / (len(lengths) * s))
    windows = -(-sum(lengths) // s)
    assert packed.slot_tokens == windows * s and packed.real_tokens == sum(lengths)
    assert packed.padding_fraction == pytest.approx(1 - sum(lengths) / (windows * s))
    assert padded.padding_fraction > 0.35 and packed.padding_fraction < 0.02
    assert packed.dropped_tokens == 0 == padded.dropped_tokens  # every sonnet < 1024
    # short windows: padding truncates each sonnet (dropped), packing keeps every token
    short = DocumentDataset(text, 64, "padded").report()
    assert short.padding_tokens == 0 and short.dropped_tokens == sum(lengths) - 41 * 64
    # one target per document carries no loss: its end token's (never across a boundary)
    assert packed.loss_tokens == packed.real_tokens - len(lengths)


def test_padded_positions_carry_no_loss_and_the_loss_is_the_per_token_mean(text: str) -> None:
    data = DocumentDataset(text, 1024, "padded")
    batch = _batch(data, [0, 1, 2])
    pad = batch["doc_ids"] < 0
    assert pad.any() and (batch["labels"][pad] == IGNORE).all()
    torch.manual_seed(0)
    logits = torch.randn(3, 1024, data.vocab)
    loss = document_loss(logits, batch)
    # by hand: -log p(target) summed over the targets that carry a loss, over their count
    logp = torch.log_softmax(logits.double(), dim=-1)
    keep = batch["labels"] != IGNORE
    picked = logp[keep].gather(1, batch["labels"][keep].unsqueeze(1))
    assert loss.item() == pytest.approx(-picked.sum().item() / keep.sum().item(), rel=1e-6)
    # whatever the model says at padded positions changes nothing
    noisy = logits.clone()
    noisy[pad] = torch.randn_like(noisy[pad]) * 100
    assert document_loss(noisy, batch).item() == loss.item()


def _window_with_two_documents(data: DocumentDataset) -> tuple[int, int]:
    """A sample holding the end of one document and the start of the next, and where the
    second starts."""
    for i in range(len(data)):
        ids = data[i]["doc_ids"]
        change = (ids[1:] != ids[:-1]).nonzero()
        if len(change) and 8 < int(change[0]) < data.seq_len - 8:
            return i, int(change[0]) + 1
    raise AssertionError("no window with two documents")


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_a_token_never_sees_another_document(text: str, kernel: str) -> None:
    """Changing one document of a packed window leaves the other's outputs unchanged, and
    a document's outputs are those of the document alone (positions restart); without the
    document ids (the stream's causal attention) the same change does leak through."""
    data = DocumentDataset(text, 64, "packed")
    torch.manual_seed(0)
    model = TinyGPT(vocab=data.vocab, seq_len=64, layers=2, hidden=32, heads=2, dropout=0.0)
    for module in model.modules():
        if hasattr(module, "kernel"):
            module.kernel = kernel
    model.eval()
    row, start = _window_with_two_documents(data)
    sample = _batch(data, [row])
    changed = {k: v.clone() for k, v in sample.items()}
    changed["idx"][0, : start - 1] = (changed["idx"][0, : start - 1] + 7) % (data.vocab - 1)
    with torch.no_grad():
        out = model(**sample)
        out_changed = model(**changed)
        alone = model(sample["idx"][:, start:])  # the second document from position 0
        leaky = model(sample["idx"]), model(changed["idx"])
    assert not torch.allclose(out[0, : start - 1], out_changed[0, : start - 1])
    torch.testing.assert_close(out[0, start:], out_changed[0, start:], rtol=0, atol=1e-5)
    torch.testing.assert_close(out[0, start:], alone[0], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(leaky[0][0, start:], leaky[1][0, start:], atol=1e-3)


def test_padding_is_never_attended_to(text: str) -> None:
    data = DocumentDataset(text, 1024, "padded")
    torch.manual_seed(0)
    model = TinyGPT(vocab=data.vocab, seq_len=1024, layers=1, hidden=32, heads=2, dropout=0.0)
    model.eval()
    sample = _batch(data, [0])
    pad = sample["doc_ids"][0] < 0
    other = {k: v.clone() for k, v in sample.items()}
    other["idx"][0, pad] = 3  # another padding id changes no real token's output
    with torch.no_grad():
        a, b = model(**sample), model(**other)
    torch.testing.assert_close(a[0, ~pad], b[0, ~pad], rtol=0, atol=1e-5)


def test_sessions_train_packed_and_padded(text: str) -> None:
    losses = {}
    for layout in ("packed", "padded"):
        config = TrainConfig(documents=layout, micro_batch=4, lr=3e-3, seed=1)
        session = Session(config, model_options=dict(SMALL))
        try:
            assert session.model_options["documents"] == layout
            report = session.data_report()
            assert report is not None and report.documents == layout
            records = session.run(20, progress=False)
        finally:
            session.close()
        losses[layout] = [r.loss for r in records]
        assert all(math.isfinite(v) for v in losses[layout])
        assert sum(losses[layout][-5:]) < sum(losses[layout][:5])
    default = Session(TrainConfig(micro_batch=4), model_options=dict(SMALL))
    try:
        assert default.data_report() is None and "documents" not in default.model_options
    finally:
        default.close()


def test_the_default_stream_is_unchanged() -> None:
    """`documents="stream"` builds what tiny-gpt always built: no documents option, the
    character windows, the same vocabulary."""
    module, data, loss, info = build_model("tiny-gpt", **SMALL)
    assert type(data).__name__ == "CharDataset" and loss.__name__ == "lm_loss"
    _, docs, doc_loss, doc_info = build_model("tiny-gpt", documents="packed", **SMALL)
    assert doc_info.vocab == info.vocab + 1 and doc_loss is document_loss


def test_bad_values_name_the_setting_and_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match=r"documents='pack': must be one of stream, padded, "):
        TrainConfig(documents="pack")
    (problem,) = option_problems("tiny-gpt", {"documents": 3})
    assert problem.option == "documents" and "stream, padded, packed" in problem.message


def test_other_data_and_live_changes_are_refused_with_the_reason() -> None:
    packed = TrainConfig(documents="packed", micro_batch=4)
    with pytest.raises(ConfigError, match=r"documents='packed': .*model 'mlp' has its own data"):
        Session(packed, model="mlp")
    module, data, loss, _ = build_model("tiny-gpt", **SMALL)
    with pytest.raises(ConfigError, match=r"documents='packed': .*your own module"):
        Session(packed, model=module, data=data, loss_fn=loss)
    with pytest.raises(ConfigError, match=r"documents='packed': .*given its own data"):
        Session(packed, data=data, model_options=dict(SMALL))
    with pytest.raises(ConfigError, match=r"documents='packed': .*documents='padded' says"):
        Session(packed, model_options={**SMALL, "documents": "padded"})
    session = Session(packed, model_options=dict(SMALL))
    try:
        with pytest.raises(ConfigError, match=r"documents='stream': cannot change on a live"):
            session.update(documents="stream")
        assert session.pending_changes == {}
    finally:
        session.close()


def test_the_estimators_mask_term_is_what_the_kernel_keeps() -> None:
    """The sdpa kernel keeps the (b, 1, s, s) bias once for every layer: measured as the
    saved activations of a packed probe minus a stream one's. Besides the term, packing
    saves the position ids per token (int64, (b - 1)·s·8 bytes more than the stream's one
    row) and its logits have one more vocabulary row (predicted): measured within 1%.
    Eager attention keeps no mask (no term; only the position ids differ). dropout=0:
    with dropout, CPU's sdpa runs its math kernel, which adds the bias into the scores it
    keeps and so keeps no bias of its own."""
    options = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 256, "dropout": 0.0}
    b, s = 4, 256
    measured, predicted = {}, {}
    for kernel in ("eager", "sdpa"):
        for layout in ("stream", "packed"):
            config = TrainConfig(documents=layout, attention=kernel, micro_batch=b)
            session = Session(config, model_options=dict(options))
            try:
                report = session.memory()
            finally:
                session.close()
            measured[kernel, layout] = report.activation_bytes
            peak = report.predicted.peak
            predicted[kernel, layout] = report.predicted_activation_bytes + peak.terms.get(
                "document mask", 0
            )
    assert predicted["eager", "packed"] - predicted["eager", "stream"] == 4 * b * s  # vocab
    sdpa_term = predicted["sdpa", "packed"] - predicted["sdpa", "stream"] - 4 * b * s
    assert sdpa_term == 4 * b * s * s  # fp32: e·s²·b
    positions = (b - 1) * s * 8
    for kernel in ("eager", "sdpa"):
        delta = measured[kernel, "packed"] - measured[kernel, "stream"]
        expected = predicted[kernel, "packed"] - predicted[kernel, "stream"]
        assert delta - expected == positions
        assert abs(delta - expected) <= 0.01 * max(expected, sdpa_term)
    info = build_model("tiny-gpt", documents="packed", **options)[3]
    bf16 = predict_memory(TrainConfig(documents="padded", attention="sdpa", precision="bf16"), info)
    assert bf16.peak.terms["document mask"] == 2 * 8 * s * s  # the compute dtype's bytes
    assert "document mask" not in predict_memory(TrainConfig(documents="packed"), info).peak.terms


def test_amp_bf16_trains_packed_with_sdpa() -> None:
    config = TrainConfig(documents="packed", attention="sdpa", precision="amp-bf16", micro_batch=2)
    session = Session(config, model_options=dict(SMALL))
    try:
        records = session.run(2, progress=False)
    finally:
        session.close()
    assert all(math.isfinite(r.loss) for r in records)


def test_exported_jobs_carry_the_layout_and_refuse_other_models(tmp_path: Path) -> None:
    from workbench.export import ExportError, check_export, export_job

    for format, config in (
        ("deepspeed", TrainConfig(documents="packed", micro_batch=2)),
        ("fsdp", TrainConfig(documents="padded", micro_batch=2, fsdp="full_shard")),
        ("lightning", TrainConfig(documents="packed", micro_batch=2)),
    ):
        out = export_job(
            config, format=format, gpus=1, out_dir=tmp_path / format, model_options=dict(SMALL)
        )
        job = json.loads(Path(out.out_dir, "job.json").read_text())
        assert job["model_options"]["documents"] == config.documents
    # the DeepSpeed job trains the packed documents
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    done = subprocess.run(
        [sys.executable, "train_deepspeed.py", "--steps", "2"],
        cwd=tmp_path / "deepspeed",
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith('{"step"')]
    assert len(steps) == 2 and all(math.isfinite(s["loss"]) for s in steps)
    packed = TrainConfig(documents="packed")
    for model in ("mlp", "my_models:make"):
        (problem,) = [
            p
            for p in check_export(packed, gpus=1, out_dir=tmp_path / "x", model=model)
            if p.field == "documents"
        ]
        assert "has its own data" in problem.message
    with pytest.raises(ExportError, match="documents='packed'"):
        export_job(packed, gpus=1, out_dir=tmp_path / "cnn", model="cnn")


def test_the_loss_over_a_micro_batch_is_per_real_token(text: str) -> None:
    """Two samples with different numbers of real tokens: each real token weighs the same
    (a mean of the per-sample means would weigh the short sample's tokens more)."""
    data = DocumentDataset(text, 1024, "padded")
    batch = _batch(data, [0, 5])
    torch.manual_seed(1)
    logits = torch.randn(2, 1024, data.vocab)
    per_token = F.cross_entropy(
        logits.reshape(-1, data.vocab), batch["labels"].reshape(-1), reduction="none"
    )
    keep = batch["labels"].reshape(-1) != IGNORE
    assert document_loss(logits, batch).item() == pytest.approx(per_token[keep].mean().item())


def test_the_dry_run_takes_document_batches_and_measures_the_mask_term() -> None:
    """The dry run (fake tensors) of a packed step under sdpa peaks above the stream's by
    the estimator's "document mask" term, within 3% (measured +1.5%: the position ids and
    the extra vocabulary row)."""
    from workbench.train.dry_run import simulate_memory

    options = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 256, "dropout": 0.0}
    peaks = {}
    for layout in ("stream", "packed"):
        config = TrainConfig(documents=layout, attention="sdpa", micro_batch=4)
        run = simulate_memory("tiny-gpt", config, model_options=dict(options), device="cpu")
        peaks[layout] = run.peak_bytes
    term = 4 * 4 * 256 * 256
    assert abs((peaks["packed"] - peaks["stream"]) - term) <= 0.03 * term
    with pytest.raises(ValueError, match=r"documents='packed': .*model 'mlp' has its own data"):
        simulate_memory("mlp", TrainConfig(documents="packed"), device="cpu")


def test_compile_trains_packed_documents_as_eager_does() -> None:
    """torch.compile of the forward takes the document batch (its keyword arguments) and
    gives the eager losses (no dropout: compiled dropout draws other masks)."""
    options = {"layers": 1, "hidden": 32, "heads": 2, "seq_len": 32, "dropout": 0.0}
    losses = {}
    for compiled in (False, True):
        config = TrainConfig(documents="packed", compile=compiled, micro_batch=2)
        session = Session(config, model_options=dict(options))
        try:
            losses[compiled] = [r.loss for r in session.run(3, progress=False)]
        finally:
            session.close()
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)


def test_a_checkpoint_resumes_with_its_layout(tmp_path: Path) -> None:
    config = TrainConfig(documents="packed", micro_batch=2, checkpoint_dir=str(tmp_path))
    session = Session(config, model_options=dict(SMALL))
    try:
        session.run(2, progress=False)
        path = session.save_checkpoint()
        position = session.data_position
    finally:
        session.close()
    resumed = Session.resume_from(path)
    try:
        assert resumed.config.documents == "packed" and resumed.data_position == position
        assert resumed.data_report() is not None
        assert all(math.isfinite(r.loss) for r in resumed.run(1, progress=False))
    finally:
        resumed.close()
    with pytest.raises(ConfigError, match=r"documents='stream': the checkpoint was trained"):
        Session.resume_from(path, documents="stream")
