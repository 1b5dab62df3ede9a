"""GPU catalog: memory capacity and peak dense throughput from vendor data sheets.

Figures are *dense* (no 2:4 sparsity) peak rates in FLOP/s. `peak_fp32_flops` is the
non-tensor-core FP32 rate; `peak_tf32_flops` is the TF32 tensor-core rate where the part
has one. 16-bit tensor rates are with FP32 accumulate (what training uses; GeForce parts
run FP16-accumulate twice as fast, which training does not use).

Memory: `memory_bytes` is what a CUDA (or ROCm) program can use on the part: the total
PyTorch reports ("GPU 0 has a total capacity of 79.11 GiB" in its out-of-memory message,
`torch.cuda.mem_get_info()[1]`), which the caching allocator, the CUDA context and NCCL
share, so the fit verdict is held against it. It is less than the data sheet's capacity
(`data_sheet_bytes`, read as binary units: an "80GB" part has 80 GiB): the driver keeps
part of the memory, GDDR parts with ECC on (T4, A10G, L4, L40S) show 6-8% less, an H100
1.1% less. Each figure is a published measurement (`memory_source`); where reports of one
part differ (driver, CUDA and ECC settings move it by up to about 0.3 GiB), the lowest
is taken, so a setup said to fit fits on each reported system.

The CUDA context and NCCL's channels (`CONTEXTS`, `context_of`, `nccl_channels`): what a
process holds on the GPU beside the caching allocator's segments, per GPU generation, each
figure with its source and whether it was measured or is assumed. `workbench.estimate.
reserve` adds them to the allocator's reserve.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from workbench.inputs import shown

_GIB = 1 << 30
_T = 1e12


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator: capacity in bytes, peak dense rates in FLOP/s (None: not supported)."""

    name: str
    description: str
    memory_bytes: int
    peak_fp16_flops: float
    peak_bf16_flops: float | None
    peak_fp32_flops: float
    peak_tf32_flops: float | None
    source: str
    data_sheet_bytes: int = 0
    memory_source: str = ""

    def peak_flops(self, sixteen_bit: bool, *, bf16: bool = False) -> float | None:
        """The peak rate training runs at: 16-bit tensor rate, or plain FP32."""
        if not sixteen_bit:
            return self.peak_fp32_flops
        return self.peak_bf16_flops if bf16 else self.peak_fp16_flops


_V100_SRC = "NVIDIA Tesla V100 data sheet (SXM2): FP32 15.7 TFLOPS, tensor 125 TFLOPS"
_A100_SRC = (
    "NVIDIA A100 Tensor Core GPU data sheet (SXM): FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS dense"
)
_H100_SRC = (
    "NVIDIA H100 Tensor Core GPU data sheet (SXM): FP32 67, TF32 494.5, BF16/FP16 989.5 TFLOPS "
    "dense (the sheet lists the sparse rates: TF32 989, BF16/FP16 1979)"
)

