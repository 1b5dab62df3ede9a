"""Which live Session trains which module, and the Sessions still open.

Re-running a notebook cell that builds a new Session on the same module closes the old
one (`take_over`), so two loops never train one module and the old thread does not
linger. A process that ends with a Session still training (a script that never calls
`close()`) stops and closes it at exit: the training thread would otherwise be killed
inside a torch op, and the process abort. Both registries hold their Sessions weakly (a
Session collected without `close()` gives your module its weights, and writes its run log
to the end, through its own finalizer, `when_dropped`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from torch import nn

from workbench.inputs import shown

if TYPE_CHECKING:
    from workbench.train.runtime import Runtime
    from workbench.train.session_log import SessionLog

log = logging.getLogger("workbench")


class Closable(Protocol):
    """What the registries use of a Session."""

    @property
    def state(self) -> str: ...

    def close(self) -> None: ...


_OWNERS: weakref.WeakKeyDictionary[nn.Module, weakref.ReferenceType[Closable]] = (
    weakref.WeakKeyDictionary()
)
_OPEN: weakref.WeakSet[Closable] = weakref.WeakSet()


@atexit.register
def _close_open_sessions() -> None:
    for session in list(_OPEN):
        with contextlib.suppress(Exception):
            session.close()


def take_over(module: nn.Module) -> None:
    """Close the open Session that trains `module`, if any, with a warning (shown at the
    line that built the new Session)."""
    previous_ref = _OWNERS.get(module)
    previous = previous_ref() if previous_ref is not None else None
    if previous is not None and previous.state != "closed":
        warnings.warn(
            f"closing {shown(previous)}: its model is now trained by a new Session",
            stacklevel=_user_frame(),
        )
        previous.close()


def _user_frame() -> int:
    """The `stacklevel` of the first caller outside the workbench package (the line that
    built the new Session), counted from the function that calls this one."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = sys._getframe(2), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def register(module: nn.Module, session: Closable) -> None:
    """`session` trains `module` and is open."""
    _OWNERS[module] = weakref.ref(session)
    _OPEN.add(session)


def closed(session: Closable) -> None:
    """`session` is closed: nothing to close at exit."""
    _OPEN.discard(session)


def when_dropped(session: Any, rt: Runtime, runlog: SessionLog) -> weakref.finalize:
    """A finalizer for a Session collected without `close()` (no loop ran: a loop keeps it
    alive): its runtime's `close()`, the trained weights into your module (from an
    engine's copy), then the loader workers and backend released; then its run log
    written and its writer thread ended. It holds the runtime and the log, which must hold
    the session weakly only (`weak_method`, `is_closed`); at exit the open Sessions are
    closed by `_close_open_sessions` instead. `close()` detaches it."""
    finalizer = weakref.finalize(session, _release_dropped, rt, runlog, str(session.id))
    finalizer.atexit = False
    return finalizer


def _release_dropped(rt: Runtime, runlog: SessionLog, session_id: str) -> None:
    """(Runs in whichever thread the garbage collector ran in; it takes no lock of any
    Session.) Several ranks keep their runtimes: the copy back is a collective, which one
    rank's garbage collection must not start."""
    try:
        if rt.world_size == 1:
            rt.close()
    except Exception as exc:
        log.error(
            "workbench session %s, dropped without close(): could not copy the trained "
            "weights into your module: %s: %s",
            session_id,
            type(exc).__name__,
            exc,
        )
    finally:
        runlog.close()  # every record and event written, the writer thread ended


def is_closed(session: Closable) -> Callable[[], bool]:
    """Whether `session` is closed (or collected), holding it weakly (for its run log,
    which its finalizer holds)."""
    ref = weakref.ref(session)

    def closed() -> bool:
        held = ref()
        return held is None or held.state == "closed"

    return closed


def weak_method(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method`, holding its object weakly (a call after it is gone does nothing)."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = ref()
        return None if bound is None else bound(*args, **kwargs)

    return call
