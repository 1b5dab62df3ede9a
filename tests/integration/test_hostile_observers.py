"""Real trainers whose loss the workbench's callbacks cannot see: a Hugging Face `Trainer`
whose `compute_loss` computes the loss outside the model, a Lightning module optimizing by
hand whose `training_step` returns nothing. Their records say the loss is unknown (None,
not NaN), the observer says why once, and the advisor does not call the run diverging.
Tiny models, 3 steps each."""

from __future__ import annotations

import math

import torch

VOCAB = 32


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int = 16, seq: int = 8) -> None:
        self.x = torch.randint(0, VOCAB, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _hf_run(tmp_path, logging_steps: int):  # type: ignore[no-untyped-def]
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from workbench.integrations import WorkbenchTrainerCallback

    class OwnLoss(Trainer):
        """The loss computed outside the model: its output has no .loss."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[no-untyped-def]
            labels = inputs.pop("labels")
            out = model(**inputs)
            logits = out.logits[:, :-1]
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1)
            )
            return (loss, out) if return_outputs else loss

    config = GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=16,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    callback = WorkbenchTrainerCallback()
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=3,
        logging_steps=logging_steps, report_to=[], save_strategy="no", use_cpu=True,
        disable_tqdm=True,
    )  # fmt: skip
    trainer = OwnLoss(
        model=GPT2LMHeadModel(config), args=args, train_dataset=Tokens(), callbacks=[callback]
    )
    trainer.train()
    return trainer, callback.observer


def test_an_hf_trainer_computing_its_own_loss_is_unknown_and_not_diverging(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, obs = _hf_run(tmp_path, logging_steps=2)
    assert [r.loss for r in obs.records()] == [None, None, None]
    assert "nonfinite-loss" not in [a.id for a in obs.advice()]
    said = [n for n in obs.notes if "loss unknown" in n]
    assert len(said) == 1 and "compute_loss" in said[0] and "logging_steps=1" in said[0]


def test_an_hf_trainer_computing_its_own_loss_logging_each_step_gives_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    trainer, obs = _hf_run(tmp_path, logging_steps=1)
    logged = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    losses = [r.loss for r in obs.records()]
    assert losses == logged and all(math.isfinite(x) for x in losses)
    assert not [n for n in obs.notes if "loss unknown" in n]


def test_a_lightning_manual_step_returning_nothing_is_unknown_and_not_diverging() -> None:
    import lightning as L

    from workbench.integrations import WorkbenchLightningCallback
    from workbench.models import build_model

    model, data, loss_fn, _ = build_model("tiny-gpt", layers=1, hidden=16, heads=2, seq_len=8)

    class Manual(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.automatic_optimization = False

        def training_step(self, batch, i):  # type: ignore[no-untyped-def]
            x, y = batch
            self.manual_backward(loss_fn(self.model(x), y))
            opt = self.optimizers()
            opt.step()
            opt.zero_grad()  # and returns nothing

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    callback = WorkbenchLightningCallback()
    trainer = L.Trainer(
        max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    trainer.fit(Manual(), torch.utils.data.DataLoader(data, batch_size=4))
    obs = callback.observer
    assert [r.loss for r in obs.records()] == [None, None, None]
    assert "nonfinite-loss" not in [a.id for a in obs.advice()]
    said = [n for n in obs.notes if "loss unknown" in n]
    assert len(said) == 1 and "training_step" in said[0]


def test_a_lightning_step_skipping_some_batches_records_their_loss_as_unknown() -> None:
    """Automatic optimization: a training_step that returns None for some batches (Lightning
    still counts the step) leaves those records' loss unknown, the others' as returned."""
    import lightning as L

    from workbench.integrations import WorkbenchLightningCallback
    from workbench.models import build_model

    model, data, loss_fn, _ = build_model("tiny-gpt", layers=1, hidden=16, heads=2, seq_len=8)

    class Skipping(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.losses: list[float] = []

        def training_step(self, batch, i):  # type: ignore[no-untyped-def]
            x, y = batch
            loss = loss_fn(self.model(x), y)
            self.losses.append(loss.item())
            return loss if i % 2 == 0 else None

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    callback = WorkbenchLightningCallback()
    module = Skipping()
    trainer = L.Trainer(
        max_epochs=1, limit_train_batches=4, accelerator="cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[callback],
    )  # fmt: skip
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    records = callback.observer.records()
    assert len(records) == trainer.global_step == 4
    assert [r.loss for r in records[1::2]] == [None, None]
    assert [r.loss for r in records[::2]] == [module.losses[0], module.losses[2]]
    assert "nonfinite-loss" not in [a.id for a in callback.observer.advice()]
