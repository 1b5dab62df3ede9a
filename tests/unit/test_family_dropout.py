"""A config.json's family defaults without transformers: `FAMILY_DROPOUT` holds the dropout
rates transformers' config classes give the keys a file leaves out, so a plain config.json
is estimated and planned without importing transformers (or torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import CONFIG_MAPPING

from workbench.estimate.hf_shape import DROPOUT_KEYS, FAMILY_DROPOUT, training_facts

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("family", sorted(FAMILY_DROPOUT))
def test_the_table_is_what_transformers_gives(family: str) -> None:
    defaults = CONFIG_MAPPING[family]().to_dict()
    assert FAMILY_DROPOUT[family] == {k: defaults[k] for k in DROPOUT_KEYS if k in defaults}


def test_a_config_without_rates_trains_with_its_familys() -> None:
    assert training_facts({"model_type": "gpt2"})["dropout"] is True
    assert training_facts({"model_type": "llama"})["dropout"] is False
    assert training_facts({"model_type": "t5"})["dropout"] is True  # its dropout_rate
    assert "dropout" not in training_facts({"model_type": "no-such-family"})
    assert training_facts({"model_type": "llama", "attention_dropout": 0.1})["dropout"] is True


def test_planning_a_plain_config_json_imports_neither_transformers_nor_torch(
    tmp_path: Path,
) -> None:
    config = {
        "model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
        "vocab_size": 1024, "max_position_embeddings": 512,
    }  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code = (
        "import contextlib, io, sys\n"
        "from workbench.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main(['plan', '--hf-config', {str(path)!r}, '--gpu', 'h100', '--gpus', '8',\n"
        "          '--seq-len', '512', '--global-batch', '64'])\n"
        "print('transformers' in sys.modules, 'torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False"]
