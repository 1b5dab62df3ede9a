"""Which live Session trains which module, and the Sessions still open.

Re-running a notebook cell that builds a new Session on the same module closes the old
one (`take_over`), so two loops never train one module and the old thread does not
linger. A process that ends with a Session still training (a script that never calls
`close()`) stops and closes it at exit: the training thread would otherwise be killed
inside a torch op, and the process abort. Both registries hold their Sessions weakly.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import warnings
import weakref
from typing import Protocol

from torch import nn

from workbench.inputs import shown


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