# fmt: off
# name, description, memory GiB, FP16, BF16, FP32, TF32 (dense TFLOPS; None: not supported),
# source.
_TABLE: tuple[tuple[str, str, int, float, float | None, float, float | None, str], ...] = (
    ("v100-16gb", "NVIDIA V100 SXM2 16 GB (HBM2)", 16, 125, None, 15.7, None, _V100_SRC),
    ("v100-32gb", "NVIDIA V100 SXM2 32 GB (HBM2)", 32, 125, None, 15.7, None, _V100_SRC),
    ("t4", "NVIDIA T4 16 GB (GDDR6)", 16, 65, None, 8.1, None,
     "NVIDIA T4 Tensor Core GPU data sheet: FP32 8.1, mixed FP16/FP32 65 TFLOPS"),
    ("a10g", "NVIDIA A10G 24 GB (GDDR6, AWS EC2 G5)", 24, 70, 70, 35, 35,
     "No NVIDIA data sheet exists for the AWS-only A10G; figures published for AWS EC2 G5 "
     "(e.g. Baseten, 'NVIDIA A10 vs A10G'): FP32 35, TF32 35, BF16/FP16 70 TFLOPS dense "
     "(the A10's own sheet lists FP32 31.2, BF16/FP16 125)"),
    ("l4", "NVIDIA L4 24 GB (GDDR6)", 24, 121, 121, 30.3, 60,
     "NVIDIA L4 Tensor Core GPU data sheet: FP32 30.3, TF32 60, BF16/FP16 121 TFLOPS dense "
     "(sparse: TF32 120, BF16/FP16 242)"),
    ("rtx-3090", "NVIDIA GeForce RTX 3090 24 GB (GDDR6X)", 24, 71, 71, 35.6, 35.6,
     "NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3090: FP32 35.6, TF32 35.6, "
     "FP16/BF16 with FP32 accumulate 71 TFLOPS dense"),
    ("rtx-4090", "NVIDIA GeForce RTX 4090 24 GB (GDDR6X)", 24, 165.2, 165.2, 82.6, 82.6,
     "NVIDIA Ada GPU architecture whitepaper, RTX 4090: FP32 82.6, TF32 82.6, FP16/BF16 with "
     "FP32 accumulate 165.2 TFLOPS dense"),
    ("a100-40gb", "NVIDIA A100 SXM4 40 GB (HBM2)", 40, 312, 312, 19.5, 156, _A100_SRC),
    ("a100-80gb", "NVIDIA A100 SXM4 80 GB (HBM2e)", 80, 312, 312, 19.5, 156, _A100_SRC),
    ("l40s", "NVIDIA L40S 48 GB (GDDR6)", 48, 362.05, 362.05, 91.6, 183,
     "NVIDIA L40S GPU data sheet: FP32 91.6, TF32 183, BF16/FP16 362.05 TFLOPS dense "
     "(sparse: TF32 366, BF16/FP16 733)"),
    ("h100-80gb", "NVIDIA H100 SXM5 80 GB (HBM3)", 80, 989.5, 989.5, 67, 494.5, _H100_SRC),
    ("h200-141gb", "NVIDIA H200 SXM 141 GB (HBM3e)", 141, 989.5, 989.5, 67, 494.5,
     "NVIDIA H200 Tensor Core GPU data sheet (SXM): 141 GB, FP32 67, TF32 494.5, BF16/FP16 "
     "989.5 TFLOPS dense (same compute as the H100 SXM)"),
    ("mi300x", "AMD Instinct MI300X 192 GB (HBM3)", 192, 1307.4, 1307.4, 163.4, 653.7,
     "AMD Instinct MI300X data sheet: FP32 vector 81.7 / matrix 163.4, TF32 653.7, BF16/FP16 "
     "1307.4 TFLOPS dense; FP32 here is the matrix rate"),
)
# fmt: on


def _tflops(x: float | None) -> float | None:
    return None if x is None else x * _T


