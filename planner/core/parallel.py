"""The parallel configuration a user sets in their launcher: degrees, batch split, schedule, memory knobs."""

from __future__ import annotations

from dataclasses import dataclass

RECOMPUTE_MODES = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


@dataclass(frozen=True)
class Parallel:
    """The knobs a user sets in their launcher."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    num_microbatches: int
    schedule: str = "1f1b"
    virtual_stages: int = 1
    recompute: str = "none"
    zero: int = 1
    sequence_parallel: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.num_microbatches * self.dp

    @property
    def num_chunks(self) -> int:
        return self.pp * self.virtual_stages
