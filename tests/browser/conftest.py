"""Browser-test harness: a private JupyterLab server and a headless Chromium page.

The server runs from this venv on 127.0.0.1 with a random free port and a random token,
rooted in a temporary copy of notebooks/ (tests never write into the repository), with
its own settings, workspaces and runtime directories. Playwright drives the system
Chromium (/usr/bin/chromium); no browser is ever downloaded. Teardown shuts the kernels
down through the REST API, stops the server, and kills any process it left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@dataclass(frozen=True)
class Lab:
    base_url: str  # http://127.0.0.1:PORT
    token: str
    root_dir: Path  # the temporary copy of notebooks/
    log_path: Path

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base_url}{path}{sep}token={self.token}"

    def api(self, path: str, method: str = "GET") -> object:
        req = urllib.request.Request(
            f"{self.base_url}{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_lab_settings(settings_dir: Path) -> None:
    """No news fetching or update checks (the test machine has no internet)."""
    notif = settings_dir / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notif.parent.mkdir(parents=True, exist_ok=True)
    notif.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))


def _wait_ready(lab: Lab, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{lab.log_tail()}")
        try:
            lab.api("/api/status")
            return
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.25)
    raise RuntimeError(
        f"jupyter lab did not answer /api/status in {timeout_s} s:\n{lab.log_tail()}"
    )


def _stop(lab: Lab, proc: subprocess.Popen[bytes]) -> None:
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    try:
        kernels = lab.api("/api/kernels")
        for k in kernels if isinstance(kernels, list) else []:
            with contextlib.suppress(urllib.error.URLError, OSError):
                lab.api(f"/api/kernels/{k['id']}", method="DELETE")
    except (urllib.error.URLError, OSError):
        pass
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    # kernels run in their own sessions; kill any the server did not take down
    for child in descendants:
        try:
            if child.is_running():
                child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(descendants, timeout=5)


# module scope: the server, its kernels and Chromium end with the browser tests rather than
# running (and taking CPU) beside the rest of the suite
@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    base = tmp_path_factory.mktemp("lab")
    root = base / "notebooks"
    shutil.copytree(REPO / "notebooks", root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    settings = base / "settings"
    _write_lab_settings(settings)
    (base / "runtime").mkdir()
    (base / "workspaces").mkdir()
    token = secrets.token_hex(16)
    port = _free_port()
    log_path = base / "lab.log"
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        MPLBACKEND="Agg",
        JUPYTER_RUNTIME_DIR=str(base / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"),
    )
    jupyter = Path(sys.executable).parent / "jupyter"
    cmd = [
        str(jupyter),
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={settings}",
        f"--LabApp.workspaces_dir={base / 'workspaces'}",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
        "--ServerApp.open_browser=False",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # CI containers often run as root
    log = log_path.open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    info = Lab(base_url=f"http://127.0.0.1:{port}", token=token, root_dir=root, log_path=log_path)
    try:
        _wait_ready(info, proc, timeout_s=90)
        yield info
    finally:
        _stop(info, proc)
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), f"{CHROMIUM} is missing; run `make browser-deps`"
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1400, "height": 1200})  # type: ignore[attr-defined]
    pg = context.new_page()
    try:
        yield pg
    finally:
        context.close()


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
