"""Hostile input to the estimator, `--simulate`, the planner and their flags: each ends in
one clear error (a ValueError naming the argument in the API; exit status 2 and one line
in the CLI), never a traceback, a hang or output that is not what it claims to be."""

from __future__ import annotations

import json

import pytest

from workbench.cli import main

#: A small llama config.json the plain estimate reads without transformers.
LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_hidden_layers": 1,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors and --help
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_error(argv: list[str], capsys) -> str:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


# ------------------------------------------------ 1. --simulate builds inside the guard
REFUSED_BY_TRANSFORMERS = [
    ("rope_scaling", {"rope_scaling": {"type": "bogus", "factor": "x"}}),
    ("rms_norm_eps", {"rms_norm_eps": "abc"}),
    ("head_dim", {"head_dim": 7}),
]


@pytest.mark.parametrize(("key", "extra"), REFUSED_BY_TRANSFORMERS)
def test_simulate_of_a_config_transformers_refuses_exits_2(key, extra, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, **extra}))
    code, _, _ = run(["estimate", "--hf-config", str(path)], capsys)
    assert code == 0  # the plain estimate reads the family without transformers
    line = one_error(["estimate", "--hf-config", str(path), "--simulate"], capsys)
    assert "--hf-config" in line and (key in line or "bogus" in line), line


@pytest.mark.parametrize(("key", "extra"), REFUSED_BY_TRANSFORMERS)
def test_the_dry_runs_model_of_a_refused_config_is_a_problem(key, extra):
    from workbench.estimate.hf_build import meta_module

    module, problems = meta_module({**LLAMA, **extra})
    assert module is None and len(problems) == 1
    assert problems[0].field == "hf_config"
    assert key in problems[0].message or "bogus" in problems[0].message


# ------------------------------------------------ 2. plan() takes the CLI's keywords
PLAN = {"model": "llama-3-8b", "global_batch": 16}


def test_plan_takes_the_clis_gpus_params_price_and_no_offload():
    from workbench.planner import plan

    by_gpus = plan(**PLAN, gpus=16)
    assert (by_gpus.cluster.gpus_per_node, by_gpus.cluster.nodes) == (8, 2)
    assert plan(**PLAN, gpus=4).cluster.gpus_per_node == 4  # fewer than a node: one node
    assert (
        plan(**PLAN, gpus=8, price=2.5, tokens=1e9).to_dict()
        == plan(**PLAN, gpus=8, price_per_gpu_hour=2.5, tokens=1e9).to_dict()
    )
    off = plan(**PLAN, gpus=8, no_offload=True)
    assert not any("offload" in k for p in off.plans for k in p.settings)
    shaped = plan(
        params="1B", layers=4, hidden=256, heads=4, vocab=1000, seq_len=64, global_batch=8
    )
    assert shaped.plans
    with pytest.raises(ValueError, match=r"input: params=1e\+30: more than 10\^16 parameters"):
        plan(params=1e30, layers=4, hidden=256, heads=4, vocab=1000, seq_len=64, global_batch=8)


@pytest.mark.parametrize(
    ("keywords", "named"),
    [
        ({"gpus": 12, "gpus_per_node": 8}, "gpus=12"),
        ({"gpus": 16, "nodes": 3}, "gpus=16"),
        ({"gpus": 0}, "gpus=0"),
        ({"gpus": True}, "gpus=True"),
        ({"params": "1B", "n_params": "2B"}, "params"),
        ({"price": 1.0, "price_per_gpu_hour": 2.0}, "price"),
        ({"no_offload": "yes"}, "no_offload"),
    ],
)
def test_plans_cli_keywords_in_conflict_or_bad_are_named(keywords, named):
    from workbench.planner import plan

    with pytest.raises(ValueError, match=named):
        plan(**PLAN, **keywords)


@pytest.mark.parametrize(
    "name",
    [
        "micro_batch",
        "zero_stage",
        "tensor_parallel",
        "pipeline_parallel",
        "grad_accum",
        "checkpointing",
        "fsdp",
        "top",
        "json",
        "probe",
        "export",
        "gpu_per_node",
        "banana",
    ],
)
def test_a_keyword_plan_does_not_take_is_a_value_error_naming_it(name):
    from workbench.planner import plan

    with pytest.raises(ValueError, match=name) as got:
        plan(**PLAN, **{name: 1})
    assert not isinstance(got.value, TypeError)
    text = str(got.value)
    if name in ("top", "json", "probe", "export"):
        assert "result" in text  # what the API does instead
    else:
        assert "gpus_per_node" in text  # the allowed ones are listed
    if name == "gpu_per_node":
        assert "did you mean 'gpus_per_node'" in text


