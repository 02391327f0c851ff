"""Physical constants of the cost model, each with its source.

These are not fitted to any one training run: each is a property of the hardware or the software
stack, taken from a published measurement. A hardware profile may override the efficiencies with
its own measurement (``plan profile --calibrate`` writes one).
"""

# Achieved fraction of the datasheet dense bf16 peak for large, well-shaped matmuls ("maximum
# achievable matmul FLOPS"): A100-SXM 267.9 of 312 TFLOP/s = 85.9%, H100-SXM 792.1 of 989 = 80.1%,
# GH200 821 of 989 = 83.0% (S. Bekman, ml-engineering, compute/accelerator, MAMF table, measured
# with CUDA 12). The bundled profiles carry their GPU's own figure (``matmul_efficiency``); this is
# the default for a profile without one.
MATMUL_EFFICIENCY = 0.85

# Achieved fraction of peak of a flash-attention kernel, forward and backward together, for a
# profile without its own ``attention_efficiency``: FlashAttention-2 reaches 50-73% of A100 peak
# forward and somewhat less backward (Dao 2023, "FlashAttention-2", §4.1, Fig. 5-6): 0.6 for the
# pair. On H100 the same kernel reaches only ~35% (Shah et al. 2024, "FlashAttention-3", §1), which
# the H100/H200 profiles say.
ATTENTION_EFFICIENCY = 0.6

# Achieved fraction of datasheet HBM bandwidth for streaming kernels (copies, elementwise ops):
# about 90% (copy and read-read-write probes on H100/H200-class parts; NVIDIA's STREAM-like
# bandwidth tests report 88-92% of peak).
MEMORY_EFFICIENCY = 0.9

# Achieved fraction of the per-GPU NVLink bandwidth by NCCL ring collectives at large message
# sizes: nccl-tests bus bandwidth reaches ~230-240 GB/s of 300 GB/s on DGX A100 NVLink (NVIDIA
# nccl-tests performance notes; Megatron-LM 2021 §5.9 reports 892 GB/s bidirectional all-reduce
# bandwidth per node pair), and NCCL's own topology model rates an NVLink at 20 GB/s for SM80 and
# 20.6 for SM90 of the 25 GB/s each way a link carries (NVIDIA/nccl src/graph/topo.h
# "#define SM80_NVLINK_BW 20.0", "#define SM90_NVLINK_BW 20.6"): 0.80-0.82. 0.8 is the rounded
# ratio. (Until issue #15 this figure derated the NICs as well; see NIC_EFFICIENCY.)
NETWORK_EFFICIENCY = 0.8

# Achieved fraction of the NICs' line rate by NCCL collectives at large message sizes, all NICs of
# a node busy. "on DGX with 8 NICs and a top speed of 190 GB/s" (S. Jeaugey, NVIDIA/nccl issue
# #689: eight 200 Gb/s HDR NICs = 200 GB/s, 0.95); nccl-tests all_reduce_perf on 2 x 8 A100-80GB
# with 8 HDR HCAs per node reads 194.06 GB/s bus bandwidth at 2 GiB (dstackai/dstack
# examples/clusters/crusoe/README.md @33be4e79: 0.97) and on 2 x 8 H100 with 8 x 400 Gb/s 392.29
# GB/s at 4 GiB (wutz/k8s-in-action ai/nccl-tests/README.md @aed28ba: 0.98). NCCL's own model
# takes a NIC at its line rate. 0.95, the lowest of the three. A profile's network_efficiency
# scales it by the same factor (comm.efficiencies).
NIC_EFFICIENCY = 0.95

# Latency of one NCCL ring step (per hop): ~5 us within a node, ~10 us across InfiniBand
# (nccl-tests small-message latency on DGX A100). Used for tensor-parallel collectives and
# pipeline transfers; data-parallel collectives take NCCL's own latency model (cost/nccl.py).
INTRA_NODE_LATENCY_S = 5e-6
INTER_NODE_LATENCY_S = 10e-6

# Least time one eager PyTorch kernel costs, however little it moves: the host dispatches eager
# ops one by one, and a kernel shorter than the next dispatch leaves the GPU waiting. PyTorch's
# auto-parallel planner prices every operator so: "Adding the `kernel_launch_overhead` means that
# operators cost at least 7us to run." (F. Massa, meta-pytorch/autoparallel pull request #146,
# 2025, "Use better cost model for compute"; "Those values were empirically obtained by
# minimizing the runtime over a set of examples on H100 GPUs"). Applied to eager element-wise
# kernels (cost/elementwise.py); fused stacks' kernels are taken to outlast their launch.
EAGER_KERNEL_MIN_S = 7e-6

# Memory the framework needs beyond the tensors the model formulas count. Outside PyTorch's
# allocator: the CUDA context (1.2-1.6 GiB on A100, measured with nvidia-smi by BigScience,
# bigscience train/tr11-176B-ml/chronicles-prequel.md), NCCL's per-communicator buffers and cuBLAS
# workspaces: 2 GiB.
RESERVED_BYTES = 2 * 1024**3

# Share of the caching allocator's reserved memory that holds no tensor (fragmentation,
# 1 - allocated/reserved).
# - Steady tensor sizes reuse their freed blocks and waste little: 5% is our assumption, not a
#   published figure (PyTorch's CUDA semantics notes describe the caching allocator and its
#   fragmentation, but give no number).
# - Activation recomputation frees and rebuilds a layer's activations once per microbatch, the
#   irregular pattern that splits cached blocks. What is published is how much fragmentation a
#   better allocator removes: "GMLake can reduce an average of 9.2 GB (up to 25 GB) GPU memory
#   usage and 15% (up to 33% ) fragmentation among eight LLM models on GPU A100 with 80 GB memory"
#   (Guo et al. 2024, "GMLake", ASPLOS, abstract). So PyTorch's allocator loses at least that
#   much there; 15% takes the reduction as a floor on the fragmentation itself.
#   Chosen with a validation result in view: BLOOM's topology sweep (nvidia-smi, full recompute)
#   is predicted 1.9-2.9% under the readings with 15%, 12-13% under with 5% (plan validate).
#   It is full recompute's share; a selective recompute that discards only some outputs
#   (Megatron's output-discarding modules) takes part of the surcharge: cost/fragmentation.py.
FRAGMENTATION = 0.05
RECOMPUTE_FRAGMENTATION = 0.15

# SMs an NCCL collective occupies while it runs: one CTA per channel, each holding a whole SM that
# no compute kernel shares. "NCCL uses the minimal number of SMs to achieve the performance of the
# platform ... on DGX with 8 NICs and a top speed of 190 GB/s, it would use 16 SMs"; "NCCL CTAs
# won't share an SM with compute kernels" (S. Jeaugey, NCCL maintainer, NVIDIA/nccl issue #689,
# 2023). A compute kernel running beside an overlapped collective therefore has 16 fewer SMs:
# 16/108 = 14.8% of an A100, 16/132 = 12.1% of an H100 (SM counts in the hardware profiles).
NCCL_SMS = 16

# Compute slowdown under overlapped communication for a profile that does not give its SM count:
# Lee et al. 2025 ("Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed
# Deep Learning", arXiv 2507.03114, abstract) measure GPT and LLaMA training on 4x A100, H100,
# MI250 and MI210: compute overlapped with communication is on average 18.9% slower (max 40%)
# than alone, i.e. it runs at 1/1.189 = 84% of its speed: it loses 0.16 of the GPU. The SM-share
# figure above (0.12-0.15 on A100/H100) agrees with this mean.
OVERLAP_INTERFERENCE = 0.16
