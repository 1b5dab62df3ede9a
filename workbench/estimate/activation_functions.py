"""The MLP's activation function: which of the MLP's inner tensors its autograd keeps.

The activation formula (`activations`) counts a layer's MLP inner tensors, each s·b·f
elements wide (f the MLP inner size), from this table. Korthikanti et al. count a
two-matrix MLP as one GELU op that keeps its input beside its output (the second matrix's
input): 2sbf. That holds for the activations torch runs as one kernel (`F.gelu`, its tanh
approximation, `F.silu`, ...), not for those transformers writes out in Python: GPT-2's
`gelu_new` (`NewGELUActivation`, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))) keeps its
input (for `pow`), tanh's output, 0.5·x and 1 + tanh beside the product: 5sbf. A ReLU
keeps its output only, so the first matrix's output is freed: sbf.

Each row gives, for a two-matrix MLP (h -> f, the activation, f -> h) and a gated one
(act(gate) x up, then down), the inner tensors kept:

* `tensors`: their number when every op runs in one dtype (fp32; pure bf16/fp16; and CPU
  autocast, whose lists keep every op of these activations in 16 bits), each of the
  activation bytes e;
* `autocast`: (16-bit, fp32) tensors under CUDA autocast (amp-bf16, amp-fp16 outside
  FSDP, whose policy casts the weights instead and runs every op in 16 bits). CUDA
  autocast runs `pow`, `square`, `softplus` and `exp` in fp32 (ATen's autocast_mode.h,
  AT_FORALL_FP32): `gelu_new` keeps an fp32 copy of its input for `pow`, and tanh's output
  and 1 + tanh are fp32 (type promotion), and the second matrix keeps a 16-bit cast of the
  fp32 product: 2 x 16-bit + 3 x fp32 = 16 bytes per element, where CPU autocast keeps
  5 x 16-bit = 10.

The gated counts include the up projection's output and the product (the down projection's
input): with SiLU, 4 tensors (Llama's sbh + 4sbf with the gate/up input). Every count was
measured with torch's autograd (`saved_tensors_hooks`, one per storage), the CUDA autocast
ones with each op's dtype taken from torch's CUDA autocast kernels on fake CUDA tensors;
tests/integration/test_activation_functions.py holds the table to both for every name
transformers' `ACT2FN` has.

The names are transformers' (`ACT2FN`: what a config's `activation_function`,
`hidden_act`, `hidden_activation` or `activation` names), plus `bloom_gelu` (BLOOM's
`GeLUFunction`, an autograd Function that keeps its input only), less `xielu` (its learned
parameters, fp32 under autocast, promote some of its tensors to fp32, and its CUDA kernel
is a package of its own: not counted, so a config naming it gets the default and a note). `gelu` (torch's exact
GELU, one kernel) is the two-matrix MLP's default and `silu` the gated MLP's: the one-op
picture of the paper. A config that names an activation outside the table is estimated
with its MLP's default, and the estimate says so (`unknown_note`).

Pure Python: imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from workbench.inputs import shown


class Kept(NamedTuple):
    """The MLP inner tensors (each s·b·f elements) kept for the backward pass with one
    activation: `tensors` in one dtype, `autocast` = (16-bit, fp32) under CUDA autocast."""

    tensors: int
    autocast: tuple[int, int]


class ActivationFunction(NamedTuple):
    """A row of the table: the name, what it runs, and what a two-matrix and a gated MLP
    keep with it (`Kept`)."""

    name: str
    runs: str
    two: Kept
    gated: Kept


def _row(name: str, runs: str, two: tuple[int, int, int], gated: tuple[int, int, int]) -> Any:
    return name, ActivationFunction(
        name, runs, Kept(two[0], (two[1], two[2])), Kept(gated[0], (gated[1], gated[2]))
    )


_ONE_OP = (2, 2, 0), (4, 4, 0)  # one kernel that keeps its input: gelu, silu, ...
_OUTPUT = (1, 1, 0), (3, 3, 0)  # one kernel that keeps its output: relu, sigmoid, tanh
_TANH_FORMULA = (5, 2, 3), (7, 3, 4)  # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))

#: name -> row, in transformers' `ACT2CLS` order, then BLOOM's own.
ACTIVATION_FUNCTIONS: dict[str, ActivationFunction] = dict(
    [
        _row("gelu", "torch's exact GELU, one kernel (keeps its input)", *_ONE_OP),
        _row(
            "gelu_10",
            "GELU clipped to [-10, 10]: the GELU's input and output (the clip's input)",
            (3, 3, 0),
            (5, 5, 0),
        ),
        _row(
            "gelu_fast",
            "0.5·x·(1 + tanh(0.798·x·(1 + 0.044715·x·x))) in Python: seven intermediates",
            (8, 8, 0),
            (10, 10, 0),
        ),
        _row(
            "gelu_new",
            "0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) in Python (GPT-2's): its input, "
            "tanh's output, 0.5·x and 1 + tanh",
            *_TANH_FORMULA,
        ),
        _row(
            "gelu_python",
            "x·0.5·(1 + erf(x/√2)) in Python: erf's input, x·0.5 and 1 + erf",
            (4, 4, 0),
            (6, 6, 0),
        ),
        _row("gelu_pytorch_tanh", "torch's tanh GELU, one kernel (keeps its input)", *_ONE_OP),
        _row("gelu_python_tanh", "the tanh GELU in Python, as gelu_new", *_TANH_FORMULA),
        _row("gelu_accurate", "the tanh GELU in Python, as gelu_new", *_TANH_FORMULA),
        _row("hardswish", "torch's hardswish, one kernel (keeps its input)", *_ONE_OP),
        _row(
            "laplace",
            "0.5·(1 + erf((x - μ)/(σ√2))): erf's input",
            *_ONE_OP,
        ),
        _row("leaky_relu", "torch's leaky ReLU, one kernel (keeps its input)", *_ONE_OP),
        _row("linear", "the identity: the first matrix's output is the second's input", *_OUTPUT),
        _row("mish", "torch's mish, one kernel (keeps its input)", *_ONE_OP),
        _row(
            "quick_gelu",
            "x·sigmoid(1.702·x): its input and sigmoid's output",
            (3, 3, 0),
            (5, 5, 0),
        ),
        _row("relu", "torch's ReLU, one kernel (keeps its output only)", *_OUTPUT),
        _row(
            "relu2",
            "square(relu(x)): relu's output (and under CUDA autocast square's fp32 copy of it)",
            (2, 2, 1),
            (4, 3, 2),
        ),
        _row("relu6", "torch's hardtanh(0, 6), one kernel (keeps its input)", *_ONE_OP),
        _row("sigmoid", "torch's sigmoid, one kernel (keeps its output only)", *_OUTPUT),
        _row("silu", "torch's SiLU, one kernel (keeps its input)", *_ONE_OP),
        _row(
            "sqrtsoftplus",
            "sqrt(softplus(x)): softplus's input and sqrt's output (fp32 under CUDA autocast)",
            (2, 1, 2),
            (4, 2, 2),
        ),
        _row("swish", "torch's SiLU, one kernel (keeps its input)", *_ONE_OP),
        _row("tanh", "torch's tanh, one kernel (keeps its output only)", *_OUTPUT),
        _row("prelu", "torch's PReLU, one kernel (keeps its input)", *_ONE_OP),
        _row(
            "bloom_gelu",
            "BLOOM's GeLUFunction: an autograd Function that keeps its input only",
            *_ONE_OP,
        ),
    ]
)
NAMES = tuple(ACTIVATION_FUNCTIONS)

#: The MLP's default activation (Korthikanti et al.'s one-op picture): what `Architecture`
#: takes when none is given, and what a config's unknown activation is counted as.
DEFAULT = {"gelu": "gelu", "swiglu": "silu"}


def default_activation(mlp: str) -> str:
    """The activation an MLP of kind `mlp` ("gelu": two matrices; "swiglu": gated) has
    unless one is named: one op that keeps its input (`gelu`, `silu`)."""
    return DEFAULT.get(mlp, "gelu")


def inner_bytes(name: str, gated: bool, e: int, autocast: bool) -> int:
    """Bytes per MLP inner element (per s·b·f) one layer keeps with activation `name`: the
    table's tensors x `e` (the activation bytes), or under CUDA `autocast` (16-bit
    activations, e = 2) its 16-bit and fp32 tensors. `name` is one of `NAMES`."""
    row = ACTIVATION_FUNCTIONS[name]
    kept = row.gated if gated else row.two
    if autocast and e == 2:
        sixteen, fp32 = kept.autocast
        return 2 * sixteen + 4 * fp32
    return kept.tensors * e


#: The config key that names the MLP's activation, per `model_type` (transformers' own
#: modeling code reads it); every other family's is `hidden_act`.
CONFIG_KEYS = {
    "gpt2": "activation_function",
    "gptj": "activation_function",
    "gpt_bigcode": "activation_function",
    "opt": "activation_function",
    "codegen": "activation_function",
    "gemma2": "hidden_activation",
    "gemma3_text": "hidden_activation",
    "falcon": "activation",
}
#: The families whose MLP runs an activation no config key names.
FIXED = {"bloom": "bloom_gelu"}
#: Keys tried, in order, for a family neither table lists.
ANY_KEYS = ("hidden_act", "activation_function", "hidden_activation")
#: The names transformers' `ACT2FN` has (a config can name them; BLOOM's is its own).
TRANSFORMERS_NAMES = tuple(n for n in NAMES if n not in FIXED.values())


def activation_key(model_type: str) -> str | None:
    """The config key that names the MLP's activation in a config of `model_type` (None
    where the family's code runs a fixed one: BLOOM)."""
    if model_type in FIXED:
        return None
    return CONFIG_KEYS.get(model_type, "hidden_act")


