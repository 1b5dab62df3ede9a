"""The start notebook in a real JupyterLab, driven by headless Chromium.

Runs every cell through the menu, checks that the three panels render, starts training
from the page, changes accumulation in the page and waits until the running session's
own config and a step record with that change come back into the page; types garbage
into a field and checks the message beside it. Saves screenshots to tests/artifacts/.
"""

from __future__ import annotations

import re
from pathlib import Path

NOTEBOOK = "00_start_here.ipynb"
TIMEOUT_MS = 120_000


def _menu(page, top: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{top}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{item}$")).click()


def _shot(page, artifacts: Path, name: str) -> None:
    page.screenshot(path=str(artifacts / name), full_page=False)


def test_start_notebook_panels_render_and_react(lab, page, artifacts: Path) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(lab.url(f"/lab/tree/{NOTEBOOK}"))
    page.locator(".jp-NotebookPanel").first.wait_for()
    # the kernel is up when the status bar says so
    page.locator(".jp-StatusBar-TextItem", has_text="Idle").first.wait_for()
    page.locator(".jp-NotebookPanel").first.click()
    page.keyboard.press("Control+b")  # collapse the file browser: more room for the panels
    try:
        _menu(page, "Run", "Run All Cells")

        # ---- the panels render (widget DOM with known classes and text)
        dashboard = page.locator(".wb-dashboard")
        dashboard.wait_for()
        for title in ("Training", "Memory estimator", "Hardware monitor"):
            assert dashboard.locator(".lm-TabBar-tabLabel", has_text=title).count() == 1
        status = page.locator(".wb-train-status")
        status.wait_for()
        assert "grad_accum=1" in status.inner_text()
        chart = page.locator("img.wb-train-chart")
        chart.wait_for()
        assert chart.evaluate("img => img.naturalWidth") > 100
        # the widget view is shown, not the static PNG fallback next to it
        assert page.locator(".jp-OutputArea-output img:not(.widget-image)").count() == 0

        # ---- start training from the page, then change accumulation while it runs
        page.locator(".wb-train-btn-start").click()
        page.wait_for_function(
            "() => document.querySelector('.wb-train-status').innerText.startsWith('running')"
        )
        accum = page.locator(".wb-train-grad-accum input")
        accum.fill("8")
        accum.press("Enter")
        page.wait_for_function(
            "() => document.querySelector('.wb-train-message').innerText"
            ".includes('grad_accum=8 queued')"
        )
        # the running session applied it: its config and a step record with the change
        page.wait_for_function(
            "() => { const t = document.querySelector('.wb-train-status').innerText;"
            " return t.includes('grad_accum=8') && /last change at step \\d+: .*grad_accum=8/"
            ".test(t); }"
        )

        dashboard.evaluate("el => el.scrollIntoView()")  # the panel at the top of the view
        # a few more steps on the charts: a condition, not a fixed sleep
        page.wait_for_function(
            "() => { const t = document.querySelector('.wb-train-status').innerText;"
            " const now = t.match(/step (\\d+) ·/), ch = t.match(/last change at step (\\d+)/);"
            " return now && ch && Number(now[1]) >= Number(ch[1]) + 2; }"
        )
        # the charts redraw within their drawing budget (up to a few seconds under load):
        # wait for the next redraw so the picture shows the steps the status line names
        drawn = chart.evaluate("img => img.src")
        page.wait_for_function(
            "src => document.querySelector('img.wb-train-chart').src != src", arg=drawn
        )
        dashboard.screenshot(path=str(artifacts / "dashboard.png"))  # the whole panel

        # ---- bad input in the page: a message beside the field, no traceback
        mb = page.locator(".wb-train-micro-batch input")
        mb.fill("abc")
        mb.press("Enter")
        err = page.locator(".wb-train-micro-batch-error")
        page.wait_for_function(
            "() => document.querySelector('.wb-train-micro-batch-error').innerText"
            ".includes(\"micro-batch: 'abc' is not a whole number\")"
        )
        page.wait_for_function(
            "() => document.querySelector('.wb-train-message').innerText.includes('not applied')"
        )
        assert page.locator(".jp-OutputArea-output[data-mime-type*='error']").count() == 0
        assert "micro_batch=8" in page.locator(".wb-train-status").inner_text()
        _shot(page, artifacts, "lab_training.png")

        # ---- the other tabs
        dashboard.locator(".lm-TabBar-tabLabel", has_text="Memory estimator").click()
        summary = page.locator(".wb-est-summary")
        summary.wait_for()
        assert "peak of a step per GPU" in summary.inner_text()
        assert page.locator("img.wb-est-chart").evaluate("img => img.naturalWidth") > 100
        _shot(page, artifacts, "lab_estimator.png")
        dashboard.locator(".lm-TabBar-tabLabel", has_text="Hardware monitor").click()
        header = page.locator(".wb-monitor-header")
        header.wait_for()
        assert re.search(
            r"NVML: GPU 0|No NVIDIA GPU: showing host CPU and memory", header.inner_text()
        )
        _shot(page, artifacts, "lab_monitor.png")

        dashboard.locator(".lm-TabBar-tabLabel", has_text="Training").click()
        page.locator(".wb-train-btn-stop").click()
        page.wait_for_function(
            "() => !document.querySelector('.wb-train-status').innerText.startsWith('running')"
        )
        assert err.inner_text()  # still shown
        dashboard.evaluate("el => el.scrollIntoView()")
        _shot(page, artifacts, "lab_dashboard.png")
    except Exception:
        _shot(page, artifacts, "lab_failure.png")
        raise
    assert not errors, f"JavaScript errors in the page: {errors}"
