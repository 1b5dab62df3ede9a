"""gpu_check's harness: checks and their summary, the run's results file (written after
every section and on SIGTERM), a section's time limit (its watchdog, the clean-up of the
processes it started), and `--smoke-stall`'s section. The sections themselves are in
gpu_check.py, gpu_newest.py and gpu_syncs.py; gpu_check's docstring says how a run goes.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from _common import machine_info

GRACE_SECONDS = 30.0  # after a limit: how long a stopped section may take to return
EXIT_OK, EXIT_FAILED, EXIT_PARTIAL, EXIT_SIGTERM = 0, 1, 3, 143
PASSED, FAILED, NOT_RUN = "passed", "failed", "not run"
RESULT: dict[str, Any] = {"sections": {}}
CHECKS: list[tuple[str, str, str, str]] = []  # (section, check, status, detail)


def check(section: str, name: str, ok: bool, detail: Any = "") -> bool:
    """Record a check that ran: passed or failed."""
    status = PASSED if ok else FAILED
    CHECKS.append((section, name, status, str(detail)))
    print(f"  [{'ok' if ok else 'FAILED'}] {name}" + (f": {detail}" if detail != "" else ""))
    return bool(ok)


def not_run(section: str, name: str, reason: str) -> None:
    """Record a check that could not run here (never counted as passed)."""
    CHECKS.append((section, name, NOT_RUN, reason))
    print(f"  [NOT RUN] {name}: {reason}")


def summary(checks: Sequence[tuple[str, str, str, str]]) -> dict[str, Any]:
    """Counts by status, the sections by status, and one line that says all three."""
    counts = {s: sum(1 for c in checks if c[2] == s) for s in (PASSED, FAILED, NOT_RUN)}
    sections: dict[str, list[str]] = {}
    for name, sec in RESULT["sections"].items():
        sections.setdefault(str(sec.get("status")), []).append(name)
    total = len(checks)
    if counts[FAILED] == 0 and counts[NOT_RUN] == 0 and total:
        line = f"all {total} checks passed"
    else:
        line = (
            f"{counts[PASSED]} passed, {counts[FAILED]} failed, {counts[NOT_RUN]} not run "
            f"(of {total} checks)"
        )
    bad = {k: v for k, v in sections.items() if k != PASSED}
    if bad:
        line += "; sections " + ", ".join(f"{k}: {', '.join(v)}" for k, v in sorted(bad.items()))
    return {**counts, "total": total, "sections": sections, "line": line}


def exit_status(checks: Sequence[tuple[str, str, str, str]], allow_partial: bool) -> int:
    statuses = {str(s.get("status")) for s in RESULT["sections"].values()}
    if any(c[2] == FAILED for c in checks) or statuses & {FAILED, "timed out", "interrupted"}:
        return EXIT_FAILED
    partial = any(c[2] == NOT_RUN for c in checks) or statuses & {NOT_RUN, "partial"}
    if partial and not allow_partial:
        return EXIT_PARTIAL
    return EXIT_OK


# --------------------------------------------------------------------------- the run
class Run:
    """Where results go and what is running now; shared with the watchdog and the
    SIGTERM watcher threads (under `lock`)."""

    def __init__(self, name: str, path: Path, allow_partial: bool) -> None:
        self.name, self.path, self.allow_partial = name, path, allow_partial
        self.lock = threading.RLock()
        self.current: str | None = None
        self.current_out: dict[str, Any] = {}
        self.current_start = 0.0
        self.pending: list[str] = []  # sections not started yet
        self.fired: str | None = None  # the section whose limit has passed
        self.armed = False  # SIGALRM raises SectionTimeout only while a section runs
        self.children_before: set[int] = set()  # descendants alive as the section began
        self.started = time.monotonic()

    def save(self, *, complete: bool = False) -> Path:
        """Write the results so far (atomically: a reader never sees half a file)."""
        with self.lock:
            checks = list(CHECKS)
            RESULT["checks"] = [
                {"section": s, "check": c, "status": st, "ok": st == PASSED, "detail": d}
                for s, c, st, d in checks
            ]
            RESULT["summary"] = summary(checks)
            RESULT["complete"] = complete
            RESULT["seconds"] = round(time.monotonic() - self.started, 1)
            payload = {
                "benchmark": self.name,
                "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "machine": machine_info(),
                **RESULT,
            }
            text = json.dumps(payload, indent=2, default=str) + "\n"
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, self.path)
            return self.path

    def end_section_early(self, status: str, note: str) -> None:
        """The running section did not finish (SIGTERM, or it never returned from its
        limit): record it with what it had, and the sections after it as not run."""
        with self.lock:
            if self.current is not None:
                try:
                    partial = json.loads(json.dumps(self.current_out, default=str))
                except Exception:  # being written by the main thread right now
                    partial = {}
                partial.update(
                    status=status,
                    note=note,
                    seconds=round(time.monotonic() - self.current_start, 1),
                )
                RESULT["sections"][self.current] = partial
                CHECKS.append((self.current, "section ran to the end", FAILED, note))
            for name in self.pending:
                RESULT["sections"][name] = {"status": NOT_RUN, "note": note}
                CHECKS.append((name, "section ran", NOT_RUN, note))


class SectionTimeout(BaseException):
    """Raised in the main thread when a section's limit passes (a BaseException, so the
    code under test, which catches Exception, does not swallow it)."""


#: a process whose command line holds this is one of Inductor's compile workers: they
#: belong to the whole run (torch.compile in any later section uses them), never to the
#: section that happened to start them
COMPILE_WORKER_MARK = "compile_worker"


def _tree(procs: Sequence[Any]) -> set[int]:
    """The pids of `procs` and of all their descendants."""
    import psutil

    pids: set[int] = set()
    for p in procs:
        pids.add(p.pid)
        with contextlib.suppress(psutil.Error):
            pids.update(c.pid for c in p.children(recursive=True))
    return pids


def descendants() -> list[Any]:
    """Every descendant process of this one (psutil.Process objects)."""
    import psutil

    try:
        return list(psutil.Process().children(recursive=True))
    except psutil.Error:
        return []


def spared_pids(keep: set[int] | frozenset[int] = frozenset()) -> set[int]:
    """The descendants a timed-out section's clean-up must leave alone: those in `keep`
    (alive before the section started: an earlier section's, the run's own) and Inductor's
    compile workers, each with its own descendants."""
    import psutil

    procs = descendants()
    mine = [p for p in procs if p.pid in keep]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if any(COMPILE_WORKER_MARK in part for part in p.cmdline()):
                mine.append(p)
    return _tree(mine)


def kill_children(
    grace: float = 5.0, *, spare: set[int] | frozenset[int] = frozenset()
) -> list[int]:
    """SIGTERM every descendant process of this one (ranks, launchers, loader workers)
    except the pids in `spare`, SIGKILL what is left after `grace` seconds; returns the
    pids ended."""
    import psutil

    procs = [p for p in descendants() if p.pid not in spare]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace)
    return [p.pid for p in procs]


class Watchdog(threading.Thread):
    """A section's time limit. When it passes: the section's child processes are ended
    and SIGALRM interrupts the main thread (SectionTimeout); if the section has still
    not returned `grace` seconds later (stuck in a CUDA or NCCL call), the results are
    written and the run ends."""

    def __init__(self, run: Run, section: str, limit: float, grace: float) -> None:
        super().__init__(name=f"gpu-check-watchdog-{section}", daemon=True)
        self.run_, self.section, self.limit, self.grace = run, section, limit, grace
        self.done = threading.Event()

    def run(self) -> None:
        if self.done.wait(self.limit):
            return
        with self.run_.lock:
            self.run_.fired = self.section
        print(f"\n  [TIMED OUT] {self.section}: past its {self.limit:g} s limit; stopping it")
        spare = spared_pids(self.run_.children_before)
        killed = kill_children(spare=spare)
        self.run_.current_out["killed_child_pids"] = killed
        self.run_.current_out["spared_child_pids"] = sorted(spare)
        if threading.main_thread().ident is not None:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)
        if self.done.wait(self.grace):
            return
        note = (
            f"timed out: past its {self.limit:g} s limit and did not return within "
            f"{self.grace:g} s more; the run was ended"
        )
        self.run_.end_section_early("timed out", note)
        self.run_.save()
        print(f"FAILED [{self.section}] {note}; wrote {self.run_.path}", flush=True)
        os._exit(EXIT_FAILED)


def _on_alarm(run: Run) -> Callable[[int, Any], None]:
    def handler(signum: int, frame: Any) -> None:
        if run.armed and run.fired is not None and run.fired == run.current:
            raise SectionTimeout(run.current)

    return handler


def forked_child_signals(*channel: socket.socket) -> None:
    """In a process forked from this one without exec (a DataLoader worker, a
    multiprocessing child): SIGTERM and SIGALRM back to their defaults and the wakeup file
    descriptor unset, the SIGTERM channel's sockets closed. Else the child inherits them,
    a SIGTERM that ends a timed-out section's worker is written to the parent's channel and
    reads as a SIGTERM to the whole check, and the worker ignores it (the inherited
    handler does nothing) until it is killed."""
    with contextlib.suppress(ValueError, OSError):  # ValueError: not the main thread
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    for sock in channel:
        with contextlib.suppress(OSError):
            sock.close()


def install_sigterm(run: Run) -> None:
    """On SIGTERM write what the run has, end the child processes and exit 143. A thread
    waits on the signal's wakeup file descriptor, so this happens even while the main
    thread is blocked in a CUDA or NCCL call (where a Python handler would not run)."""
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # the watcher acts on it
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    os.register_at_fork(after_in_child=lambda: forked_child_signals(reader, writer))

    def watch() -> None:
        while True:
            data = reader.recv(64)
            if not data or signal.SIGTERM not in data:
                continue
            note = "interrupted by SIGTERM"
            run.end_section_early("interrupted", note)
            RESULT["interrupted"] = {
                "signal": "SIGTERM",
                "section": run.current,
                "at_seconds": round(time.monotonic() - run.started, 1),
            }
            path = run.save()
            kill_children(grace=2.0)
            print(f"\nSIGTERM: results so far written to {path}; exiting", flush=True)
            os._exit(EXIT_SIGTERM)

    threading.Thread(target=watch, name="gpu-check-sigterm", daemon=True).start()
    run.sigterm_channel = (reader, writer)  # type: ignore[attr-defined]  # kept alive


def run_section(
    run: Run,
    name: str,
    fn: Callable[[dict[str, Any]], None],
    *,
    limit: float,
    estimate: float,
    grace: float = GRACE_SECONDS,
) -> dict[str, Any]:
    """Run one section under its time limit; record its status; write the results."""
    print(f"\n== {name} (estimate {estimate:g} s, limit {limit:g} s)", flush=True)
    out: dict[str, Any] = {}
    first_check = len(CHECKS)
    with run.lock:
        run.current, run.current_out, run.current_start = name, out, time.monotonic()
        run.fired = None
        run.children_before = {p.pid for p in descendants()}
        if name in run.pending:
            run.pending.remove(name)
    status: str | None = None
    watchdog = Watchdog(run, name, limit, grace)
    watchdog.start()
    try:
        run.armed = True
        try:
            fn(out)
        finally:
            run.armed = False
    except SectionTimeout:
        status = "timed out"
    except KeyboardInterrupt:
        status = "interrupted"
        check(name, "section ran to the end", False, "KeyboardInterrupt")
    except Exception as exc:
        if run.fired == name:  # the code under test turned the interruption into its own
            status = "timed out"
        else:
            check(name, "section ran to the end", False, f"{type(exc).__name__}: {exc}")
            out["error"] = traceback.format_exc()
            print(out["error"])
    finally:
        watchdog.done.set()
    if run.fired == name and status is None:
        status = "timed out"  # the limit passed as the section returned
    if status == "timed out":
        check(name, f"finished within its {limit:g} s limit", False, "timed out")
    mine = [c for c in CHECKS[first_check:] if c[0] == name]
    if status is None:
        if any(c[2] == FAILED for c in mine):
            status = FAILED
        elif mine and all(c[2] == NOT_RUN for c in mine):
            status = NOT_RUN
        elif any(c[2] == NOT_RUN for c in mine):
            status = "partial"
        else:
            status = PASSED
    out.update(
        status=status,
        seconds=round(time.monotonic() - run.current_start, 1),
        limit_s=limit,
        estimate_s=estimate,
    )
    with run.lock:
        RESULT["sections"][name] = out
        run.current, run.current_out = None, {}
    run.save()
    return out


# --------------------------------------------------------------------------- stall
STALL = "stall"


class StallSection:
    """`--smoke-stall`'s section: it starts a DataLoader with two forked workers, a forked
    multiprocessing child and a stand-in for one of Inductor's compile workers (a process
    with the same mark in its command line), then waits past any limit. Its timeout must
    end the workers and the child, spare the compile worker, and leave the run going (no
    SIGTERM read as the run's own)."""

    def __init__(self) -> None:
        self.compile_worker: subprocess.Popen[bytes] | None = None

    def __call__(self, out: dict[str, Any]) -> None:
        import torch
        from torch.utils.data import DataLoader

        stand_in = f"torch/_inductor/{COMPILE_WORKER_MARK}/__main__.py"
        self.compile_worker = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)", stand_in]
        )
        out["compile_worker_pid"] = self.compile_worker.pid
        data = torch.arange(64.0).reshape(32, 2)
        loader = DataLoader(data, batch_size=1, num_workers=2, multiprocessing_context="fork")
        batches = iter(loader)
        next(batches)
        out["loader_worker_pids"] = [w.pid for w in batches._workers]  # type: ignore[attr-defined]
        # a plain forked child (torch's loader workers set their own C SIGTERM handler;
        # a multiprocessing child keeps the inherited Python one and the wakeup fd)
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(300,))
        child.start()
        out["forked_child_pid"] = child.pid
        while True:
            time.sleep(0.05)

    def close(self) -> None:
        if self.compile_worker is not None:
            alive = self.compile_worker.poll() is None
            RESULT.setdefault("smoke_stall", {})["compile_worker_alive_at_end"] = alive
            self.compile_worker.kill()
            self.compile_worker.wait()