# fmt: off
#: What PyTorch reports as the part's total memory (GiB), each from a published run naming
#: the GPU: the lowest where reports differ.
_VISIBLE: dict[str, tuple[float, str]] = {
    "v100-16gb": (15.78, "kchengiva/Shift-GCN#34: '(GPU 0; 15.78 GiB total capacity' on a 16 GB "
                  "V100; nvidia-smi 'Tesla V100-SXM2 ... 16160MiB' (15.78 GiB), "
                  "microsoft/Bringing-Old-Photos-Back-to-Life#19"),
    "v100-32gb": (31.74, "liucongg/ChatGLM-Finetuning#73: '(GPU 0; 31.74 GiB total capacity' "
                  "on a V100 32GB"),
    "t4": (14.56, "Zheng-Chong/CatVTON#133: '14.56 GiB total capacity' on a GCP Tesla T4; "
           "14.75 GiB on Colab's T4 (hpcaitech/Open-Sora#697); nvidia-smi 15360MiB"),
    "a10g": (22.49, "AUTOMATIC1111/stable-diffusion-webui#1259: '(GPU 0; 22.49 GiB total "
             "capacity' on an A10G; nvidia-smi 23028MiB"),
    "l4": (22.03, "ArcInstitute/evo2#190: 'GPU 0 has a total capacity of 22.03 GiB' on an L4; "
           "nvidia-smi 23034MiB"),
    "rtx-3090": (23.70, "Lightning-AI/lit-llama#137: '(GPU 0; 23.70 GiB total capacity' on an "
                 "RTX 3090 24GB"),
    "rtx-4090": (23.52, "Soul-AILab/SoulX-FlashTalk#5: '23.52 GiB' on a 4090 24G; 23.64 "
                 "(TMElyralab/MuseTalk#76) and 23.68 GiB (zai-org/CogVideo#36) elsewhere; "
                 "nvidia-smi 24564MiB"),
    "a100-40gb": (39.50, "wdwd720/BrainIR research/phase4/GPU_BENCHMARK.json: NVIDIA "
                  "A100-SXM4-40GB, gpu_mem_gb 39.5 (torch 2.14, driver 580.95.05); nvidia-smi "
                  "40960MiB"),
    "a100-80gb": (79.14, "lianqi1008/Control-GIC#6: '79.14 GiB total capacity' on an A100 "
                  "80GB; 79.25 GiB in levihsu/OOTDiffusion#235; nvidia-smi 81920MiB"),
    "l40s": (44.42, "stepfun-ai/Step-Video-T2V#8: 'has a total capacity of 44.42 GiB' on 8 "
             "L40S; nvidia-smi 46068MiB"),
    "h100-80gb": (79.11, "vllm-project/vllm#27508: 'GPU 0 has a total capacity of 79.11 GiB' "
                  "on an H100; 79.19 GiB on an 'NVIDIA H100 80GB HBM3' elsewhere; nvidia-smi "
                  "81559MiB (huggingface/text-generation-inference#2572)"),
    "h200-141gb": (139.81, "vllm-project/vllm#34553: 'NVIDIA H200 (139.81 GiB)', 'GPU 5 has a "
                   "total capacity of 139.81 GiB'; nvidia-smi 143771MiB"),
    "mi300x": (191.98, "vllm-project/vllm#7951: 'HIP out of memory ... GPU 0 has a total "
               "capacity of 191.98 GiB' on MI300X; ROCm/ROCm#4203: total_memory=196592MB"),
}
# fmt: on

GPUS: dict[str, GpuSpec] = {
    row[0]: GpuSpec(
        name=row[0],
        description=row[1],
        memory_bytes=round(_VISIBLE[row[0]][0] * _GIB),
        data_sheet_bytes=row[2] * _GIB,
        memory_source=_VISIBLE[row[0]][1],
        peak_fp16_flops=row[3] * _T,
        peak_bf16_flops=_tflops(row[4]),
        peak_fp32_flops=row[5] * _T,
        peak_tf32_flops=_tflops(row[6]),
        source=row[7],
    )
    for row in _TABLE
}

# Vendor, brand, form-factor and memory-type words carry no size information; dropping them
# lets the names drivers report match (`torch.cuda.get_device_name()` / `nvidia-smi` give
# e.g. "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB").
# "pcie" and "nvl" are kept on purpose: those boards have other peak rates than the SXM
# parts in the catalog, so they stay unknown names.
_NOISE = (
    "nvidia",
    "amd",
    "instinct",
    "geforce",
    "tesla",
    "rtx",
    "sxm5",
    "sxm4",
    "sxm2",
    "sxm",
    "hbm3e",
    "hbm3",
    "hbm2e",
    "hbm2",
    "gddr6x",
    "gddr6",
)


