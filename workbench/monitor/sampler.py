"""Background sampler: one daemon thread per `Sampler`, a bounded ring buffer of samples.

    with Sampler(interval=0.5) as s:
        ...                       # train
        s.latest(), s.history()   # newest sample, all kept samples

Several samplers may run at once; each owns its NVML adapter and host reader (no
module-level state). `close()` stops and joins the thread and shuts NVML down. The thread
holds only a weak reference to its `Sampler`, so a sampler that is dropped without
`close()` (a notebook cell re-run) is garbage-collected and its thread ends by itself.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
import weakref
from collections import deque
from typing import Any

from workbench.inputs import shown
from workbench.monitor.host import HostReader
from workbench.monitor.nvml import NvmlAdapter, NvmlUnavailable
from workbench.monitor.types import SOURCE_HOST, SOURCE_NVML, Sample

DEFAULT_WINDOW_SECONDS = 600.0  # default capacity keeps about ten minutes of samples
MIN_INTERVAL_SECONDS = 0.01  # one sample costs ~0.5 ms of CPU; faster would busy a core
_ids = itertools.count(1)  # thread names only; carries no state between samplers


def _check_interval(interval: Any) -> float:
    ok = (
        isinstance(interval, (int, float))
        and not isinstance(interval, bool)
        and math.isfinite(interval)
        and interval >= MIN_INTERVAL_SECONDS
    )
    if not ok:
        raise ValueError(
            f"interval={shown(interval)}: must be a finite number of seconds > 0 and >= "
            f"{MIN_INTERVAL_SECONDS} (e.g. 0.5)"
        )
    return float(interval)


def _check_capacity(capacity: Any, interval: float) -> int:
    if capacity is None:
        return max(1, math.ceil(DEFAULT_WINDOW_SECONDS / interval))
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(
            f"capacity={shown(capacity)}: must be an integer >= 1 (samples kept) or None for "
            f"about {DEFAULT_WINDOW_SECONDS:.0f} s of samples"
        )
    return capacity


class Sampler:
    """Samples GPUs (NVML) or, without an NVIDIA driver, the host, every `interval` s.

    `backend`: an object with the pynvml functions (default: the real `pynvml` module);
    tests pass a fake that replays recorded values. `source` is "nvml" or "host";
    `reason` says why NVML is not used (None when it is).
    """

    def __init__(
        self, interval: float = 0.5, capacity: int | None = None, backend: Any | None = None
    ) -> None:
        self._interval = _check_interval(interval)
        self._capacity = _check_capacity(capacity, self._interval)
        self._buffer: deque[Sample] = deque(maxlen=self._capacity)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._thread_cpu_seconds = 0.0
        self._samples_taken = 0
        self.last_error: str | None = None  # last unexpected failure inside the thread

        self._host = HostReader()
        self._nvml: NvmlAdapter | None = NvmlAdapter(backend)
        self._reason: str | None = None
        try:
            self._nvml.open()
        except NvmlUnavailable as exc:
            self._nvml.close()
            self._nvml = None
            self._reason = exc.reason
        self._source = SOURCE_NVML if self._nvml is not None else SOURCE_HOST

        # stops the thread and releases NVML when the sampler is closed or collected
        self._release = weakref.finalize(self, _release, self._stop, self._nvml)
        self._thread = threading.Thread(
            target=_run,
            args=(weakref.ref(self), self._stop, self._interval),
            name=f"workbench-sampler-{next(_ids)}",
            daemon=True,
        )
        self._thread.start()

    # ------------------------------------------------------------------ info
    @property
    def interval(self) -> float:
        return self._interval

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def source(self) -> str:
        """Either "nvml" when GPUs are read through NVML, "host" for CPU/memory only."""
        return self._source

    @property
    def reason(self) -> str | None:
        """Why NVML is not used (e.g. "no NVIDIA driver found ..."), None when it is."""
        return self._reason

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def thread_cpu_seconds(self) -> float:
        """CPU time the sampling thread itself has used (time.thread_time inside it)."""
        return self._thread_cpu_seconds

    @property
    def samples_taken(self) -> int:
        """Samples taken since start (including those the ring buffer dropped)."""
        return self._samples_taken

    # ------------------------------------------------------------------ data
    def sample_now(self) -> Sample:
        """Take one sample on the calling thread (does not store it)."""
        gpus = self._nvml.read() if self._nvml is not None else ()
        h = self._host.read()
        return Sample(
            time=time.time(),
            source=self._source,
            gpus=gpus,
            cpu_util_percent=h.cpu_util_percent,
            process_cpu_percent=h.process_cpu_percent,
            process_rss_bytes=h.process_rss_bytes,
            system_memory_used_bytes=h.system_memory_used_bytes,
            system_memory_total_bytes=h.system_memory_total_bytes,
            reason=self._reason,
        )

    def latest(self) -> Sample | None:
        """The newest sample, or None before the first one."""
        with self._lock:
            return self._buffer[-1] if self._buffer else None

    def history(self, since: float | None = None) -> list[Sample]:
        """Kept samples, oldest first; with `since`, only those taken after that time."""
        if since is not None and (
            isinstance(since, bool) or not isinstance(since, (int, float)) or math.isnan(since)
        ):
            raise ValueError(f"since={shown(since)}: must be a time.time() value or None")
        with self._lock:
            items = list(self._buffer)
        if since is None:
            return items
        return [s for s in items if s.time > since]

    # ------------------------------------------------------------------ thread
    def _tick(self) -> None:
        """Take one sample into the buffer (runs on the sampling thread)."""
        t0 = time.thread_time()
        try:
            sample = self.sample_now()
        except Exception as exc:  # never let the thread die; say what happened
            self.last_error = f"{type(exc).__name__}: {exc}"
        else:
            with self._lock:
                self._buffer.append(sample)
                self._samples_taken += 1
        self._thread_cpu_seconds += time.thread_time() - t0

    def close(self) -> None:
        """Stop and join the thread, release NVML (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._release()

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running"
        extra = f", reason={self._reason!r}" if self._reason else ""
        return (
            f"Sampler(interval={self._interval}, capacity={self._capacity}, "
            f"source={self._source!r}{extra}, {state})"
        )


def _run(ref: weakref.ReferenceType[Sampler], stop: threading.Event, interval: float) -> None:
    """The sampling loop. It holds its sampler only while taking a sample, so an unused
    sampler can be collected; the collection sets `stop` (see `_release`)."""
    next_at = time.monotonic()
    while not stop.is_set():
        sampler = ref()
        if sampler is None:
            return
        sampler._tick()
        del sampler
        next_at += interval
        delay = next_at - time.monotonic()
        if delay < 0:  # fell behind (e.g. a suspended process): restart the cadence
            next_at = time.monotonic()
            delay = 0.0
        stop.wait(delay)


def _release(stop: threading.Event, nvml: NvmlAdapter | None) -> None:
    """Stop the loop and shut NVML down (runs once: on close() or on collection)."""
    stop.set()
    if nvml is not None:
        nvml.close()
