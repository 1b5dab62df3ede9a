"""The estimator panel's dry run in a real JupyterLab: the picture of the step's memory
shows below the summary, drawn by headless Chromium (the system one; nothing downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

from playwright.sync_api import expect

NOTEBOOK = "estimator_picture.ipynb"
TIMEOUT_MS = 180_000
CELL = (
    "from workbench.ui import EstimatorPanel\n"
    "panel = EstimatorPanel(layers='2', hidden='64', heads='4', seq_len='64', vocab='256',\n"
    "                       micro_batch='2', gpus='1', zero_stage=0, checkpointing='none')\n"
    "panel"
)


def _notebook(path: Path) -> None:
    cell = {
        "cell_type": "code",
        "execution_count": None,
        "id": "panel",
        "metadata": {},
        "outputs": [],
        "source": CELL,
    }
    nb = {
        "cells": [cell],
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


def test_the_dry_run_draws_the_steps_memory_in_the_panel(lab, page, artifacts: Path) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_default_timeout(TIMEOUT_MS)
    _notebook(lab.root_dir / NOTEBOOK)
    page.goto(lab.url(f"/lab/tree/{NOTEBOOK}"))
    page.locator(".jp-NotebookPanel").first.wait_for()
    page.locator(".jp-StatusBar-TextItem", has_text="Idle").first.wait_for()
    page.locator(".jp-NotebookPanel .jp-Cell").first.click()
    try:
        page.keyboard.press("Shift+Enter")
        summary = page.locator(".wb-est-summary")
        summary.wait_for()
        picture = page.locator("img.wb-est-dryrun-picture")
        assert not picture.is_visible()  # nothing drawn before a dry run
        page.locator(".wb-est-dryrun").click()
        page.wait_for_function(
            "() => { const i = document.querySelector('img.wb-est-dryrun-picture');"
            " return i && i.offsetParent !== null && i.naturalWidth > 300; }"
        )
        # the picture and the summary are two widget updates: the summary's may land a
        # moment after the picture's (seen under load), so wait for it as for the picture
        expect(summary).to_contain_text("peak of a step, dry run", timeout=TIMEOUT_MS)
        # below the summary and the button, in the same column
        top = summary.bounding_box()
        box = picture.bounding_box()
        assert top is not None and box is not None and box["y"] > top["y"] + top["height"]
        picture.screenshot(path=str(artifacts / "lab_estimator_dry_run_picture.png"))
    except Exception:
        page.screenshot(path=str(artifacts / "lab_estimator_picture_failure.png"))
        raise
    assert not errors, f"JavaScript errors in the page: {errors}"
