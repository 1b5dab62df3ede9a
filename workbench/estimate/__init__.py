"""Pure memory/compute estimator for training on GPUs (imports no torch).

    >>> from workbench.estimate import estimate_memory
    >>> e = estimate_memory(n_params=7.5e9, precision="fp16", optimizer="adam",
    ...                     zero_stage=3, gpus=64)
    >>> round(e.total_bytes / 1e9, 1)
    1.9

The answer is the peak of one training step (`peak`: model states as held at its highest
point, activations, the logits and loss, the optimizer's temporaries, autocast's casts,
the engines' buckets and gathered parameters); model states at rest follow the ZeRO
paper (`model_states`), stored activations Korthikanti et al. 2022 (`activations`,
with today's fused attention), GPU figures vendor data sheets (`catalog`). Models come from published
presets (`presets`), Hugging Face config.json files (`hf_config`), torch modules counted on
the meta device (`from_module`, the one place that imports torch, when called) or a shape
(`architecture`: GQA, SwiGLU, norms, biases, tied embeddings, and Megatron's tensor/pipeline
layout). Counts may be written as text, `7B` or `1.5e9` (`counts`). How these numbers differ
from DeepSpeed's `estimate_zero2/3_model_states_mem_needs*` and from
`accelerate estimate-memory`:

* DeepSpeed's functions cover model states only (no activations, no framework
  overhead), have no ZeRO-1 variant and assume Adam with 16-bit mixed precision. Without
  offload they give 2Ψ + 18Ψ/N bytes per GPU for stage 2 (we give 2Ψ + 14Ψ/N: they also
  count a 4-byte fp32 gradient partition) and 4·(largest layer) + 18Ψ/N for stage 3 (we
  give 16Ψ/N and no gathered-layer buffer). With offload their GPU figure is the 16-bit
  parameters only, as ours; their host figure is per node and carries a 1.5x buffer factor.
* accelerate's `estimate-memory` loads a model from the Hub and reports, for batch size
  1 and Adam only, the largest of its model / gradients / optimizer / step entries (not
  their sum), with no ZeRO, no activations and no multi-GPU sharding.

docs/estimator.md has the details.
"""

from workbench.estimate.activations import (
    ActivationBreakdown,
    Attention,
    Checkpointing,
    params_from_shape,
    transformer_activation_bytes,
)
from workbench.estimate.architecture import Architecture, Bias, Mlp, Norm, Positions
from workbench.estimate.catalog import GPUS, GpuSpec, find_gpu, get_gpu, gpu_names
from workbench.estimate.core import (
    DEFAULT_MFU,
    DEFAULT_OVERHEAD_GIB,
    GIB,
    MemoryEstimate,
    compare_engines,
    compare_stages,
    estimate_memory,
)
from workbench.estimate.counts import parse_count
from workbench.estimate.hf_config import FAMILIES, read_hf_config
from workbench.estimate.model_states import (
    ACCOUNTINGS,
    BytesPerParam,
    ModelStateQuery,
    ModelStates,
    bytes_per_param,
    model_state_bytes,
)
from workbench.estimate.peak import OPTIMIZER_IMPLS, PHASES, StepPeak
from workbench.estimate.presets import (
    MODELS,
    PRESETS,
    ModelPreset,
    find_model,
    get_model,
    model_names,
)
from workbench.estimate.problems import EstimateInputError, Problem
from workbench.estimate.reserve import Reserve

__all__ = [
    "ACCOUNTINGS",
    "OPTIMIZER_IMPLS",
    "PHASES",
    "Attention",
    "StepPeak",
    "Reserve",
    "FAMILIES",
    "MODELS",
    "PRESETS",
    "Architecture",
    "Bias",
    "Mlp",
    "ModelPreset",
    "Norm",
    "Positions",
    "find_model",
    "get_model",
    "model_names",
    "parse_count",
    "read_hf_config",
    "DEFAULT_MFU",
    "DEFAULT_OVERHEAD_GIB",
    "GIB",
    "GPUS",
    "ActivationBreakdown",
    "BytesPerParam",
    "Checkpointing",
    "EstimateInputError",
    "GpuSpec",
    "MemoryEstimate",
    "ModelStateQuery",
    "ModelStates",
    "Problem",
    "bytes_per_param",
    "compare_engines",
    "compare_stages",
    "estimate_memory",
    "find_gpu",
    "get_gpu",
    "gpu_names",
    "model_state_bytes",
    "params_from_shape",
    "transformer_activation_bytes",
]
