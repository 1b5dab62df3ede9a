"""The README's snippets run as written: every ```python block in a fresh folder, and every
`workbench estimate` / `workbench export` line of the ```bash blocks; the figures the README
shows below a command (`#   ... 700 GB ...`) are the ones it prints."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def commands() -> list[str]:
    """Shell lines that run `workbench estimate` or `workbench export` (continuations joined)."""
    found = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith(("workbench estimate", "workbench export")):
                found.append(line)
    return found


#: a figure the README shows a command printing: a number with a unit, or with decimals
FIGURE = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s*(?:GB|GiB|MB|MiB|KiB|TB|B\b)|(\d[\d,]*\.\d+)")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def shown_figures() -> dict[str, list[str]]:
    """Command -> the figures of the `#   ...` comment lines right below it in the README
    (what the README shows it printing)."""
    shown: dict[str, list[str]] = {}
    for block in blocks("bash"):
        command = None
        for line in block.replace("\\\n", " ").splitlines():
            text = line.strip()
            if text.startswith("#") and command is not None:
                for with_unit, decimal in FIGURE.findall(text):
                    shown.setdefault(command, []).append(with_unit or decimal)
                continue
            code = text.split("#", 1)[0].strip()
            command = code if code.startswith("workbench ") else None
    return shown


def printed(figure: str, stdout: str) -> bool:
    """Whether `stdout` prints the number `figure` (to the figure's own precision)."""
    decimals = len(figure.partition(".")[2])
    want, half = float(figure.replace(",", "")), 0.5 * 10.0**-decimals
    return any(abs(float(n.replace(",", "")) - want) <= half for n in NUMBER.findall(stdout))


def test_the_readme_has_the_snippets_this_test_runs() -> None:
    assert len(blocks("python")) >= 1
    assert any(c.startswith("workbench estimate") for c in commands())
    assert any(c.startswith("workbench export") for c in commands())
    # the figures the README shows are checked against what the commands print (below)
    figures = shown_figures()
    assert set(figures) <= set(commands()) and sum(len(v) for v in figures.values()) >= 8


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_snippet_runs_as_written(index: int, tmp_path: Path) -> None:
    code = blocks("python")[index]
    script = tmp_path / "snippet.py"
    script.write_text("import torch\ntorch.set_num_threads(1)\n" + code)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    if "session.memory()" in code:  # the printed results read as tables with units
        assert "samples/s" in done.stdout and "measured" in done.stdout
        assert "KiB" in done.stdout or "MiB" in done.stdout
        assert (tmp_path / "runs" / "demo" / "weights.pt").is_file()


#: The Hugging Face config.json a README line reads from the user's folder (Llama-3-8B's shape).
LLAMA_CONFIG = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize("command", commands())
def test_shell_command_runs_as_written(command: str, tmp_path: Path) -> None:
    import json

    argv = shlex.split(command)
    for arg in argv:
        if arg.endswith("config.json"):  # a file the user has: write one where it points
            path = tmp_path / arg
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(LLAMA_CONFIG))
    exe = str(Path(sys.executable).parent / argv[0])
    done = subprocess.run(
        [exe, *argv[1:]], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 0, (command, done.stderr[-2000:])
    assert done.stdout.strip()
    missing = [f for f in shown_figures().get(command, []) if not printed(f, done.stdout)]
    assert not missing, f"the README shows {missing} for `{command}`; it printed:\n{done.stdout}"
