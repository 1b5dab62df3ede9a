"""The Session's data stream: cycles epochs, knows its position, rebuilds its loader.

From a `Dataset`, the stream builds `DataLoader(batch_size=micro_batch, drop_last=True,
num_workers, pin_memory, persistent_workers=num_workers > 0)` over a resumable sampler:
the epoch's order is `DistributedSampler(dataset, num_replicas=world_size, rank=rank,
shuffle=True, seed=seed)` with `set_epoch(epoch)` (no process group needed), and the
stream starts `offset` samples into it. So the position `(epoch, offset)` is all a
checkpoint needs, and a loader rebuilt with another micro_batch or num_workers continues
with exactly the next samples.

A user's `DataLoader` is used as is; its position counts batches, and resuming skips
that many batches of the epoch (exact only when the loader's order is reproducible,
e.g. `shuffle=False` or a seeded `generator`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, default_collate


@dataclass(frozen=True)
class DataPosition:
    epoch: int
    offset: int  # samples (dataset) or batches (user DataLoader) consumed in this epoch


class ResumableSampler(Sampler[int]):
    """The DistributedSampler order of `epoch`, starting `offset` samples in."""

    def __init__(self, dataset: Dataset[Any], *, rank: int, world_size: int, seed: int) -> None:
        self.base = DistributedSampler(
            dataset,
            num_replicas=world_size,
            rank=rank,
            shuffle=True,
            seed=seed,  # type: ignore[arg-type]
        )
        self.epoch = 0
        self.offset = 0

    def __iter__(self) -> Iterator[int]:
        self.base.set_epoch(self.epoch)
        return iter(list(self.base)[self.offset :])

    def __len__(self) -> int:
        return max(0, len(self.base) - self.offset)


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (1 if none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, (list, tuple)) and batch:
        return batch_size_of(batch[0])
    if isinstance(batch, dict) and batch:
        return batch_size_of(next(iter(batch.values())))
    return 1


def _unmoved(batch: Any) -> Any:
    return batch


def move_to(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to(b, device, non_blocking) for b in batch)
    if isinstance(batch, dict):
        return {k: move_to(v, device, non_blocking) for k, v in batch.items()}
    return batch


def split_batch(batch: Any, parts: int) -> list[Any]:
    """Split every tensor of a batch along dim 0 into `parts` pieces (for OOM retries)."""
    if isinstance(batch, torch.Tensor):
        return list(batch.tensor_split(parts, dim=0))
    if isinstance(batch, (list, tuple)):
        pieces = [split_batch(b, parts) for b in batch]
        return [type(batch)(p[i] for p in pieces) for i in range(parts)]
    if isinstance(batch, dict):
        pieces_d = {k: split_batch(v, parts) for k, v in batch.items()}
        return [{k: v[i] for k, v in pieces_d.items()} for i in range(parts)]
    return [batch] * parts


class DataStream:
    """Endless micro-batches on `device`; see the module docstring."""

    def __init__(
        self,
        source: Dataset[Any] | DataLoader[Any],
        *,
        micro_batch: int,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 0,
        device: torch.device | str = "cpu",
        rank: int = 0,
        world_size: int = 1,
        position: DataPosition | None = None,
    ) -> None:
        self.source = source
        self.device = torch.device(device)
        self.micro_batch = micro_batch
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.seed = seed
        self.rank, self.world_size = rank, world_size
        self.user_loader = isinstance(source, DataLoader)
        pos = position or DataPosition(0, 0)
        self.epoch, self.offset = pos.epoch, pos.offset
        self._pending: deque[tuple[Any, int]] = deque()  # (batch on device, samples)
        self._pending_count = 0
        self._it: Iterator[Any] | None = None
        self._skip = 0
        self._closed = False
        # Copies to the GPU never make the host wait for the device: from pinned memory they
        # are asynchronous; from pageable memory CUDA stages the batch at once and queues the
        # copy (a blocking copy would wait for the stream, a host-device sync per batch).
        self._non_blocking = self.device.type == "cuda"
        # the loader this stream builds collates on the CPU: nothing to move for a CPU session
        self._move: Callable[[Any], Any] = (
            _unmoved
            if self.device.type == "cpu" and not self.user_loader
            else lambda batch: move_to(batch, self.device, self._non_blocking)
        )
        if self.user_loader:
            self.loader: DataLoader[Any] = source  # type: ignore[assignment]
            self._sampler: ResumableSampler | None = None
            self._skip = self.offset
        else:
            if not hasattr(source, "__len__") or len(source) == 0:  # type: ignore[arg-type]
                raise ValueError("data: the dataset must have a length > 0 (a map-style Dataset)")
            self._sampler = ResumableSampler(source, rank=rank, world_size=world_size, seed=seed)
            per_rank = len(self._sampler.base)
            if per_rank < micro_batch:
                raise ValueError(
                    f"micro_batch={micro_batch}: larger than the {per_rank} samples this rank "
                    "sees per epoch"
                )
            self.loader = DataLoader(
                source,
                batch_size=micro_batch,
                sampler=self._sampler,
                drop_last=True,
                num_workers=num_workers,
                pin_memory=bool(pin_memory) and torch.cuda.is_available(),
                persistent_workers=num_workers > 0,
                generator=torch.Generator().manual_seed(seed),
            )

    # ------------------------------------------------------------------ reading
    @property
    def position(self) -> DataPosition:
        """Where the next batch comes from (pending retry batches count as unread)."""
        return DataPosition(self.epoch, self.offset - self._pending_count)

    def start(self) -> None:
        """Create the iterator now (starts loader workers), so failures surface here."""
        if self._it is None:
            self._open()

    def _open(self) -> None:
        if self._sampler is not None:
            self._sampler.epoch, self._sampler.offset = self.epoch, self.offset
        self._it = iter(self.loader)
        while self._skip > 0:  # user DataLoader resumed mid-epoch: skip consumed batches
            next(self._it)
            self._skip -= 1

    def next(self) -> Any:
        if self._pending:
            batch, n = self._pending.popleft()
            self._pending_count -= n
            return batch
        empty_epochs = 0
        while True:
            if self._it is None:
                self._open()
            assert self._it is not None
            try:
                batch = next(self._it)
            except StopIteration:
                empty_epochs += 1
                if empty_epochs > 1:
                    raise ValueError("data: the data loader yields no batches") from None
                self.epoch += 1
                self.offset = 0
                self._it = None
                continue
            self.offset += 1 if self.user_loader else batch_size_of(batch)
            return self._move(batch)

    def push_front(self, batches: list[Any]) -> None:
        """Put batches back (already on device) to be read next, in order."""
        for batch in reversed(batches):
            n = 1 if self.user_loader else batch_size_of(batch)
            self._pending.appendleft((batch, n))
            self._pending_count += n

    def requeue_split(self, batches: list[Any], parts: int) -> None:
        """Put `batches` back in front of the pending ones, and split all of them into
        `parts` pieces each (an out-of-memory retry with a smaller micro-batch)."""
        queued = [*batches, *(b for b, _ in self._pending)]
        self._pending.clear()
        self._pending_count = 0
        self.push_front([piece for b in queued for piece in split_batch(b, parts)])

    def peek(self) -> Any:
        """The next batch without consuming it (a user DataLoader's batch is read and
        put back; from a Dataset, the next `micro_batch` samples are collated directly,
        leaving the loader untouched)."""
        if self.user_loader or self._pending:
            batch = self.next()
            self.push_front([batch])
            return batch
        assert self._sampler is not None
        self._sampler.base.set_epoch(self.epoch)
        order = list(self._sampler.base)
        idx = order[self.offset : self.offset + self.micro_batch]
        if len(idx) < self.micro_batch:  # the epoch ends: the loader would start the next
            self._sampler.base.set_epoch(self.epoch + 1)
            idx = list(self._sampler.base)[: self.micro_batch]
        batch = default_collate([self.source[i] for i in idx])  # type: ignore[index]
        return move_to(batch, self.device, self._non_blocking)

    # ------------------------------------------------------------------ changing
    def rebuilt(
        self, *, micro_batch: int, num_workers: int, pin_memory: bool, seed: int
    ) -> DataStream:
        """A new stream with these settings at this stream's position (pending batches
        carried). Raises on failure; this stream is untouched either way."""
        if self.user_loader:
            raise ValueError(
                "data: is a DataLoader you built; micro_batch, num_workers and pin_memory "
                "are its own settings (pass a Dataset to let the Session build the loader)"
            )
        new = DataStream(
            self.source,
            micro_batch=micro_batch,
            num_workers=num_workers,
            pin_memory=pin_memory,
            seed=seed,
            device=self.device,
            rank=self.rank,
            world_size=self.world_size,
            position=DataPosition(self.epoch, self.offset),
        )
        new._pending = deque(self._pending)
        new._pending_count = self._pending_count
        try:
            new.start()
        except BaseException:
            new.close()
            raise
        return new

    def close(self) -> None:
        """Shut loader workers down (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for it in (self._it, getattr(self.loader, "_iterator", None)):
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
        self._it = None
        if not self.user_loader and getattr(self.loader, "_iterator", None) is not None:
            self.loader._iterator = None
        self._pending.clear()
        self._pending_count = 0