def config_activation(
    config: Mapping[str, Any], model_type: str, mlp: str, default: str | None = None
) -> tuple[str, str | None]:
    """(the activation the MLP of a config of `model_type` runs, a note when it is not one
    the table knows and `mlp`'s default is counted instead). `default` is the family's
    when the config leaves its key out (None: the MLP's)."""
    if model_type in FIXED:
        return FIXED[model_type], None
    key = CONFIG_KEYS.get(model_type)
    keys = (key,) if key else ("hidden_act",) if model_type in _HIDDEN_ACT else ANY_KEYS
    for k in keys:
        value = config.get(k)
        if value is None:
            continue
        if isinstance(value, str) and value in ACTIVATION_FUNCTIONS:
            return value, None
        return default_activation(mlp), unknown_note(k, value, mlp)
    return default or default_activation(mlp), None


#: Families known to name their activation `hidden_act` (others are searched by `ANY_KEYS`).
_HIDDEN_ACT = frozenset(
    (
        "llama", "mistral", "qwen2", "gpt_neox", "mixtral", "qwen2_moe", "qwen3", "qwen3_moe",
        "gemma", "phi", "phi3", "olmo2", "olmoe", "starcoder2", "granite", "bert", "roberta",
        "xlm-roberta",
    )
)  # fmt: skip


def unknown_note(key: str, value: Any, mlp: str) -> str:
    """What the estimate says of a config's activation outside the table: what it
    counted instead."""
    fallback = default_activation(mlp)
    return (
        f"{key} {shown(value)} is not an activation the estimator knows: its MLP is counted "
        f"with {fallback} (one op that keeps its input); a dry run (--simulate) measures it"
    )


__all__ = [
    "ACTIVATION_FUNCTIONS",
    "ActivationFunction",
    "CONFIG_KEYS",
    "DEFAULT",
    "Kept",
    "NAMES",
    "TRANSFORMERS_NAMES",
    "activation_key",
    "config_activation",
    "default_activation",
    "inner_bytes",
    "unknown_note",
]
