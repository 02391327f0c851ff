"""Goodput at scale: the share of wall time a synchronous training job makes progress when GPUs
fail, checkpointing at Young's optimal interval.

    job failure rate   = gpus x FAILURES_PER_GPU_HOUR        (one failure stops the whole job)
    MTBF  M            = 1 / job failure rate
    save time  delta   = checkpoint bytes / (gpus x WRITE_BYTES_PER_GPU_S)
    interval   tau     = sqrt(2 x delta x M)                  (Young 1974)
    goodput            = 1 - delta / tau - tau / (2 M)        (writing, and redoing half an
                                                               interval per failure on average)

Sources (Dubey et al. 2024, 'The Llama 3 Herd of Models', sec. 3.3; the numbers as the paper
gives them, the wording paraphrased unless quoted):
- The failure rate: in a 54-day snapshot of pre-training on 16,384 H100, 466 job interruptions,
  47 of them planned (maintenance) and 419 unexpected. Unexpected only:
  419 / (54 x 24 h x 16,384) = 1.97e-5 per GPU-hour. Why one failure stops the job: "the
  synchronous nature of training makes it less fault-tolerant - a single GPU failure may require
  a restart of the entire job".
- The write bandwidth: the cluster's Tectonic file system sustains 2 TB/s (7 TB/s peak), shared by
  the job's 16,384 GPUs: 122 MB/s a GPU, taken to scale with the job (our assumption: storage is
  provisioned with the cluster).
- The checkpoint: the model states of mixed-precision Adam without the gradients, 2 + 12 bytes a
  parameter (16-bit weights, fp32 master weights, momentum and variance: Rajbhandari et al.
  2020, 'ZeRO', sec. 3.1, K = 12).
- The interval: J. W. Young, 'A first order approximation to the optimum checkpoint interval',
  CACM 17(9), 1974: tau = sqrt(2 delta M), valid while delta << M (Daly 2006 refines it beyond).

Not counted: the time to detect a failure, reschedule and reload (Llama 3 gives none), so the
goodput is an upper bound. Meta reports more than 90% effective training time for the same run,
which this bound (about 98%) does not contradict (tests/test_economics.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FAILURES_PER_GPU_HOUR = 419 / (54 * 24 * 16384)
WRITE_BYTES_PER_GPU_S = 2e12 / 16384
CHECKPOINT_BYTES_PER_PARAM = 2 + 12
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Goodput:
    """Failures, checkpointing and the share of time that makes progress, for one job."""

    mtbf_s: float  # mean time between job failures
    save_s: float  # one checkpoint's write time
    interval_s: float  # Young's optimal time between checkpoints
    goodput: float  # the share of wall time making progress (restart time not counted)

    def __post_init__(self):
        if not (self.mtbf_s > 0 and self.save_s > 0 and 0 < self.goodput <= 1):
            raise ValueError(f"goodput out of range: {self}")

    def interruptions(self, seconds: float) -> float:
        """Failures expected in ``seconds`` of wall time."""
        return seconds / self.mtbf_s

    def to_dict(self) -> dict:
        return {"mtbf_s": self.mtbf_s, "checkpoint_save_s": self.save_s,
                "checkpoint_interval_s": self.interval_s, "goodput": self.goodput,
                "failures_per_gpu_hour": FAILURES_PER_GPU_HOUR}


def goodput(params: float, gpus: int) -> Goodput:
    """The module docstring's formulas for a model of ``params`` parameters on ``gpus`` GPUs
    (the share kept above 0 where a save would take about as long as the MTBF, past the
    first-order formula's range)."""
    mtbf = SECONDS_PER_HOUR / (gpus * FAILURES_PER_GPU_HOUR)
    save = params * CHECKPOINT_BYTES_PER_PARAM / (gpus * WRITE_BYTES_PER_GPU_S)
    interval = math.sqrt(2 * save * mtbf)
    share = 1 - save / interval - interval / (2 * mtbf)
    return Goodput(mtbf_s=mtbf, save_s=save, interval_s=interval,
                   goodput=min(1.0, max(share, 1e-6)))
