"""What a Session does when a step fails: the decisions and the words, not the state.

The Session's loop (`session.py`) catches three kinds of failure and asks here what to do:

* out of memory: `halved_for_oom` gives the settings to retry the same samples with
  (micro_batch halved, grad_accum doubled: the same effective batch), or raises
  `CannotHalve` when the micro-batch cannot be split (it is 1, the data is your own
  DataLoader, whose batches the session does not cut, or optimizer_in_backward keeps
  grad_accum at 1);
* a non-finite loss: `nan_message` says that the step was not applied and what to try;
* any other exception: `failure_message` says which step failed, that it was not applied,
  and how to continue.

Pure decisions over `TrainConfig`: no torch, no session state.
"""

from __future__ import annotations

from typing import Any

from workbench.config import TrainConfig
from workbench.inputs import shown


class CannotHalve(RuntimeError):
    """Out of memory at a micro-batch that cannot be split any further."""


def first_line(message: str, limit: int = 300) -> str:
    """The informative first line of an exception's text, bounded."""
    return message.splitlines()[0][:limit] if message else ""


def halved_for_oom(config: TrainConfig, *, user_loader: bool, message: str) -> TrainConfig:
    """The settings to retry an out-of-memory step with: micro_batch halved and grad_accum
    doubled. `CannotHalve` (naming why) when micro_batch is 1, the data is a DataLoader of
    your own, optimizer_in_backward keeps grad_accum at 1, or the halved settings are
    refused."""
    if config.micro_batch <= 1 or user_loader:
        why = "micro_batch is 1" if config.micro_batch <= 1 else "data is your own DataLoader"
        raise CannotHalve(f"out of memory and cannot halve micro_batch ({why}): {message}")
    if config.optimizer_in_backward:
        raise CannotHalve(
            "out of memory and cannot halve micro_batch (optimizer_in_backward steps inside "
            "backward, so grad_accum stays 1 and the halves cannot be accumulated; lower "
            "micro_batch yourself, which changes the effective batch, or turn "
            f"optimizer_in_backward off): {message}"
        )
    try:
        return config.replace(micro_batch=config.micro_batch // 2, grad_accum=config.grad_accum * 2)
    except ValueError as exc:  # the doubled accumulation is refused by another setting
        why = " ".join(str(exc).split())
        raise CannotHalve(f"out of memory and cannot halve micro_batch ({why}): {message}") from exc


def oom_message(before: TrainConfig, after: TrainConfig) -> str:
    """The "oom" event's text: what was halved and whether the effective batch held."""
    eff_old = before.micro_batch * before.grad_accum
    eff_new = after.micro_batch * after.grad_accum
    kept = "unchanged" if eff_old == eff_new else f"now {eff_new}, was {eff_old}"
    return (
        f"out of memory at micro_batch={before.micro_batch}: micro_batch halved to "
        f"{after.micro_batch} and grad_accum doubled to {after.grad_accum} (effective batch "
        f"{kept}); retrying the same batch"
    )


def oom_queued_text(queued: dict[str, Any], asked: TrainConfig, retry: TrainConfig) -> str:
    """What the "oom" event adds about the `queued` micro_batch / grad_accum change it kept
    (`asked`: the settings asked for now; `retry`: those of the retried step)."""
    if not queued:
        return ""
    shape = {"micro_batch": asked.micro_batch, "grad_accum": asked.grad_accum}
    effective = f"(effective batch {asked.micro_batch * asked.grad_accum})"
    if (asked.micro_batch, asked.grad_accum) == (retry.micro_batch, retry.grad_accum):
        return f"; the retry runs your queued {_settings(queued)} {effective}"
    as_shape = "" if queued == shape else f" as {_settings(shape)}"
    return f"; your queued {_settings(queued)} applies from the next step{as_shape} {effective}"


def oom_refused_message(refused: dict[str, Any], why: str, retry: TrainConfig) -> str:
    """The "change-refused" event's text: the queued changes an out-of-memory retry refused."""
    return (
        f"your queued {_settings(refused)} was not applied: {why}; training goes on at "
        f"micro_batch={retry.micro_batch}, grad_accum={retry.grad_accum}"
    )


def _settings(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={shown(v)}" for k, v in changes.items())


def nan_message(loss: float, step: int, advice: str) -> str:
    """The "nan-loss" event's text: the step was not applied and the session paused."""
    return (
        f"loss is {loss} at step {step}: the step was not applied and the session paused. "
        f"{advice}; then resume()."
    )


def failure_message(step: int, error: str, *, data_contract: bool) -> str:
    """The "error" event's text for a step that raised: not applied, its batch skipped,
    and how to go on (a data problem cannot be fixed on a live session)."""
    hint = (
        "Fix the data (it cannot be changed on a live session: build a new Session)"
        if data_contract
        else "Fix the cause, then update(...) and/or resume()"
    )
    return (
        f"step {step} failed: {error}. The step was not applied and its batch is skipped. {hint}."
    )


__all__ = [
    "CannotHalve",
    "failure_message",
    "first_line",
    "halved_for_oom",
    "nan_message",
    "oom_message",
    "oom_queued_text",
    "oom_refused_message",
]
