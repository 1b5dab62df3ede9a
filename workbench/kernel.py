"""Which Python runs this notebook: a clear message when it is not the project's `.venv`.

The common first-run mistake is a notebook opened in a Jupyter from another environment
(a system or conda JupyterLab, an editor's default interpreter): its kernel runs another
Python, which may lack torch or DeepSpeed, or import an older copy of the workbench. When
`import workbench` runs inside a kernel and the package comes from a source checkout that
has the `.venv` that `make lab` creates, `check_kernel()` warns once if the kernel's Python
is not that `.venv`'s, naming both interpreters and the fix. An installed wheel (no
checkout beside the package) or a checkout without `.venv` (a conda environment made from
environment.yml) is never warned about. A kernel that cannot import the workbench at all
fails on its notebook's `import workbench` line. JupyterLab started by `make lab` runs
`.venv`'s kernel; `make kernel` registers that kernel for the user's other Jupyters.

Pure path logic: imports nothing else of the package, costs no import of torch.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

#: the kernelspec `make kernel` registers for every Jupyter of this user (.venv's Python)
KERNEL_DISPLAY_NAME = "workbench (.venv)"

#: the file that marks a source checkout of this project beside the package folder
_CHECKOUT_MARK = "pyproject.toml"


class WrongKernelWarning(UserWarning):
    """The notebook's kernel runs another Python than the project's `.venv`."""


def _same_path(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def wrong_kernel_message(*, prefix: Path, executable: str, package_dir: Path) -> str | None:
    """The message for a kernel whose environment `prefix` is not the checkout's `.venv`.

    `package_dir` is the folder the workbench was imported from; None when it is not a
    source checkout with a `.venv`, or when `prefix` is that `.venv`.
    """
    root = package_dir.parent
    venv = root / ".venv"
    if not (root / _CHECKOUT_MARK).is_file() or not (venv / "bin" / "python").exists():
        return None
    if _same_path(prefix, venv):
        return None
    return (
        f"this notebook's kernel runs {executable}, not the project's {venv / 'bin' / 'python'}, "
        "so it may lack packages the notebooks need or import another copy of them. "
        f"Start JupyterLab with `make lab` in {root}; to keep another Jupyter, run `make kernel` "
        f"there once and pick '{KERNEL_DISPLAY_NAME}' in Kernel > Change Kernel..."
    )


def check_kernel() -> str | None:
    """Warn (once per import) when a kernel runs another Python than the project's `.venv`.

    Only inside a Jupyter kernel (ipykernel imported); scripts and the CLI are not checked.
    Returns the message given, or None.
    """
    if "ipykernel" not in sys.modules:
        return None
    message = wrong_kernel_message(
        prefix=Path(sys.prefix), executable=sys.executable, package_dir=Path(__file__).parent
    )
    if message is not None:
        warnings.warn(message, WrongKernelWarning, stacklevel=3)
    return message
