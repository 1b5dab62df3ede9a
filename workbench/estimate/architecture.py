"""`Architecture`: the shape of a decoder-only (or encoder-only) transformer, and its
parameter count.

One frozen description covers the families the estimator knows: GPT-2/GPT-3 (GELU MLP,
LayerNorm, biases everywhere, learned positions, tied embeddings), Llama/Mistral
(SwiGLU MLP, RMSNorm, no biases, rotary positions, untied embeddings, grouped-query
attention), Qwen2 (Llama with biases on the Q, K, V projections), GPT-NeoX/Pythia
(GELU, LayerNorm, biases, rotary, untied) and mixtures of experts such as Mixtral. With
h hidden size, a heads, k kv heads, d the head size (`head_dim`, h / a unless given:
Gemma's and Qwen3's differ), q = a·d the query width, g = k·d, f the MLP inner size, V
the vocabulary, P learned positions, per layer:

    attention weights   Q h·q + K, V 2·h·g + output q·h    = 2hq + 2hg (2h² + 2hg: q = h)
    attention biases    bias="all": q + 2g + h; "qkv": q + 2g; "none": 0
    MLP weights         gelu 2·h·f; swiglu (gate, up, down) 3·h·f
    MLP biases          bias="all": gelu f + h, swiglu 2f + h; otherwise 0
    norms               two per layer: LayerNorm 2h (weight, bias), RMSNorm h (weight)

(`fused_qkv`: Q, K and V held as one (h, q + 2g) matrix, as GPT-2's `c_attn` and
GPT-NeoX's `query_key_value` are; the same parameters, one linear layer where LoRA puts
one adapter instead of three)

plus the token embedding V·h, the output projection V·h unless tied to the embedding,
the learned position table P·h (none for rotary) and the final norm. With a = k, f = 4h,
bias "all", LayerNorm, learned positions and tied embeddings this is GPT's
12Lh² + 13Lh + Vh + Ph + 2h (`params_from_shape`).

A mixture-of-experts layer (`experts` E set) has, in place of the MLP, a router h·E
(plus E biases with bias="all"), E expert MLPs of inner size fe = `moe_ffn_hidden`, each
counted as the MLP above (biases included), and, with `shared_ffn_hidden` fs, one
always-active shared MLP of inner size fs (Qwen2-MoE's and DeepSeek's shared experts).
`active_params` is what one token uses: everything but the E - k experts it is not routed
to in each layer (k = `experts_per_token`), so attention, norms, router, k experts, the
shared MLP and the embeddings (Mixtral-8x7B: 46.7B in total, 12.9B active).

Tensor and pipeline parallelism (`stage_params`) follow Megatron-LM's layout (Shoeybi et
al. 2019; Narayanan et al. 2021): tensor parallelism over t GPUs splits the Q/K/V and MLP
first-layer weights by columns and the attention-output and MLP second-layer weights by
rows, so every matmul weight and the column-parallel biases are divided by t, while the
norms, the row-parallel biases and the position table are replicated; the embedding and
the output projection are split over the vocabulary (ceil(V / t) rows each; Megatron
pads V to a multiple of t). Experts are split as the MLP is (expert tensor parallelism);
the router is replicated. Pipeline parallelism over p stages gives each stage L / p
layers; the first stage also holds the embedding (and position table), the last stage
the final norm and the output projection (with tied embeddings it keeps its own copy of
the embedding, as Megatron does). `stage_params` is the largest stage's count on one GPU.

Pure Python: imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Any

from workbench.estimate.activation_functions import NAMES as ACTIVATION_NAMES
from workbench.estimate.activation_functions import default_activation
from workbench.estimate.implementations import NORM_NAMES, SOFTMAX_NAMES, default_norm_impl
from workbench.estimate.limits import LIMITS, Bound, as_bool, check_number
from workbench.estimate.problems import EstimateInputError, Problem


class _Choice(str, Enum):
    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def choices(cls) -> list[str]:
        return [m.value for m in cls]


class Mlp(_Choice):
    """The MLP block: `gelu` (two matrices, h -> f -> h, any activation between them) or
    `swiglu` (gated: gate and up projections h -> f, act(gate) * up, down projection
    f -> h). `Architecture.activation_function` names the activation (default GELU and
    SiLU)."""

    GELU = "gelu"
    SWIGLU = "swiglu"


class Norm(_Choice):
    """`layernorm` (weight and bias, 2h parameters) or `rmsnorm` (weight only, h)."""

    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class Bias(_Choice):
    """Which linear layers of a block have biases: `all` (GPT-2, GPT-NeoX), `qkv` (only
    the query/key/value projections: Qwen2) or `none` (Llama, Mistral)."""

    ALL = "all"
    QKV = "qkv"
    NONE = "none"


class Positions(_Choice):
    """`learned` (a table of `max_positions` x h parameters) or `rotary` (no parameters)."""

    LEARNED = "learned"
    ROTARY = "rotary"


#: Fields of a transformer shape that must all be given (or come from a model).
REQUIRED = ("layers", "hidden", "heads", "seq_len", "vocab")
#: Optional architecture fields; None means the default described on `Architecture`.
OPTIONAL = (
    "kv_heads",
    "ffn_hidden",
    "mlp",
    "norm",
    "bias",
    "positions",
    "max_positions",
    "tied_embeddings",
    "parallel_residual",
    "head_dim",
    "causal",
    "experts",
    "experts_per_token",
    "moe_ffn_hidden",
    "shared_ffn_hidden",
    "fused_qkv",
    "activation_function",
    "norm_impl",
    "eager_softmax",
    "qk_norm",
    "post_norms",
)
FIELDS = REQUIRED + OPTIONAL
#: The fields of a mixture of experts (all None for a dense model).
MOE_FIELDS = ("experts", "experts_per_token", "moe_ffn_hidden", "shared_ffn_hidden")

_CHOICES: dict[str, tuple[str, ...]] = {
    "mlp": tuple(Mlp.choices()),
    "norm": tuple(Norm.choices()),
    "bias": tuple(Bias.choices()),
    "positions": tuple(Positions.choices()),
}
_SWIGLU, _LAYERNORM, _ROTARY = Mlp.SWIGLU.value, Norm.LAYERNORM.value, Positions.ROTARY.value
_BIAS_ALL, _BIAS_QKV = Bias.ALL.value, Bias.QKV.value


#: The ranges of the fields that `limits.LIMITS` does not cover (read by `hf_config` too).
FIELD_BOUNDS = {
    "head_dim": Bound(1, 10**6, "units per head", "the widest heads have about 256"),
    "experts": Bound(1, 10**6, "experts", "the most experts per layer trained are about 10^3"),
    "experts_per_token": Bound(1, 10**6, "experts", "at most `experts`"),
    "moe_ffn_hidden": LIMITS["ffn_hidden"],
    "shared_ffn_hidden": LIMITS["ffn_hidden"],
}


def swiglu_ffn_default(hidden: int) -> int:
    """LLaMA's SwiGLU inner size: 2/3 of 4h, rounded up to a multiple of 256 (Touvron et
    al. 2023, Section 2.2; `multiple_of=256` in Meta's reference code): 11008 for h=4096."""
    inner = (2 * 4 * hidden) // 3
    return -(-inner // 256) * 256


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer (see the module docstring for the parameter count).

    `seq_len` is the training sequence length (it sets the activations); `max_positions`
    the rows of a learned position table (0 for rotary positions). Build one with
    `Architecture.create(...)`, which fills the defaults: `kv_heads` = `heads` (multi-head
    attention; 1 is multi-query), `ffn_hidden` 4h for a GELU MLP or LLaMA's 2/3·4h rule
    for SwiGLU, `mlp` gelu, `norm` layernorm, `bias` all, `positions` learned,
    `max_positions` = `seq_len`, `tied_embeddings` True (GPT's choices),
    `parallel_residual` False (True: attention and MLP read the same layer input, as in
    GPT-NeoX; it changes the activations, not the count), `head_dim` hidden / heads,
    `causal` True (False: an encoder such as BERT, whose attention sees every position;
    it changes neither the count nor the saved tensors), `fused_qkv` False (True: Q, K and
    V are one linear layer, as GPT-2's and GPT-NeoX's are; it changes LoRA's targets and
    the casts autocast keeps of the attention's input, not the count), `activation_function` the MLP's default (`gelu` for two matrices, `silu`
    gated: one op that keeps its input; transformers' names, `activation_functions.NAMES`:
    GPT-2's `gelu_new` keeps three more MLP-wide tensors, a `relu` one fewer; it changes
    the activations, not the count), `norm_impl` what the norms keep
    (`implementations.NORM_NAMES`: `kernel`, a layernorm's default, torch's one kernel
    that keeps its input; `llama`, an rmsnorm's default, transformers' RMSNorm, which keeps
    an fp32 copy of its input and the normalised input; `gemma`, the normalised input in
    fp32; it changes the activations, not the count), `eager_softmax` the dtype
    transformers' unfused attention runs its softmax in (`fp32`, Llama's and most
    families': an fp32 output kept beside its 16-bit cast; `input`, GPT-2's and BERT's:
    the scores' dtype), `qk_norm` False (True: a norm of the family's `norm_impl` on the
    query and on the key projection's output, per head or over the whole width, as Qwen3,
    Gemma 3, OLMo 2 and OLMoE run; each keeps what an RMSNorm keeps of its 16-bit input,
    e.g. 4 + e bytes an element for "llama"; it changes the activations, not the count:
    a config's family counts the norms' weights), `post_norms` False (True: a norm on the
    attention's and on the MLP's output before each residual add, Gemma 2's and 3's four
    norms a layer; each keeps what its row keeps of that 16-bit output; the activations,
    not the count), and checks every field, raising
    `EstimateInputError` with all problems at once.

    A mixture of experts sets `experts` (routed experts per layer) and
    `experts_per_token` (top-k); `moe_ffn_hidden` (each expert's inner size) defaults to
    `ffn_hidden`, `shared_ffn_hidden` (the inner size of an always-active shared MLP) to
    none. With `experts` None (the default) the model is dense and all four are None.
    """

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    kv_heads: int
    ffn_hidden: int
    mlp: str
    norm: str
    bias: str
    positions: str
    max_positions: int
    tied_embeddings: bool
    parallel_residual: bool = False
    head_dim: int = 0  # 0: hidden // heads (filled in by __post_init__)
    causal: bool = True
    experts: int | None = None
    experts_per_token: int | None = None
    moe_ffn_hidden: int | None = None
    shared_ffn_hidden: int | None = None
    fused_qkv: bool = False
    activation_function: str = "gelu"
    norm_impl: str = "kernel"
    eager_softmax: str = "fp32"
    qk_norm: bool = False
    post_norms: bool = False

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        # the counts every estimate asks for, computed once (not fields: not compared,
        # not in to_dict)
        h, q, g = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        gated = self.mlp == _SWIGLU
        matrices, first = (3, 2) if gated else (2, 1)  # MLP matrices; those h -> f
        all_biases = self.bias == _BIAS_ALL
        norm = (2 if self.norm == _LAYERNORM else 1) * h
        weights = 2 * h * q + 2 * h * g
        split_bias = replicated = 0
        if all_biases or self.bias == _BIAS_QKV:
            split_bias += q + 2 * g  # Q, K, V biases: column-parallel
        if all_biases:
            replicated += h  # attention output bias: row-parallel

        def mlp(inner: int) -> tuple[int, int, int]:
            """(weights, column-parallel biases, row-parallel biases) of one MLP."""
            return matrices * h * inner, first * inner if all_biases else 0, h if all_biases else 0

        expert = (0, 0, 0)  # one routed expert's (weights, split biases, replicated biases)
        if self.experts is None:
            w, split, rep = mlp(self.ffn_hidden)
        else:
            e = self.experts
            expert = mlp(self.moe_ffn_hidden or self.ffn_hidden)
            shared = mlp(self.shared_ffn_hidden) if self.shared_ffn_hidden else (0, 0, 0)
            w, split, rep = (e * x + y for x, y in zip(expert, shared, strict=True))
            rep += e * h + (e if all_biases else 0)  # the router: replicated
        weights, split_bias, replicated = weights + w, split_bias + split, replicated + rep
        replicated += 2 * norm
        object.__setattr__(self, "_norm", norm)
        object.__setattr__(self, "_split", (weights + split_bias, replicated))
        total = self.layers * (weights + split_bias + replicated)
        total += self.embedding_params() + self.output_params()
        object.__setattr__(self, "_total", total)
        idle = (self.experts or 0) - (self.experts_per_token or 0)
        object.__setattr__(self, "_active", total - self.layers * idle * sum(expert))

    # ------------------------------------------------------------------ building
    @classmethod
    def create(cls, **fields: Any) -> Architecture:
        """Defaults filled and every field checked; `EstimateInputError` lists all
        problems. Fields are those of the class."""
        arch, problems = build_architecture(fields)
        if problems or arch is None:
            raise EstimateInputError(problems)
        return arch

    def replace(self, **changes: Any) -> Architecture:
        """A copy with `changes` applied and checked (a None change keeps the field).

        `ffn_hidden` and `max_positions` follow a change of `hidden`/`mlp` or `seq_len`
        only where they were at their defaults (for a learned position table,
        `max_positions` stays: a model's table does not grow with a longer sequence)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        unknown = sorted(set(changes) - set(FIELDS))
        if unknown:
            raise ValueError(f"{unknown[0]}: not a field of Architecture ({', '.join(FIELDS)})")
        if all(
            type(v) is type(getattr(self, k)) and v == getattr(self, k) for k, v in changes.items()
        ):
            return self
        values: dict[str, Any] = {k: getattr(self, k) for k in FIELDS}
        if self.ffn_hidden == _default_ffn(self.mlp, self.hidden):
            values["ffn_hidden"] = None
        if self.positions == _ROTARY:
            values["max_positions"] = None
        if self.head_dim == self.hidden // self.heads:
            values["head_dim"] = None
        if self.moe_ffn_hidden == self.ffn_hidden:
            values["moe_ffn_hidden"] = None
        if self.activation_function == default_activation(self.mlp):
            values["activation_function"] = None  # follows a change of `mlp`
        if self.norm_impl == default_norm_impl(self.norm):
            values["norm_impl"] = None  # follows a change of `norm`
        values.update(changes)
        return Architecture.create(**values)

    # ------------------------------------------------------------------ counting
    @property
    def one_qkv_matrix(self) -> bool:
        """Whether Q, K and V are one linear layer: `fused_qkv`, or GPT-2's layout (every
        linear layer with a bias and learned positions, which `parameter_shapes` lays out as
        one matrix); under autocast that layer keeps one 16-bit cast of its input, not three."""
        return self.fused_qkv or (self.bias == _BIAS_ALL and self.positions != _ROTARY)

    @property
    def kv_dim(self) -> int:
        """g = kv_heads x head size: the width of the K and V projections."""
        return self.kv_heads * self.head_dim

    @property
    def qk_norm_width(self) -> int:
        """The elements a token's query and key norms read (`qk_norm`): q + g = (heads +
        kv_heads) x head size; 0 without them."""
        return (self.heads + self.kv_heads) * self.head_dim if self.qk_norm else 0

    def _norm_params(self) -> int:
        return int(self.__dict__["_norm"])

    def norm_params(self) -> int:
        """Parameters of one norm (LayerNorm 2h, RMSNorm h); a layer has two."""
        return self._norm_params()

    def layer_params(self, tensor_parallel: int = 1) -> int:
        """Parameters of one layer on one GPU of a tensor-parallel group: the matmul
        weights and column-parallel biases split, norms and row-parallel biases whole."""
        split, replicated = self.__dict__["_split"]
        return int(split // tensor_parallel + replicated)

    def embedding_params(self, tensor_parallel: int = 1) -> int:
        """Token embedding (vocabulary-parallel) and learned position table (replicated)."""
        rows = -(-self.vocab // tensor_parallel)
        return rows * self.hidden + self.max_positions * self.hidden

    def output_params(self, tensor_parallel: int = 1, *, own_copy: bool = False) -> int:
        """Final norm and, unless tied (or `own_copy` of a tied matrix on another
        pipeline stage), the output projection."""
        rows = -(-self.vocab // tensor_parallel)
        matrix = rows * self.hidden if (own_copy or not self.tied_embeddings) else 0
        return self._norm_params() + matrix

    @property
    def q_dim(self) -> int:
        """q = heads x head size: the width of the Q projection (= hidden unless
        `head_dim` says otherwise)."""
        return self.heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        """True for a mixture of experts (`experts` set)."""
        return self.experts is not None

    @property
    def n_params(self) -> int:
        """Total parameters, a tied output projection counted once, every expert and the
        router included."""
        return int(self.__dict__["_total"])

    @property
    def token_ffn_hidden(self) -> int:
        """The MLP inner width one token goes through: `ffn_hidden` for a dense model; for a
        mixture of experts, `experts_per_token` x the expert's inner size plus a shared
        expert's."""
        if not self.is_moe:
            return self.ffn_hidden
        expert = self.moe_ffn_hidden or self.ffn_hidden
        return (self.experts_per_token or 1) * expert + (self.shared_ffn_hidden or 0)

    @property
    def active_params(self) -> int:
        """Parameters one token uses: `n_params` less the `experts` - `experts_per_token`
        experts it is not routed to in each layer (= `n_params` for a dense model). The
        embedding, the router and a shared expert count as active."""
        return int(self.__dict__["_active"])

    @property
    def non_embedding_params(self) -> int:
        """Parameters without the token embedding, position table and output projection
        (the count Kaplan et al. 2020 and the Pythia paper report)."""
        return self.layers * self.layer_params() + self._norm_params()

    def stage_params(self, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> int:
        """Parameters on one GPU of the largest pipeline stage (Megatron's layout, see
        the module docstring). Assumes `pipeline_parallel` divides `layers`."""
        t, p = tensor_parallel, pipeline_parallel
        layers = (self.layers // p) * self.layer_params(t)
        if p == 1:
            return layers + self.embedding_params(t) + self.output_params(t)
        first = layers + self.embedding_params(t)
        last = layers + self.output_params(t, own_copy=True)
        return max(first, last)

    def parallel_problems(
        self, tensor_parallel: int, pipeline_parallel: int, field: str = "tensor_parallel"
    ) -> list[Problem]:
        """What tensor/pipeline parallel sizes this shape cannot be split by."""
        p: list[Problem] = []
        t = tensor_parallel
        for name, size in (
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("ffn_hidden", None if self.is_moe else self.ffn_hidden),
            ("moe_ffn_hidden", self.moe_ffn_hidden),
            ("shared_ffn_hidden", self.shared_ffn_hidden),
        ):
            if size is not None and size % t:
                p.append(Problem(field, t, f"must divide `{name}`={size} evenly"))
        if self.layers % pipeline_parallel:
            p.append(
                Problem(
                    "pipeline_parallel",
                    pipeline_parallel,
                    f"must divide `layers`={self.layers} evenly",
                )
            )
        return p

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in FIELDS}


def _default_ffn(mlp: str, hidden: int) -> int:
    return swiglu_ffn_default(hidden) if mlp == _SWIGLU else 4 * hidden


#: The last fields built and their architecture: a panel re-estimates one shape on every
#: change and a planner estimates one shape in every layout; checking the fields again
#: each time cost a tenth of an estimate.
_LAST_BUILT: list[Any] = [None, None]


def build_architecture(fields: dict[str, Any]) -> tuple[Architecture | None, list[Problem]]:
    """(the architecture, []) or (None, every problem) for `fields` (see `Architecture`).

    Missing required fields are reported as one problem naming all of them; None values
    of optional fields take the defaults."""
    try:
        # the fields in their order (the same shape comes in the same order; another
        # order is only a miss) with their types (1 == 1.0 == True, yet they check apart)
        key: Any = (tuple(fields.items()), tuple(map(type, fields.values())))
        hash(key)
    except TypeError:  # an unhashable value: checked below, never remembered
        key = None
    if key is not None and _LAST_BUILT[0] == key:
        return _LAST_BUILT[1], []
    arch, problems = _build_architecture(fields)
    if key is not None and arch is not None:
        _LAST_BUILT[:] = [key, arch]
    return arch, problems


def _build_architecture(fields: dict[str, Any]) -> tuple[Architecture | None, list[Problem]]:
    p: list[Problem] = []
    unknown = sorted(set(fields) - set(FIELDS))
    for name in unknown:
        p.append(Problem(name, fields[name], f"unknown field; known: {', '.join(FIELDS)}"))
    v: dict[str, Any] = {}
    for name in REQUIRED:
        raw = fields.get(name)
        if raw is None:
            continue
        v[name], message = check_number(name, raw)  # see `limits` for the ranges
        if message is not None:
            p.append(Problem(name, raw, message))
    missing = [k for k in REQUIRED if fields.get(k) is None]
    if missing:
        need = ", ".join(f"`{k}`" for k in REQUIRED)
        also = f" (also missing: {', '.join(f'`{k}`' for k in missing[1:])})" if missing[1:] else ""
        p.append(
            Problem(
                missing[0], None, f"a transformer shape needs all of {need}{also}", missing=True
            )
        )
    for name in ("kv_heads", "ffn_hidden", "max_positions", *FIELD_BOUNDS):
        raw = fields.get(name)
        if raw is not None:
            v[name], message = check_number(name, raw, FIELD_BOUNDS.get(name))
            if message is not None:
                p.append(Problem(name, raw, message))
    for name, choices in _CHOICES.items():
        raw = fields.get(name)
        if raw is None:
            v[name] = choices[0]
            continue
        value = raw.strip().lower() if isinstance(raw, str) else None
        if value not in choices:
            p.append(Problem(name, raw, f"must be one of {', '.join(choices)}"))
        v[name] = value
    raw = fields.get("activation_function")
    if raw is not None:
        value = raw.strip().lower() if isinstance(raw, str) else None
        if value not in ACTIVATION_NAMES:
            message = f"must be one of {', '.join(ACTIVATION_NAMES)} (transformers' names)"
            p.append(Problem("activation_function", raw, message))
        v["activation_function"] = value
    for name, names in (("norm_impl", NORM_NAMES), ("eager_softmax", SOFTMAX_NAMES)):
        raw = fields.get(name)
        if raw is None:
            continue
        value = raw.strip().lower() if isinstance(raw, str) else None
        if value not in names:
            p.append(Problem(name, raw, f"must be one of {', '.join(names)}"))
        v[name] = value
    for name, default in (
        ("tied_embeddings", True),
        ("parallel_residual", False),
        ("causal", True),
        ("fused_qkv", False),
        ("qk_norm", False),
        ("post_norms", False),
    ):
        flag = as_bool(fields.get(name))
        if flag is None:
            flag = default
        elif not isinstance(flag, bool):
            p.append(Problem(name, flag, "must be True or False"))
        v[name] = flag

    h, a = v.get("hidden"), v.get("heads")
    if h is not None and a is not None and h % a and v.get("head_dim") is None:
        p.append(Problem("heads", fields["heads"], f"must divide `hidden`={h} evenly"))
    p.extend(_moe_problems(fields, v))
    k = v.get("kv_heads")
    if a is not None and k is not None and a % k:
        p.append(Problem("kv_heads", fields["kv_heads"], f"must divide `heads`={a} evenly"))
    rotary = v.get("positions") == _ROTARY
    if rotary and v.get("max_positions"):
        p.append(
            Problem(
                "max_positions",
                fields["max_positions"],
                "must be 0 or left out with rotary `positions` (no position table)",
            )
        )
    s, table = v.get("seq_len"), v.get("max_positions")
    if not rotary and s is not None and table is not None and table > 0 and s > table:
        p.append(
            Problem(
                "seq_len",
                fields["seq_len"],
                f"must not exceed the learned position table (`max_positions`={table})",
            )
        )
    if p or any(v.get(k) is None for k in REQUIRED):
        return None, p
    if v.get("kv_heads") is None:
        v["kv_heads"] = v["heads"]
    if v.get("ffn_hidden") is None:
        v["ffn_hidden"] = _default_ffn(v["mlp"], v["hidden"])
    if rotary:
        v["max_positions"] = 0
    elif v.get("max_positions") is None:
        v["max_positions"] = v["seq_len"]
    if v.get("head_dim") is None:
        v["head_dim"] = v["hidden"] // v["heads"]
    if v.get("activation_function") is None:
        v["activation_function"] = default_activation(v["mlp"])
    if v.get("norm_impl") is None:
        v["norm_impl"] = default_norm_impl(v["norm"])
    if v.get("eager_softmax") is None:
        v["eager_softmax"] = "fp32"
    if v.get("experts") is not None and v.get("moe_ffn_hidden") is None:
        v["moe_ffn_hidden"] = v["ffn_hidden"]
    resolved: dict[str, Any] = {k: v.get(k) for k in FIELDS}
    return Architecture(**resolved), []


def _moe_problems(fields: dict[str, Any], v: dict[str, Any]) -> list[Problem]:
    """What is wrong with the mixture-of-experts fields `v` read from `fields`: top-k
    without experts or more than them, expert sizes of a dense model."""
    p: list[Problem] = []
    experts, k = v.get("experts"), v.get("experts_per_token")
    if fields.get("experts") is None:
        for name in MOE_FIELDS[1:]:
            if fields.get(name) is not None:
                p.append(Problem(name, fields[name], "needs `experts` (a mixture of experts)"))
        return p
    if fields.get("experts_per_token") is None:
        message = "a mixture of experts needs `experts_per_token` (the experts each token uses)"
        p.append(Problem("experts_per_token", None, message, missing=True))
    elif experts is not None and k is not None and k > experts:
        message = f"must not exceed `experts`={experts}"
        p.append(Problem("experts_per_token", fields["experts_per_token"], message))
    return p


@lru_cache(maxsize=64)
def parameter_shapes(arch: Architecture) -> tuple[tuple[int, ...], ...]:
    """The parameter tensors' shapes of `arch` (torch's (out, in) for a linear layer), a
    tied output projection once: the token embedding and a learned position table; per
    layer two norms, the attention's Q, K and V projections (one fused (q + 2g, h) matrix
    where every linear layer has a bias and positions are learned, GPT-2's layout; three
    matrices otherwise, Llama's), its output projection, the MLP's matrices (each
    expert's, a shared expert's and the router's for a mixture of experts) and their
    biases; the final norm and an untied output projection. The count of these shapes is
    `arch.n_params`; a factored optimizer's states follow them. Cached per architecture
    (a frozen value): an estimate reads them on every call, and the same tuple object
    comes back, so what is derived from it can be cached too."""
    h, q, g = arch.hidden, arch.q_dim, arch.kv_dim
    norm: list[tuple[int, ...]] = [(h,), (h,)] if arch.norm == _LAYERNORM else [(h,)]
    all_biases = arch.bias == _BIAS_ALL
    qkv_bias = all_biases or arch.bias == _BIAS_QKV

    def mlp(inner: int) -> list[tuple[int, ...]]:
        first = [(inner, h)] * (2 if arch.mlp == _SWIGLU else 1)
        shapes: list[tuple[int, ...]] = [*first, (h, inner)]
        if all_biases:
            shapes += [(inner,)] * len(first) + [(h,)]
        return shapes

    if all_biases and arch.positions != _ROTARY:
        attention: list[tuple[int, ...]] = [(q + 2 * g, h), (q + 2 * g,)]
    else:
        attention = [(q, h), (g, h), (g, h)] + ([(q,), (g,), (g,)] if qkv_bias else [])
    attention += [(h, q)] + ([(h,)] if all_biases else [])
    if arch.experts is None:
        block = mlp(arch.ffn_hidden)
    else:
        block = mlp(arch.moe_ffn_hidden or arch.ffn_hidden) * arch.experts
        block += mlp(arch.shared_ffn_hidden) if arch.shared_ffn_hidden else []
        block += [(arch.experts, h)] + ([(arch.experts,)] if all_biases else [])
    layer = [*norm, *attention, *norm, *block]
    shapes: list[tuple[int, ...]] = [(arch.vocab, h)]
    if arch.max_positions:
        shapes.append((arch.max_positions, h))
    shapes += layer * arch.layers + norm
    if not arch.tied_embeddings:
        shapes.append((arch.vocab, h))
    return tuple(shapes)
