"""`History`: a Session's step records in bounded memory.

    session.history[-1]               the newest record
    session.history[-20:]             a list of the newest 20
    session.records_since(n)          records published after the first n (a cursor)
    session.history.total             records published so far (what a cursor counts)

A History is a read-only sequence of `StepRecord`s in step order. The newest `recent`
records are kept at full resolution. Older ones are thinned: they are folded into at most
`buckets` buckets of consecutive steps, and each bucket keeps two records, the ones with
the lowest and the highest loss of its steps (a non-finite loss counts as the highest, so
a spike or a NaN is never thinned away); when the buckets run out, neighbours merge and a
bucket covers twice as many steps. So memory is bounded by `recent + 2 * buckets`
records, however long the run. The whole run, every record, is in the run's log
(`workbench.train.runlog`), on disk.

`len(history)` is the number of records kept; `history.total` the number published, the
count a `records_since` cursor uses. The two are equal until the first record is thinned.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

from workbench.inputs import shown

#: Newest records kept at full resolution (about 2 KB each).
RECENT_RECORDS = 2048
#: Buckets of thinned older records (two records each).
THINNED_BUCKETS = 1024


def _loss_key(record: Any) -> float:
    """Loss for ordering extremes: a non-finite (or missing) loss is the highest."""
    loss = getattr(record, "loss", None)
    if loss is None or not math.isfinite(loss):
        return math.inf
    return float(loss)


class _Bucket:
    """Consecutive thinned records: how many were folded in, and the two kept (the lowest
    and the highest loss), each as (absolute index, record)."""

    __slots__ = ("count", "low", "high")

    def __init__(self) -> None:
        self.count = 0
        self.low: tuple[int, Any] | None = None
        self.high: tuple[int, Any] | None = None

    def add(self, index: int, record: Any) -> None:
        self.count += 1
        key = _loss_key(record)
        if self.low is None or key < _loss_key(self.low[1]):
            self.low = (index, record)
        if self.high is None or key >= _loss_key(self.high[1]):
            self.high = (index, record)

    def merge(self, other: _Bucket) -> None:
        self.count += other.count
        for entry in (other.low, other.high):
            if entry is None:
                continue
            key = _loss_key(entry[1])
            if self.low is None or key < _loss_key(self.low[1]):
                self.low = entry
            if self.high is None or key >= _loss_key(self.high[1]):
                self.high = entry

    def entries(self) -> list[tuple[int, Any]]:
        kept = {e[0]: e for e in (self.low, self.high) if e is not None}
        return [kept[i] for i in sorted(kept)]


class History(Sequence[Any]):
    """Step records in bounded memory (see the module docstring). Appended to by the
    Session's training thread; read from any thread (`since` is the consistent read)."""

    def __init__(
        self,
        records: Iterable[Any] = (),
        *,
        recent: int = RECENT_RECORDS,
        buckets: int = THINNED_BUCKETS,
    ) -> None:
        problems = [
            f"{name}={shown(value)}: must be an integer >= {minimum}"
            for name, value, minimum in (("recent", recent, 1), ("buckets", buckets, 2))
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum
        ]
        if problems:
            raise ValueError("; ".join(problems))
        self.recent_limit = recent
        self.bucket_limit = buckets
        self._recent: deque[Any] = deque()
        self._closed: list[_Bucket] = []  # full buckets, oldest first
        self._open = _Bucket()  # the bucket being filled
        self._stride = 1  # records per bucket
        self._closed_cache: list[tuple[int, Any]] | None = None
        self.total = 0
        for r in records:
            self.append(r)

    # ------------------------------------------------------------------ writing
    def append(self, record: Any) -> None:
        """Add the newest record; the oldest full-resolution one is thinned if needed."""
        self._recent.append(record)
        self.total += 1
        if len(self._recent) > self.recent_limit:
            index = self.total - len(self._recent)  # absolute index of the oldest
            self._thin(index, self._recent.popleft())

    def replace_last(self, record: Any) -> None:
        """Put `record` in the newest record's place (what a trainer tells after its step:
        a logged gradient norm). ValueError when there is none."""
        if not self._recent:
            raise ValueError("history: no record to replace")
        self._recent[-1] = record

    def _thin(self, index: int, record: Any) -> None:
        self._open.add(index, record)
        if self._open.count >= self._stride:
            self._closed.append(self._open)
            self._open = _Bucket()
            self._closed_cache = None
            if len(self._closed) > self.bucket_limit:
                merged = []
                for a, b in itertools.zip_longest(self._closed[::2], self._closed[1::2]):
                    if b is not None:
                        a.merge(b)
                    merged.append(a)
                self._closed = merged
                self._stride *= 2

    # ------------------------------------------------------------------ reading
    @property
    def thinned(self) -> int:
        """Records folded into buckets (only their extremes kept)."""
        return self.total - len(self._recent)

    @property
    def stride(self) -> int:
        """Steps a thinned bucket covers now."""
        return self._stride

    def _thinned_entries(self) -> list[tuple[int, Any]]:
        closed = self._closed_cache
        if closed is None:
            closed = [e for b in self._closed for e in b.entries()]
            self._closed_cache = closed
        return closed + self._open.entries() if self._open.count else closed

    def since(self, n: int) -> list[Any]:
        """Records published after the first `n` that are still kept, in order (all
        full-resolution ones, plus the thinned ones at or after index `n`)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"index={shown(n)}: must be an integer >= 0")
        start = self.total - len(self._recent)
        if n >= start:
            return list(itertools.islice(self._recent, n - start, None))
        older = [r for i, r in self._thinned_entries() if i >= n]
        return older + list(self._recent)

    def __len__(self) -> int:
        if not self.thinned:
            return len(self._recent)
        return len(self._thinned_entries()) + len(self._recent)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if -len(self._recent) <= index < 0:  # the common case: history[-1]
            return self._recent[index]
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"history index {index} out of range ({n} records kept)")
        older = n - len(self._recent)
        if i >= older:
            return self._recent[i - older]
        return self._thinned_entries()[i][1]

    def __iter__(self) -> Iterator[Any]:
        if self.thinned:
            yield from (r for _, r in self._thinned_entries())
        yield from list(self._recent)

    def __repr__(self) -> str:
        return (
            f"History({self.total} records: {len(self._recent)} newest at full resolution, "
            f"{self.thinned} older thinned to {len(self) - len(self._recent)})"
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, Sequence)) and not isinstance(other, (str, bytes)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def to_dicts(self) -> list[dict[str, Any]]:
        """Every kept record as `to_dict()` (for JSON, pandas)."""
        return [r.to_dict() for r in self]


class Recent(Sequence[Any]):
    """The newest `limit` items (a Session's events), with the same cursor as History:
    `total` counts every item appended, `since(n)` returns those after the first n still
    kept."""

    def __init__(self, limit: int = 10_000) -> None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit={shown(limit)}: must be an integer >= 1")
        self._items: deque[Any] = deque(maxlen=limit)
        self.total = 0

    def append(self, item: Any) -> None:
        self._items.append(item)
        self.total += 1

    def since(self, n: int) -> list[Any]:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"index={shown(n)}: must be an integer >= 0")
        start = self.total - len(self._items)
        return list(itertools.islice(self._items, max(0, n - start), None))

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return list(self._items)[index]
        return self._items[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._items))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, Sequence)) and not isinstance(other, (str, bytes)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Recent({len(self._items)} of {self.total} kept)"
