"""One step of a pipeline rank's program (planner/pipeline/schedule.py builds the programs)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    """One step of a rank's program.

    kind: "F", "B", "W", "BW" (compute; BW: input and weight gradient at once, where a schedule
        also splits them) or "SEND_F", "RECV_F", "SEND_B", "RECV_B" (point-to-point).
    microbatch: 0-based microbatch index.
    chunk: global model-chunk index 0..p*v-1.  For SEND/RECV it is the chunk that *produced* the
        tensor: SEND_F/RECV_F(m, k) move F(m, k)'s output to chunk k+1's rank, SEND_B/RECV_B(m, k)
        move B(m, k)'s input-gradient to chunk k-1's rank.
    peer: the other rank of a SEND/RECV, None for compute ops.
    paired: a BW that runs overlapped with the F just before it (DualPipe's F&B chunk).
    """

    kind: str
    microbatch: int
    chunk: int
    peer: int | None = None
    paired: bool = False

    def __str__(self) -> str:
        text = f"{'&' if self.paired else ''}{self.kind}(mb={self.microbatch}, chunk={self.chunk}"
        if self.peer is not None:
            text += f", {'to' if self.kind.startswith('SEND') else 'from'} rank {self.peer}"
        return text + ")"
