"""The GPU check script (`benchmarks/gpu_check.py`, run on a lent GPU) keeps working: its
every section runs here in `--cpu-smoke` mode (tiny sizes, CUDA-only checks left out);
results are written after every section and on SIGTERM; a section past its limit is
recorded as timed out and the run goes on; a check that cannot run is "not run", never
counted as passed, and fails the run unless `--allow-partial`; the utilization check is
judged on a steady stretch of readings. Without CUDA the real mode fails loudly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
SECTIONS = {
    "optim8",
    "offload",
    "lora",
    "dryrun",
    "observers",
    "peak",
    "nvml",
    "session",
    "deepspeed",
    "fsdp",
    "oom",
    "ranks",
    "compress",
    "speed",
    "ladder",
    "syncs",
    "anchors",
}


def gpu_check(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def results(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def statuses(result: dict[str, Any]) -> dict[str, str]:
    return {name: s["status"] for name, s in result["sections"].items()}


def test_every_section_runs_in_cpu_smoke_mode(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    done = gpu_check("--cpu-smoke", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = results(out)
    assert result["mode"] == "cpu-smoke" and result["complete"] is True
    assert set(result["sections"]) == SECTIONS
    assert set(statuses(result).values()) == {"passed"}
    assert all("error" not in s for s in result["sections"].values())
    assert result["checks"] and all(c["status"] == "passed" for c in result["checks"])
    assert result["summary"]["line"] == f"all {len(result['checks'])} checks passed"
    assert set(result["plan"]) == SECTIONS
    # the estimates add up past the GPU budget on purpose: the budget cuts the oldest
    assert result["estimated_total_s"] == 603 and result["budget_s"] > 0
    assert list(result["plan"])[:5] == ["optim8", "offload", "lora", "dryrun", "observers"]
    # the peak section's Llama trains without a KV cache, as the dry run's copy does
    llama = [v for v in result["sections"]["peak"].values() if isinstance(v, dict)]
    assert llama and all(row["use_cache"] is False for row in llama)
    assert "about 603 s in all" in done.stdout


def test_sigterm_leaves_the_results_so_far(tmp_path: Path) -> None:
    """The file is there after the first section (written as the run goes), and a SIGTERM
    mid-run writes the rest: the section it interrupted, the ones not run, exit 143. Every
    section is asked for, nvml (a fraction of a second in the smoke) first, so the SIGTERM
    comes after one section rather than after the ten that run before nvml by default."""
    out = tmp_path / "smoke.json"
    order = ["nvml", *(s for s in _script().SECTIONS if s != "nvml")]
    assert set(order) == SECTIONS
    argv = ["--cpu-smoke", "--sections", ",".join(order), "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, "the run ended before the first section was written"
            assert time.monotonic() < deadline, "no results file after the first section"
            try:
                early = results(out)
            except (OSError, ValueError):
                early = {}
            if "nvml" in early.get("sections", {}):
                break
            time.sleep(0.05)
        assert early["complete"] is False
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, stdout[-3000:]
    result = results(out)
    assert result["interrupted"]["signal"] == "SIGTERM"
    seen = statuses(result)
    assert set(seen) == SECTIONS and seen["nvml"] == "passed"
    assert result["complete"] is False
    assert "interrupted" in seen.values() or result["interrupted"]["section"] is None
    assert "not run" in seen.values()
    assert result["summary"]["not run"] >= 1 and "not run" in result["summary"]["line"]


def test_a_section_past_its_limit_is_recorded_as_timed_out_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    out = tmp_path / "smoke.json"
    done = gpu_check(
        "--cpu-smoke", "--sections", "session,oom", "--section-limit", "session=0.05",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:]
    result = results(out)
    assert statuses(result) == {"session": "timed out", "oom": "passed"}
    assert result["sections"]["session"]["limit_s"] == 0.05
    failed = [c for c in result["checks"] if c["status"] == "failed"]
    assert [c["check"] for c in failed] == ["finished within its 0.05 s limit"]
    assert "[TIMED OUT] session" in done.stdout


def test_with_one_gpu_the_two_rank_all_reduce_is_not_run_and_not_passed(tmp_path: Path) -> None:
    """As on a machine with one GPU: the launcher paths and the direct collectives run as
    one rank (said as such: nothing moves between GPUs); the 2-rank all-reduce is recorded
    as not run with why (NCCL needs one GPU per rank), the summary says so, and the run
    fails (exit 3) without --allow-partial (with it, `exit_status` passes the same result:
    `test_a_partial_section_passes_only_with_allow_partial`)."""
    out = tmp_path / "one3.json"
    done = gpu_check("--cpu-smoke", "--sections", "ranks", "--smoke-gpus", "1", "--out", str(out))
    assert done.returncode == 3, done.stdout[-3000:]
    result = results(out)
    checks = {c["check"]: c for c in result["checks"]}
    reduce = checks["gloo all-reduce between 2 ranks (ZeRO-2 gradients)"]
    assert reduce["status"] == "not run" and reduce["ok"] is False
    assert "NCCL needs one GPU per rank, so 2 ranks need 2 GPUs" in reduce["detail"]
    ran = [c["check"] for c in result["checks"] if c["status"] == "passed"]
    assert len(ran) == 3 and all("1 rank(s)" in c for c in ran)
    assert "gloo group of 1 rank(s): all-reduce and broadcast (1 rank: nothing moves" in ran[2]
    assert result["sections"]["ranks"]["collective"]["results"][0]["sum"] == 1.0
    assert statuses(result) == {"ranks": "partial"}
    line = result["summary"]["line"]
    assert line.startswith("3 passed, 0 failed, 1 not run (of 4 checks)"), line
    assert "4 of 4" not in done.stdout and "all 4" not in done.stdout
    assert "NOT RUN [ranks]" in done.stdout


def test_a_partial_section_passes_only_with_allow_partial(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exit status of a run whose section is "partial" (checks passed, one not run, as
    on one GPU): 3 without --allow-partial, 0 with it; a failed check fails it either way."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_harness
    finally:
        sys.path.remove(str(SCRIPT.parent))
    monkeypatch.setattr(gpu_harness, "RESULT", {"sections": {"ranks": {"status": "partial"}}})
    checks = [
        ("ranks", "torchrun launch of 1 rank(s)", gpu_harness.PASSED, ""),
        ("ranks", "gloo all-reduce between 2 ranks", gpu_harness.NOT_RUN, "one GPU"),
    ]
    assert gpu_harness.exit_status(checks, allow_partial=False) == gpu_harness.EXIT_PARTIAL == 3
    assert gpu_harness.exit_status(checks, allow_partial=True) == gpu_harness.EXIT_OK == 0
    failed = [*checks, ("ranks", "a check", gpu_harness.FAILED, "")]
    assert gpu_harness.exit_status(failed, allow_partial=True) == gpu_harness.EXIT_FAILED


def test_the_collective_check_runs_ranks_and_judges_what_they_sum() -> None:
    """The ranks section's direct check (NCCL on a GPU; gloo here, the same code): two
    processes all-reduce and broadcast; a wrong sum, a missing rank or another backend
    fails the judgement, and a backend that cannot start is an error, not a pass."""
    script = _script()
    results, error = script.run_collective(2, "gloo")
    assert error == "" and [r["rank"] for r in results] == [0, 1]
    assert script.judge_collective(results, 2, "gloo")[0]
    assert not script.judge_collective(results, 2, "nccl")[0]
    assert not script.judge_collective(results[:1], 2, "gloo")[0]
    wrong = [dict(results[0], sum=2.0), results[1]]
    assert not script.judge_collective(wrong, 2, "gloo")[0]
    results, error = script.run_collective(1, "no-such-backend", timeout=60)
    assert results == [None] and "rank 0 exited" in error


def test_a_section_that_cannot_run_fails_the_run_unless_allow_partial(tmp_path: Path) -> None:
    """With no budget left no section starts: each is "not run"; exit 3, or 0 with
    --allow-partial (never "passed")."""
    for extra, code in (([], 3), (["--allow-partial"], 0)):
        out = tmp_path / f"partial{code}.json"
        done = gpu_check(
            "--cpu-smoke", "--sections", "nvml,oom", "--budget", "0", "--out", str(out), *extra
        )
        assert done.returncode == code, done.stdout[-3000:]
        result = results(out)
        assert statuses(result) == {"nvml": "not run", "oom": "not run"}
        assert result["summary"]["passed"] == 0 and result["summary"]["not run"] == 2


def _script() -> Any:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return gpu_check


def test_utilization_is_judged_on_a_steady_stretch_of_readings() -> None:
    """Replayed NVML readings: a busy GPU with the odd idle reading passes on the median;
    an idle one fails; too few readings (what sampling over set-up time gave) fail as not
    enough evidence; missing readings are left out."""
    judge = _script().judge_utilization
    assert judge([97.0] * 18 + [0.0, 3.0, None, 99.0, 98.0])[0]
    assert judge([95.0] * 12 + [0.0] * 9)[0]  # mean 54%, median 95%
    assert not judge([2.0] * 25)[0]
    ok, detail = judge([0.0, 5.0, 98.0])
    assert not ok and "need >= 20" in detail
    assert not judge([None] * 30 + [99.0])[0]


def test_utilization_is_sampled_after_training_is_under_way() -> None:
    """The readings start once the background run has stepped twice past where it
    began (no set-up time sampled), and the run is stopped after the window."""
    script = _script()

    class Gpu:
        def __init__(self, util: float) -> None:
            self.util_percent = util

    class Loop:
        gpu_uuid = "GPU-0"

        def __init__(self) -> None:
            self.state, self._step, self.started_at = "idle", 5, None

        @property
        def step(self) -> int:  # two steps a few polls after start()
            if self.state == "running":
                self._step += 1
            return self._step

        def start(self) -> None:
            self.state = "running"

        def stop(self) -> None:
            self.state = "stopped"

    loop = Loop()
    seen_at: list[int] = []

    class Sampler:
        def sample_now(self) -> Any:
            seen_at.append(loop._step)

            class Sample:
                def gpu(self, uuid: str | None) -> Gpu:
                    return Gpu(90.0)

            return Sample()

    ctx = script.Ctx(True)
    ctx.util_window = 0.3
    readings = script.steady_utilization(ctx, loop, Sampler())
    assert readings and all(r == 90.0 for r in readings)
    assert seen_at and min(seen_at) >= 5 + 2
    assert loop.state == "stopped"


def test_the_docstring_states_the_rule_for_later_gpu_checks() -> None:
    doc = " ".join((_script().__doc__ or "").split())
    assert (
        "the memory techniques, dry run and parallel layouts that land later add their GPU "
        "checks to gpu_check when they land" in doc
    )
    assert "under 8 minutes on one H200" in doc


@pytest.mark.cpu_only
def test_without_cuda_the_gpu_check_fails_loudly(tmp_path: Path) -> None:
    done = gpu_check("--out", str(tmp_path / "gpu.json"), timeout=120)
    assert done.returncode == 1
    assert "FAILED: torch" in done.stdout and "sees no CUDA GPU" in done.stdout