@lru_cache(maxsize=256)
def _compact(name: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    for word in _NOISE:
        key = key.replace(word, "")
    return key[:-2] if key.endswith("gb") else key


def _aliases() -> dict[str, str]:
    table: dict[str, str] = {}
    for name, spec in GPUS.items():
        table[_compact(name)] = name
        gib = spec.data_sheet_bytes // _GIB
        base = _compact(name)
        if base.endswith(str(gib)):
            base = base[: -len(str(gib))]
        table.setdefault(base + str(gib), name)
    # A bare family name is enough when the family has one size in the catalog.
    families: dict[str, list[str]] = {}
    for name in GPUS:
        families.setdefault(_compact(name.split("-")[0]), []).append(name)
    for family, members in families.items():
        if len(members) == 1:
            table.setdefault(family, members[0])
    table.setdefault("3090", "rtx-3090")
    table.setdefault("4090", "rtx-4090")
    return table


_ALIASES = _aliases()
_AMBIGUOUS = {
    fam: [n for n in GPUS if _compact(n.split("-")[0]) == fam]
    for fam in {_compact(n.split("-")[0]) for n in GPUS}
}
_AMBIGUOUS = {k: v for k, v in _AMBIGUOUS.items() if k and len(v) > 1}


@dataclass(frozen=True)
class ContextFigure:
    """The CUDA context one process holds on one GPU (bytes), and where the figure comes
    from: `measured` True for a figure measured on that generation with a recent torch,
    False where it is assumed from another generation's or a generic measurement."""

    generation: str
    bytes: int
    measured: bool
    source: str


_MIB = 1 << 20
_LAZY_GENERIC = (
    "ptrblck (NVIDIA), pytorch/pytorch#109888 and #107667: the CUDA context takes about "
    "300-400 MB with CUDA >= 11.7 and lazy module loading (torch's default since 1.13, "
    "pytorch/pytorch#86509; CUDA's own default on Linux since 12.2); >1000 MB before"
)
# fmt: off
#: The CUDA context per GPU generation, with lazy module loading (CUDA_MODULE_LOADING=LAZY,
#: set by torch >= 1.13 and CUDA's default since 12.2, NVIDIA's CUDA programming guide,
#: "Lazy Loading"). The context grows as a step loads more kernels; these are the figures
#: right after the first CUDA call, not counting what cuBLAS/cuDNN allocate through the
#: caching allocator (that is in torch's reserved figure).
#: What sets the size with lazy loading is the part, not the torch or CUDA release: the
#: measured figures (CUDA 12.8-13.0 where stated) run from 256 MiB on an RTX 3090 (82 SMs, 24 GB)
#: through 414 MiB on an A800 (108 SMs, 80 GB) to 520-534 MiB on H200/H100 (132 SMs); a
#: B200 (148 SMs) shows 612 MiB (unslothai/unsloth#8669, torch mem_get_info; no catalog
#: entry). What moves it by release is eager loading (`EAGER_CONTEXT`: 2.3x the lazy figure
#: in the torch 1.13 change; torch built with CUDA < 11.7 loads eagerly).
#: Each figure is a process's own line in nvidia-smi (per-PID) holding a primary context
#: and no allocator segments. The A800 and H200 figures are of contexts a transfer library
#: (Mooncake) created in a serving process, not torch's: with lazy loading both are the
#: driver's per-context state plus the modules loaded so far. On Hopper the two kinds agree
#: (the H200's 520 MiB, a torch process's 534 MiB on an H100); GA100 has no torch figure.
CONTEXTS: dict[str, ContextFigure] = {
    "volta": ContextFigure("volta", 287_047_680, False,
        "pytorch/pytorch#86509 (torch 1.13, CUDA 11.7, GPU not named): 287,047,680 bytes "
        "after one tensor with lazy loading (666,632,192 eager); assumed for Volta/Turing"),
    "ampere": ContextFigure("ampere", 256 * _MIB, True,
        "invoke-ai/InvokeAI#9413: 256 MiB bare context on an RTX 3090 (torch 2.7.1+cu128, "
        "driver 610); measured on GA102, used for the A10G (GA102 too)"),
    "ampere-dc": ContextFigure("ampere-dc", 414 * _MIB, True,
        "kvcache-ai/Mooncake#3973 (2026-09): ~414 MiB per process in nvidia-smi for a "
        "primary context a runtime call created on an A800 (GA100, the A100's die; CUDA "
        "12.9, per-process nvidia-fd tracking); measured on GA100, used for A100 40/80 GB"),
    "ada": ContextFigure("ada", 426 * _MIB, True,
        "unslothai/unsloth-zoo#1053: 426 MiB in nvidia-smi after torch.cuda.mem_get_info on "
        "an RTX 6000 Ada (torch 2.10+cu130); measured on AD102, assumed for L4/L40S"),
    "hopper": ContextFigure("hopper", 534 * _MIB, True,
        "meta-pytorch/torchcomms#777 (2026-02): 'On H100, each primary context costs "
        "~534 MiB' (a stray context a torch rank's NCCL watchdog thread created on GPU 0; "
        "torch/CUDA release not stated); kvcache-ai/Mooncake#3973: ~520 MiB on an H200 "
        "(CUDA 12.9); measured on GH100, the H100's figure used for H100 and H200"),
    "cdna3": ContextFigure("cdna3", 400 * 10**6, False,
        "no ROCm/HIP context figure found for MI300X (searched ROCm, vLLM's ROCm memory "
        "profiling (vllm-project/vllm#43236 says ROCm's start-up overhead is larger than "
        "CUDA's, with no figure), unsloth's amd-smi change, LUMI's AI guide); assumed as "
        "the generic 400 MB"),
}
#: Without lazy module loading (torch built with CUDA < 11.7, or CUDA_MODULE_LOADING=EAGER)
#: every kernel of every library is loaded at the first CUDA call.
EAGER_CONTEXT = ContextFigure("eager", 666_632_192, True,
    "pytorch/pytorch#86509: 666,632,192 bytes with CUDA_MODULE_LOADING=DEFAULT (eager) "
    "against 287,047,680 lazy, same GPU and torch 1.13")
#: Without a GPU named: the generic lazy-loading figure.
GENERIC_CONTEXT = ContextFigure("unknown", 400 * 10**6, False, _LAZY_GENERIC)

#: Each catalog GPU's generation (a key of `CONTEXTS`) and the NCCL channels one
#: communicator opens on it. NCCL picks its channels from the topology at run time
#: (`NCCL_DEBUG=INFO` logs "N coll channels"; NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS
#: bound them, NCCL's environment-variable docs); the counts here are assumed: 32 on
#: NVLink4 (H100/H200, NCCL's MAXCHANNELS), 16 on NVLink3/2 (A100, V100), 4 on PCIe parts.
GENERATIONS: dict[str, tuple[str, int]] = {
    "v100-16gb": ("volta", 16), "v100-32gb": ("volta", 16), "t4": ("volta", 4),
    "a10g": ("ampere", 4), "l4": ("ada", 4), "rtx-3090": ("ampere", 4),
    "rtx-4090": ("ada", 4), "a100-40gb": ("ampere-dc", 16), "a100-80gb": ("ampere-dc", 16),
    "l40s": ("ada", 4), "h100-80gb": ("hopper", 32), "h200-141gb": ("hopper", 32),
    "mi300x": ("cdna3", 16),
}
# fmt: on


def context_of(gpu: str | None, *, lazy: bool = True) -> ContextFigure:
    """The CUDA context on catalog GPU `gpu` (None: no GPU named), lazy or eager loading."""
    if not lazy:
        return EAGER_CONTEXT
    if gpu is None or gpu not in GENERATIONS:
        return GENERIC_CONTEXT
    return CONTEXTS[GENERATIONS[gpu][0]]


def nccl_channels(gpu: str | None) -> int:
    """The NCCL channels one communicator opens on catalog GPU `gpu` (assumed, see
    `GENERATIONS`; 16 without a GPU named)."""
    return GENERATIONS[gpu][1] if gpu is not None and gpu in GENERATIONS else 16


def gpu_names() -> list[str]:
    """Canonical catalog names, in catalog order."""
    return list(GPUS)


def find_gpu(name: str) -> GpuSpec | str:
    """The spec for a forgiving `name` (`h100`, `H100-80GB`, `a100 80gb`, `RTX 4090` ...),
    or a one-line reason why there is none (unknown or ambiguous name)."""
    if not isinstance(name, str):
        return f"must be a GPU name, one of {', '.join(GPUS)}"
    key = _compact(name)
    if not key:
        return f"must be a GPU name, one of {', '.join(GPUS)}"
    hit = _ALIASES.get(key)
    if hit is not None:
        return GPUS[hit]
    if key in _AMBIGUOUS:
        return f"is ambiguous: say which one of {', '.join(_AMBIGUOUS[key])}"
    return f"unknown GPU; known GPUs: {', '.join(GPUS)}"


def get_gpu(name: str) -> GpuSpec:
    """Like `find_gpu` but raises `ValueError` naming the value and the known names."""
    found = find_gpu(name)
    if isinstance(found, str):
        raise ValueError(f"gpu={shown(name)}: {found}")
    return found
