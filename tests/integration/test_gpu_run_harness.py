"""The GPU run's harness sends figures back whatever happens (`benchmarks/gpu_check.py`,
`benchmarks/gpu_run.sh`, `benchmarks/gpu_wheels.sh`'s slim bitsandbytes wheel), checked on
this CPU: the results JSON lands in `$OUT` (the folder a lent machine sends back) after
every section; a timed-out section's forked children are ended without their SIGTERM
reading as one to the whole check, and Inductor's compile workers are spared; gpu_run.sh
refuses to start (exit 2, one line) when a wheel it needs is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
RUN = ROOT / "benchmarks" / "gpu_run.sh"


def _gpu_check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_a_timed_out_sections_forked_children_do_not_end_the_run(tmp_path: Path) -> None:
    """`--smoke-stall` starts forked loader workers, a forked multiprocessing child and a
    stand-in compile worker, then outlasts its limit: the run goes on to the next section
    and exits 1 (a section timed out), not 143 (a forked child's SIGTERM written to the
    inherited wakeup fd read as the run's own); the children it started are ended, the
    compile worker is spared and still alive at the end."""
    out = tmp_path / "stall.json"
    done = _gpu_check(
        "--cpu-smoke", "--smoke-stall", "--sections", "nvml", "--section-limit", "stall=4",
        "--grace", "20", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert "interrupted" not in result
    assert {k: v["status"] for k, v in result["sections"].items()} == {
        "stall": "timed out",
        "nvml": "passed",
    }
    stall = result["sections"]["stall"]
    children = [*stall["loader_worker_pids"], stall["forked_child_pid"]]
    assert set(children) <= set(stall["killed_child_pids"])
    assert stall["compile_worker_pid"] in stall["spared_child_pids"]
    assert stall["compile_worker_pid"] not in stall["killed_child_pids"]
    assert result["smoke_stall"]["compile_worker_alive_at_end"] is True
    assert result["complete"] is True


def test_results_land_in_out_after_every_section(tmp_path: Path) -> None:
    """With `$OUT` set (as on a lent machine) and no --out, the JSON is written there."""
    env = {**os.environ, "OUT": str(tmp_path)}
    done = _gpu_check("--cpu-smoke", "--sections", "nvml", env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check_cpu_smoke.json").read_text())
    assert result["sections"]["nvml"]["status"] == "passed"
    assert str(tmp_path) in done.stdout


def _run_sh(tmp_path: Path, wheels: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "WHEELS": str(wheels),
        "OUT": str(tmp_path / "out"),
        "SITE": str(tmp_path / "site"),
        "GPU_RUN_PYTHON": sys.executable,
    }
    return subprocess.run(["bash", str(RUN)], capture_output=True, text=True, timeout=60, env=env)


def test_gpu_run_refuses_to_start_without_its_wheels(tmp_path: Path) -> None:
    done = _run_sh(tmp_path, tmp_path / "nowhere")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no " in lines[0] and "gpu_wheels.sh" in lines[0], done.stderr
    wheels = tmp_path / "whl"
    wheels.mkdir()
    for dist in ("deepspeed", "torchao", "pydantic", "pydantic_core", "annotated_types",
                 "typing_inspection", "hjson"):  # fmt: skip
        (wheels / f"{dist}-1.0-py3-none-any.whl").write_bytes(b"")
    done = _run_sh(tmp_path, wheels)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        "wheels missing from " + f"{wheels}/: bitsandbytes (run 'bash benchmarks/gpu_wheels.sh')"
    ), done.stderr
    assert not (tmp_path / "out").exists()  # nothing ran
    (wheels / "bitsandbytes-1.0-py3-none-any.whl").write_bytes(b"")  # all there, all broken
    done = _run_sh(tmp_path, wheels)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"the wheels in {wheels}/ did not install" in lines[0], done.stderr
    assert not (tmp_path / "out").exists()


def test_the_slim_bitsandbytes_wheel_keeps_one_cuda_build(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_slim_wheel
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    wheel = tmp_path / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
    names = ["bitsandbytes/__init__.py", "bitsandbytes/libbitsandbytes_cpu.so"] + [
        f"bitsandbytes/libbitsandbytes_{b}.so" for b in ("cuda118", "cuda128", "cuda130", "rocm64")
    ]
    with zipfile.ZipFile(wheel, "w") as z:
        for n in names:
            z.writestr(n, n * 100)
        z.writestr("bitsandbytes-0.50.2.dist-info/RECORD", "stale\n")
    gpu_slim_wheel.slim(wheel, "130")
    with zipfile.ZipFile(wheel) as z:
        kept = sorted(z.namelist())
        record = z.read("bitsandbytes-0.50.2.dist-info/RECORD").decode().splitlines()
    assert kept == sorted(
        [*names[:2], "bitsandbytes/libbitsandbytes_cuda130.so",
         "bitsandbytes-0.50.2.dist-info/RECORD"]
    )  # fmt: skip
    assert len(record) == 4 and record[-1] == "bitsandbytes-0.50.2.dist-info/RECORD,,"
    assert all(",sha256=" in line for line in record[:-1])


def test_the_budget_cuts_the_oldest_sections_and_fits_eight_minutes(tmp_path: Path) -> None:
    """A section starts only while its estimate fits in the budget left: ladder (~60 s)
    does not fit a 40-second budget after nvml, and is "not run" (never passed). The GPU
    budget, the gpu tests' cap and the machine's start fit in 8 minutes."""
    out = tmp_path / "budget.json"
    done = _gpu_check(
        "--cpu-smoke", "--sections", "nvml,ladder", "--budget", "40", "--out", str(out)
    )
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["sections"]["nvml"]["status"] == "passed"
    ladder = result["sections"]["ladder"]
    assert ladder["status"] == "not run" and "its estimate 60 s" in ladder["note"]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    start_s, wheels_s, gpu_tests_s = 90, 15, 75  # gpu_run.sh cuts the gpu tests at 75 s
    assert gpu_check.BUDGET_SECONDS + start_s + wheels_s + gpu_tests_s <= 8 * 60
    assert "GPU_TESTS_SECONDS:-75" in RUN.read_text()
