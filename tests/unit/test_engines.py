"""One row per engine (`workbench.engines`): every `Engine` has its row, `engine_for` decides
once, each refusal names the setting, its value and why, and the tables that used to repeat
an engine's facts (BACKENDS, the estimator's accounting, export's strategy) read the rows.
The backends declare every hook their callers use (`Backend`), so nothing probes for one."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from workbench.config import ConfigError, Engine, OptimizerName, TrainConfig
from workbench.engines import (
    ACCOUNTING,
    ENGINES,
    QLORA_ENGINES,
    TP_UNSUPPORTED,
    EngineRow,
    accounting_for,
    engine_for,
    engine_problems,
    engine_row,
    pp_problems,
    tp_problems,
)

ROOT = Path(__file__).resolve().parents[2] / "workbench"


def test_every_engine_has_one_row_naming_it() -> None:
    assert set(ENGINES) == set(Engine)
    for engine, row in ENGINES.items():
        assert isinstance(row, EngineRow) and row.engine is engine
        assert row.accounting in ("paper", "deepspeed", "fsdp")
        module, _, cls = row.backend.partition(":")
        assert module.startswith("workbench.train.backends.") and cls.endswith("Backend")
        assert callable(row.check)


def test_engines_imports_no_torch() -> None:
    tree = ast.parse((ROOT / "engines.py").read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert not {name for name in imported if name.split(".")[0] in ("torch", "deepspeed")}


@pytest.mark.parametrize(
    ("changes", "world_size", "engine"),
    [
        ({}, 1, Engine.PLAIN),
        ({}, 2, Engine.DEEPSPEED),  # a Session's data parallelism is DeepSpeed's ZeRO-0
        ({"zero_stage": 2}, 1, Engine.DEEPSPEED),
        ({"precision": "bf16"}, 1, Engine.DEEPSPEED),
        ({"fsdp": "full_shard"}, 4, Engine.FSDP),
        ({"tp": 2}, 2, Engine.TENSOR_PARALLEL),
        ({"tp": 2, "fsdp": "full_shard"}, 4, Engine.TENSOR_PARALLEL),
        ({"pp": 2, "grad_accum": 2}, 2, Engine.PIPELINE),
        ({"pp": 2, "tp": 2, "grad_accum": 2}, 4, Engine.PIPELINE),
    ],
)
def test_engine_for_decides_once(changes: dict, world_size: int, engine: Engine) -> None:
    config = TrainConfig(**changes)
    assert engine_for(config, world_size) is engine
    assert engine_row(config, world_size) is ENGINES[engine]


def test_engine_for_names_a_bad_world_size() -> None:
    with pytest.raises(ConfigError, match="world_size") as caught:
        engine_for(TrainConfig(), 0)
    (problem,) = caught.value.problems
    assert (problem.field, problem.value) == ("world_size", 0)


def test_backends_and_accounting_come_from_the_rows() -> None:
    from workbench.train.backends import BACKENDS

    assert {engine: row.backend for engine, row in ENGINES.items()} == BACKENDS
    assert {engine: row.accounting for engine, row in ENGINES.items()} == ACCOUNTING
    assert accounting_for(TrainConfig(), 1) == "paper"
    assert accounting_for(TrainConfig(), 2) == "deepspeed"
    assert accounting_for(TrainConfig(fsdp="shard_grad_op"), 2) == "fsdp"
    assert accounting_for(TrainConfig(tp=2), 2) == "paper"
    # tensor parallelism with FSDP2 over the data-parallel ranks: FSDP2's layout
    assert accounting_for(TrainConfig(tp=2, fsdp="full_shard"), 4) == "fsdp"


def test_export_strategy_comes_from_the_rows() -> None:
    from workbench.export import STRATEGY

    assert {engine: row.export_strategy for engine, row in ENGINES.items()} == STRATEGY
    assert STRATEGY[Engine.PLAIN] == "ddp"


def _optimizer_off(engine: str) -> OptimizerName:
    """An optimizer a Session trains, but not on `engine`."""
    for name in OptimizerName:
        if name.row.in_session and engine not in name.row.engines:
            return name
    raise AssertionError(f"every optimizer trains on {engine}")


@pytest.mark.parametrize(
    ("changes", "world_size", "field", "value", "why"),
    [
        ({"precision": "bf16-true"}, 2, "precision", "bf16-true", "fp32 master copy"),
        ({"precision": "amp-fp16"}, 2, "precision", "amp-fp16", "loss-scale settings"),
        ({"qlora": True, "lora_rank": 8}, 2, "qlora", True, QLORA_ENGINES),
        ({"optimizer_in_backward": True}, 2, "optimizer_in_backward", True, "plain loop"),
        ({"tp": 2}, 3, "tp", 2, "must divide the 3 ranks"),
        ({"tp": 2, "fsdp": "no_shard"}, 2, "fsdp", "no_shard", "2-D mesh"),
        ({"tp": 2, "compile": True}, 2, "compile", True, TP_UNSUPPORTED["compile"]),
        ({"pp": 2, "grad_accum": 2}, 3, "pp", 2, "must divide the 3 ranks"),
        ({"pp": 2, "grad_accum": 2, "precision": "amp-fp16"}, 2, "precision", "amp-fp16", "pp"),
    ],
)
def test_each_refusal_names_the_field_its_value_and_why(
    changes: dict, world_size: int, field: str, value: object, why: str
) -> None:
    problems = engine_problems(TrainConfig(**changes), world_size)
    found = [p for p in problems if p.field == field]
    assert found, problems
    assert found[0].value == value
    assert why in found[0].message


@pytest.mark.parametrize("engine", ["deepspeed", "tensor-parallel", "pipeline"])
def test_an_optimizer_refused_by_its_row_is_refused_on_that_engine(engine: str) -> None:
    optimizer = _optimizer_off(engine)
    config = {
        "deepspeed": ({}, 2),
        "tensor-parallel": ({"tp": 2}, 2),
        "pipeline": ({"pp": 2, "grad_accum": 2}, 2),
    }[engine]
    problems = engine_problems(TrainConfig(optimizer=optimizer, **config[0]), config[1])
    (problem,) = [p for p in problems if p.field == "optimizer"]
    assert problem.value == optimizer.value
    assert problem.message == optimizer.row.engines_reason


def test_what_each_engine_trains_plainly_is_not_refused() -> None:
    for config, world_size in [
        (TrainConfig(), 1),
        (TrainConfig(), 2),
        (TrainConfig(fsdp="full_shard"), 2),
        (TrainConfig(tp=2), 2),
        (TrainConfig(pp=2, grad_accum=2), 2),
    ]:
        assert engine_problems(config, world_size) == []
    assert tp_problems(TrainConfig(), 3) == [] and pp_problems(TrainConfig(), 3) == []


def test_the_backend_protocol_declares_every_hook_on_every_backend() -> None:
    from workbench.train.backends.base import Backend

    hooks = [
        "autocast",
        "loss_context",
        "backward",
        "train_step",
        "prepare_step",
        "step",
        "zero_grad",
        "probe",
        "pipeline_report",
        "export_state",
        "model_state_bytes",
        "close",
        "lr",
        "zero_stage",
        "trained_module",
        "runs_whole_step",
    ]
    for name in hooks:
        assert hasattr(Backend, name), name
    for row in ENGINES.values():
        module, _, name = row.backend.partition(":")
        cls = getattr(importlib.import_module(module), name)
        assert Backend in cls.__mro__, name  # subclassed: the defaults are inherited
        for hook in hooks:
            assert hasattr(cls, hook), (name, hook)
    from workbench.train.backends.pipeline import PipelineBackend
    from workbench.train.backends.plain import PlainBackend

    assert PipelineBackend.runs_whole_step and not PlainBackend.runs_whole_step
    assert inspect.getsource(PlainBackend.prepare_step) != inspect.getsource(Backend.prepare_step)


def test_the_distributed_backends_share_one_lifecycle() -> None:
    from workbench.train.backends.distributed import DistributedBackend

    for engine in (Engine.DEEPSPEED, Engine.FSDP, Engine.TENSOR_PARALLEL, Engine.PIPELINE):
        module, _, name = ENGINES[engine].backend.partition(":")
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, DistributedBackend)
        for own in ("close", "lr", "_set_lr", "__init__"):  # once, in the base
            assert own not in vars(cls), (name, own)


#: `getattr(backend, ...)` or `getattr(x.backend, ...)`: a hook the protocol should declare
PROBED = re.compile(r"getattr\((backend|[\w.]+\.backend)\b")


def test_no_backend_hook_is_probed_with_getattr() -> None:
    found = []
    for path in sorted((ROOT / "train").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if PROBED.search(line) and 'self._rt.backend, "lr"' not in line:
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []
    assert PROBED.search('own = getattr(backend, "probe", None)')  # the scan finds one