def test_every_plan_flag_of_the_cli_is_a_keyword_plan_takes():
    import inspect

    from workbench.cli import build_parser
    from workbench.planner import CLI_NAMES, OUTPUT_FLAGS, SHAPE_KEYS, plan

    parser, _ = build_parser("plan")
    sub = next(a for a in parser._actions if a.dest == "command")
    plan_parser = sub.choices["plan"]
    flags = [a.dest for a in plan_parser._actions if a.dest != "help"]
    takes = set(inspect.signature(plan).parameters) | set(CLI_NAMES) | set(SHAPE_KEYS)
    for dest in flags:
        assert dest in takes or dest in OUTPUT_FLAGS, dest


# ------------------------------------------------ 4. JSON output is valid JSON
@pytest.mark.parametrize(
    "argv",
    [
        ["--inter-node-gbps", "5e-324", "--nodes", "2"],
        ["--intra-node-gbps", "1e-300"],
        ["--inter-node-gbps", "1e308", "--nodes", "2"],
        ["--price", "1e308"],
        ["--tokens", "1e30"],
        ["--efficiency", "1e-300"],
    ],
)
def test_plan_numbers_out_of_range_exit_2_naming_the_flag(argv, capsys):
    line = one_error(
        ["plan", "--model", "llama-3-8b", "--global-batch", "16", *argv, "--json"], capsys
    )
    assert argv[0] in line, line


def test_a_network_slower_than_a_cluster_has_is_refused_in_the_api():
    from workbench.planner import plan

    with pytest.raises(ValueError, match="inter_node_gbps"):
        plan(**PLAN, nodes=2, inter_node_gbps=5e-324)
    with pytest.raises(ValueError, match="intra_node_gbps"):
        plan(**PLAN, intra_node_gbps=1e-9)


@pytest.mark.parametrize(
    "argv",
    [
        [
            "plan",
            "--model",
            "llama-3-8b",
            "--global-batch",
            "16",
            "--inter-node-gbps",
            "0.001",
            "--nodes",
            "2",
            "--tokens",
            "1e15",
            "--price",
            "1e6",
            "--json",
        ],
        [
            "estimate",
            "--params",
            "1e16",
            "--gpu",
            "h100",
            "--tokens",
            "1e16",
            "--mfu",
            "0.001",
            "--price-per-gpu-hour",
            "1e6",
            "--json",
        ],
    ],
)
def test_json_output_at_the_bounds_is_strict_json(argv, capsys):
    code, out, err = run(argv, capsys)
    if code == 0:
        json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in JSON output"))
    else:
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err


def test_a_figure_that_is_not_finite_is_an_error_naming_it_never_infinity():
    from workbench.cli import json_text

    with pytest.raises(ValueError, match=r"plans\[1\]\.tokens_per_s: inf"):
        json_text({"plans": [{"tokens_per_s": 1.0}, {"tokens_per_s": float("inf")}]})
    with pytest.raises(ValueError, match="the value: nan"):
        json_text(float("nan"))
    looped: list = [1.0]
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular"):
        json_text(looped)
    assert json.loads(json_text({"a": [1.5, 2]})) == {"a": [1.5, 2]}


# ------------------------------------------------ 3. an hf_config dict too deep or cyclic
def _nested(depth: int) -> dict:
    top: dict = {"model_type": "llama"}
    inner = top
    for _ in range(depth):
        inner["a"] = {}
        inner = inner["a"]
    return top


def test_an_hf_config_nested_5000_deep_is_a_value_error_naming_it():
    from workbench.estimate import estimate_memory

    with pytest.raises(ValueError, match=r"hf_config.*nested deeper than 64 levels"):
        estimate_memory(hf_config=_nested(5000))


@pytest.mark.parametrize("through", ["dict", "list"])
def test_an_hf_config_that_contains_itself_is_a_value_error_naming_it(through):
    from workbench.estimate import estimate_memory

    config: dict = {**LLAMA}
    config["self"] = config if through == "dict" else [config]
    with pytest.raises(ValueError, match=r"hf_config.*contains itself"):
        estimate_memory(hf_config=config)


def test_the_dry_runs_model_of_a_cyclic_config_is_a_problem():
    from workbench.estimate.hf_build import meta_module

    config: dict = {**LLAMA}
    config["rope_scaling"] = {"inner": config}
    module, problems = meta_module(config)
    assert module is None and "contains itself" in problems[0].message


# ------------------------------------------------ 7. shared references never walked twice
def _shared(depth: int) -> list:
    value: list = [0]
    for _ in range(depth):
        value = [value, value]
    return value


