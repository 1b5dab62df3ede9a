"""Model presets: published architectures the estimator knows by name.

Each preset is a shape taken from its paper or released configuration; the parameter
count is computed from it (`Architecture.n_params`), never typed in. The published
totals the counts agree with are in each preset's `source`, and
tests/unit/test_estimate_models.py pins every one of them.

`seq_len` is the sequence length of the model's main pre-training stage (what the
activations are computed for unless a `seq_len` is given); rotary models can be estimated
at any length, learned position tables (GPT-2, GPT-3) only up to their size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from workbench.estimate.architecture import Architecture
from workbench.inputs import shown


@dataclass(frozen=True)
class ModelPreset:
    """A named architecture, its family (the Hugging Face `model_type`) and its sources."""

    name: str
    family: str
    architecture: Architecture
    source: str

    @property
    def n_params(self) -> int:
        return self.architecture.n_params


def _gpt2(name: str, layers: int, hidden: int, heads: int, published: str) -> ModelPreset:
    # the released config's activation_function: transformers' Python tanh GELU, whose
    # intermediates the MLP keeps (`activation_functions`); transformers' GPT-2 runs its
    # unfused softmax in the scores' dtype (`implementations`)
    return ModelPreset(
        name,
        "gpt2",
        Architecture.create(
            layers=layers,
            hidden=hidden,
            heads=heads,
            seq_len=1024,
            vocab=50257,
            fused_qkv=True,
            activation_function="gelu_new",
            eager_softmax="input",
        ),
        "Shape: Radford et al. 2019, 'Language Models are Unsupervised Multitask Learners', "
        "Table 2 (layers, d_model), and the released config.json (openai-community/"
        f"{name}: n_head {heads}, n_positions 1024, vocab 50257, tied output). "
        f"Published total: {published} parameters (KerasHub preset metadata for the "
        "released checkpoint; model card github.com/openai/gpt-2 model_card.md).",
    )


def _llama(
    name: str,
    family: str,
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn_hidden: int,
    vocab: int,
    seq_len: int,
    source: str,
    bias: str = "none",
    experts: int | None = None,
    experts_per_token: int | None = None,
) -> ModelPreset:
    return ModelPreset(
        name,
        family,
        Architecture.create(
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            ffn_hidden=ffn_hidden,
            vocab=vocab,
            seq_len=seq_len,
            mlp="swiglu",
            norm="rmsnorm",
            bias=bias,
            positions="rotary",
            tied_embeddings=False,
            experts=experts,
            experts_per_token=experts_per_token,
        ),
        source,
    )


_LLAMA2 = (
    "Shape: Touvron et al. 2023, 'Llama 2: Open Foundation and Fine-Tuned Chat Models', "
    "Table 1 (context 4k, GQA for 34B/70B) and the released config.json "
    "(meta-llama/Llama-2-{size}-hf). "
)
_LLAMA3 = (
    "Shape: Llama Team 2024, 'The Llama 3 Herd of Models', Table 3 (layers, model "
    "dimension, FFN dimension, heads, 8 key/value heads, vocabulary 128,000 plus 256 "
    "special tokens in config.json = 128,256), pre-training sequence length 8,192 "
    "(Section 3.4.1), and the released config.json. "
)

PRESETS: tuple[ModelPreset, ...] = (
    _gpt2("gpt2", 12, 768, 12, "124,439,808"),
    _gpt2("gpt2-medium", 24, 1024, 16, "354,823,168"),
    _gpt2("gpt2-large", 36, 1280, 20, "774,030,080"),
    _gpt2("gpt2-xl", 48, 1600, 25, "1,557,611,200"),
    ModelPreset(
        "gpt3-175b",
        "gpt2",
        # trained with Megatron-LM's fused bias-GELU (Narayanan et al. 2021), one op that
        # keeps its input: the default `gelu`, not GPT-2's Python formula
        Architecture.create(
            layers=96, hidden=12288, heads=96, seq_len=2048, vocab=50257, fused_qkv=True
        ),
        "Shape: Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1 "
        "(96 layers, d_model 12288, 96 heads, context 2048; GPT-2's 50,257-token BPE, "
        "Section 2.1: 'the same model and architecture as GPT-2'). Published total: "
        "175.0B (Table 2.1) and 174.6B for this shape in Narayanan et al. 2021, "
        "'Efficient Large-Scale Language Model Training on GPU Clusters', Table 1.",
    ),
    _llama(
        "llama-2-7b",
        "llama",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=32,
        ffn_hidden=11008,
        vocab=32000,
        seq_len=4096,
        source=_LLAMA2.format(size="7b") + "Published total: 6,738,415,616 (KerasHub "
        "preset llama2_7b_en; the Hugging Face checkpoint stores 6,738,417,664 values, "
        "which include 32 rotary inv_freq buffers of 64).",
    ),
    _llama(
        "llama-2-13b",
        "llama",
        layers=40,
        hidden=5120,
        heads=40,
        kv_heads=40,
        ffn_hidden=13824,
        vocab=32000,
        seq_len=4096,
        source=_LLAMA2.format(size="13b") + "Published total: 13,015,866,880 values in "
        "the Hugging Face checkpoint (model page, safetensors), of which 40 x 64 are "
        "rotary inv_freq buffers, not parameters.",
    ),
    _llama(
        "llama-2-70b",
        "llama",
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        ffn_hidden=28672,
        vocab=32000,
        seq_len=4096,
        source=_LLAMA2.format(size="70b") + "Published total: 68,976,653,312 values in "
        "the Hugging Face checkpoint (model page, safetensors), of which 80 x 64 are "
        "rotary inv_freq buffers, not parameters.",
    ),
    _llama(
        "llama-3-8b",
        "llama",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn_hidden=14336,
        vocab=128256,
        seq_len=8192,
        source=_LLAMA3 + "Published total: 8,030,261,248 (Hugging Face model page "
        "meta-llama/Meta-Llama-3-8B, safetensors; KerasHub preset llama3_8b_en).",
    ),
    _llama(
        "llama-3-70b",
        "llama",
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        ffn_hidden=28672,
        vocab=128256,
        seq_len=8192,
        source=_LLAMA3 + "Published total: 70,553,706,496 (Hugging Face model pages "
        "meta-llama/Meta-Llama-3-70B and Llama-3.1-70B, safetensors).",
    ),
    _llama(
        "llama-3.1-405b",
        "llama",
        layers=126,
        hidden=16384,
        heads=128,
        kv_heads=8,
        ffn_hidden=53248,
        vocab=128256,
        seq_len=8192,
        source=_LLAMA3 + "Published total: 405,853,388,800 (Hugging Face model page "
        "meta-llama/Llama-3.1-405B, safetensors).",
    ),
    _llama(
        "mistral-7b",
        "mistral",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn_hidden=14336,
        vocab=32000,
        seq_len=8192,
        source="Shape: Jiang et al. 2023, 'Mistral 7B', Table 1 (dim 4096, 32 layers, "
        "head_dim 128, hidden_dim 14336, 32 heads, 8 kv heads, context_len 8192, vocab "
        "32000) and the released config.json (mistralai/Mistral-7B-v0.1). Published "
        "total: 7,241,732,096 (KerasHub preset mistral_7b_en; Hugging Face model page).",
    ),
    _llama(
        "mixtral-8x7b",
        "mixtral",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn_hidden=14336,
        vocab=32000,
        seq_len=32768,
        experts=8,
        experts_per_token=2,
        source="Shape: Jiang et al. 2024, 'Mixtral of Experts', Table 1 (dim 4096, 32 "
        "layers, head_dim 128, hidden_dim 14336, 32 heads, 8 kv heads, context_len 32768, "
        "vocab 32000, 8 experts, top-2) and the released config.json "
        "(mistralai/Mixtral-8x7B-v0.1: untied output, SwiGLU experts, router without "
        "bias). Published total: 46,702,792,704 (KerasHub preset mixtral_8_7b_en); "
        "46.7B total and 12.9B active per token (Mistral AI, 'Mixtral of experts', "
        "December 2023; the paper rounds them to 47B and 13B).",
    ),
    _llama(
        "qwen2.5-7b",
        "qwen2",
        layers=28,
        hidden=3584,
        heads=28,
        kv_heads=4,
        ffn_hidden=18944,
        vocab=152064,
        seq_len=4096,
        bias="qkv",
        source="Shape: Qwen Team 2024, 'Qwen2.5 Technical Report', Table 1 (28 layers, "
        "28 query / 4 key-value heads, untied embeddings; pre-training at 4,096 tokens "
        "before the long-context stage) and the released config.json (Qwen/Qwen2.5-7B: hidden 3584, "
        "intermediate 18944, vocab 152064; Q/K/V biases in Qwen2Attention). Published "
        "total: 7,615,616,512 (Hugging Face model page, safetensors); the model card "
        "gives 7.61B total and 6.53B non-embedding.",
    ),
    ModelPreset(
        "pythia-1.4b",
        "gpt_neox",
        Architecture.create(
            layers=24,
            hidden=2048,
            heads=16,
            seq_len=2048,
            vocab=50304,
            positions="rotary",
            tied_embeddings=False,
            parallel_residual=True,
            fused_qkv=True,
        ),
        "Shape: Biderman et al. 2023, 'Pythia: A Suite for Analyzing Large Language "
        "Models', Table 1 (24 layers, model dim 2048, 16 heads; sequence length 2048) and "
        "the released config.json (EleutherAI/pythia-1.4b: vocab 50304, untied, rotary, "
        "parallel residual). "
        "Published: 1,208,602,624 non-embedding parameters (Table 1) and 1,414,647,808 "
        "in total (EleutherAI/pythia README).",
    ),
)

MODELS: dict[str, ModelPreset] = {p.name: p for p in PRESETS}


def model_names() -> list[str]:
    return list(MODELS)


def _key(name: str) -> str:
    return re.sub(r"[\s_\-.]", "", name.strip().lower().rsplit("/", 1)[-1])


_BY_KEY = {_key(n): p for n, p in MODELS.items()}


def find_model(name: object) -> ModelPreset | str:
    """The preset called `name` (case, dashes, dots and an `org/` prefix are ignored:
    `Llama-3-8B`, `meta-llama/llama-3-8b`), or an error message naming the known ones."""
    known = ", ".join(MODELS)
    if not isinstance(name, str) or not name.strip():
        return f"must be a model name ({known})"
    preset = _BY_KEY.get(_key(name))
    if preset is not None:
        return preset
    import difflib  # only for a name that is not known

    close = difflib.get_close_matches(_key(name), list(_BY_KEY), n=1, cutoff=0.75)
    hint = f"did you mean {_BY_KEY[close[0]].name}? " if close else ""
    return f"unknown model; {hint}known: {known}"


def get_model(name: str) -> ModelPreset:
    """`find_model` that raises `ValueError` for an unknown name."""
    found = find_model(name)
    if isinstance(found, str):
        raise ValueError(f"model={shown(name)}: {found}")
    return found