def test_a_list_of_shared_references_40_deep_is_refused_promptly():
    from workbench.config import TrainConfig
    from workbench.estimate import estimate_memory

    hostile = _shared(40)
    with pytest.raises(ValueError, match="lr="):
        TrainConfig(lr=hostile)
    with pytest.raises(ValueError, match="layers="):
        estimate_memory(layers=hostile)
    with pytest.raises(ValueError, match="hf_config=.*must be a path"):
        estimate_memory(hf_config=hostile)
    with pytest.raises(ValueError, match="hf_config=.*not both"):
        estimate_memory(model="gpt2", hf_config=hostile)
    with pytest.raises(ValueError, match="hf_config.*holds more than"):
        estimate_memory(hf_config={**LLAMA, "rope_scaling": _shared(28)})


@pytest.mark.parametrize(("depth", "why"), [(28, "holds more than"), (40, "nested deeper")])
def test_a_deepspeed_dict_of_shared_references_is_refused_promptly(depth, why):
    from workbench.deepspeed import import_deepspeed

    with pytest.raises(ValueError, match=why):
        import_deepspeed({"train_micro_batch_size_per_gpu": 1, "x": _shared(depth)})


def test_a_deepspeed_dict_that_contains_itself_is_refused():
    from workbench.deepspeed import import_deepspeed

    config: dict = {"train_micro_batch_size_per_gpu": 1}
    config["x"] = [config]
    with pytest.raises(ValueError, match=r"x\.0: contains itself"):
        import_deepspeed(config)


def test_the_walk_counts_each_container_once():
    from workbench.estimate.limits import nesting_problem

    assert nesting_problem(_shared(10), 64) is None  # 2^11 values: fine
    assert nesting_problem(_shared(10), 10) == ("nested deeper than 10 levels", (0,) * 10)
    assert nesting_problem(_shared(60), 64)[0].startswith("holds more than")
    assert nesting_problem({"a": [1, {"b": 2}]}, 3) is None


# ------------------------------------------------ 5. number flags take ASCII digits only
ARABIC_12 = "\u0661\u0662"  # Arabic-Indic "12": Python's int() reads it as 12
FULLWIDTH_8 = "\uff18"


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "--model", "gpt2", "--micro-batch", ARABIC_12],
        ["estimate", "--model", "gpt2", "--gpus", FULLWIDTH_8],
        ["estimate", "--model", "gpt2", "--overhead-gib", "\u0662"],
        ["estimate", "--model", "gpt2", "--tokens", "\u0661e9"],
        ["estimate", "--model", "gpt2", "--mfu", "0.\u0665"],
        ["plan", "--model", "llama-3-8b", "--global-batch", ARABIC_12],
        ["plan", "--model", "llama-3-8b", "--gpus", FULLWIDTH_8],
        ["plan", "--model", "llama-3-8b", "--headroom", "0.\u0661"],
    ],
)
def test_number_flags_take_ascii_digits_only(argv, capsys):
    line = one_error(argv, capsys)
    assert argv[-2] in line, line


@pytest.mark.parametrize(
    ("text", "kind"),
    [(ARABIC_12, "int"), (FULLWIDTH_8, "int"), ("\u0661.5", "float"), ("\u0661e3", "float")],
)
def test_the_shared_flag_parser_takes_ascii_digits_only(text, kind):
    from workbench.cli.config_flags import lenient_number, parse_number

    problems: list[str] = []
    assert parse_number(text, kind, "--micro-batch", problems) is None
    assert len(problems) == 1 and "--micro-batch" in problems[0]
    assert lenient_number(text, kind) == text  # passed on for TrainConfig to name
    assert parse_number(" 12 ", kind, "--micro-batch", []) == 12  # ASCII, padded: as before


# ------------------------------------------------ 6. a bad DeepSpeed config: one line only
@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "--params", "1B", "--deepspeed-config"],
        ["export", "--config"],  # launch reads it the same way (workbench.deepspeed)
    ],
)
def test_a_bad_deepspeed_config_is_one_line_without_deepspeeds_import_notices(argv, tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "ds.json"
    bad.write_text(json.dumps({"train_micro_batch_size_per_gpu": "x"}))
    code = f"import sys; from workbench.cli import main; sys.exit(main({[*argv, str(bad)]!r}))"
    # a fresh interpreter: DeepSpeed logs while it is first imported
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert got.returncode == 2 and got.stdout == "", (got.stdout, got.stderr)
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and "train_micro_batch_size_per_gpu" in lines[0], got.stderr


def test_plan_reads_the_commands_texts_for_engines_and_counts():
    from workbench.planner import plan

    got = plan(
        model="llama-3-8b",
        seq_len=4096,
        global_tokens="4,194,304",
        tokens="1T",
        engines="zero3, full_shard",
    )
    assert got.global_batch == 1024 and got.tokens == 1e12
    assert {p.engine for p in got.plans} <= {"zero3", "full_shard"}
    with pytest.raises(ValueError, match=r"tokens='1X': must be a count"):
        plan(**PLAN, tokens="1X")
    with pytest.raises(ValueError, match=r"engines=\['zero9'\]"):
        plan(**PLAN, engines="zero9")
