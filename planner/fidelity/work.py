"""The work budget of a runs file (`plan validate`, `plan calibrate`): the pipeline ops its runs'
simulations walk, counted from each run's configuration before any run is priced, so a file that
would run for minutes is refused at once, in one line (issue #31).

What takes the time is the pipeline simulation of a shape not seen before (schedule, pp, M,
virtual stages): ~8 s of CPU for the largest the runs schema admits (interleaved, 256 chunks,
M ~10^6), where pricing a run's model costs hundredths of a second however many layers it has
(benchmarks/bench_worst_case.py). `plan calibrate` prices runs without the simulation,
but many times each. The budget counts ops (predict/pipeline_schedule.py pipeline_work), never
seconds, so the same file gets the same answer on any machine and load.
Every run counts its shape's ops in full, as if no other run had simulated it: a bound, where the
simulator's memo (pipeline/simulate.py) makes a repeated shape cheaper.
"""

from __future__ import annotations

from planner.core.errors import PlanInputError
from planner.fidelity.case_setup import CaseSetup
from planner.predict.pipeline_schedule import pipeline_work

# Pipeline ops one runs file may ask for, summed over its runs. Chosen with
# benchmarks/bench_worst_case.py in view: an op costs 5 to 12 us of CPU on the 2-core machine
# (interleaved, 1F1B, ZB-H1 and ZB-2p at up to 256 chunks, torch 2.6's time steps at 16, one run
# each, measured), so 1.6 million take under 20 s with the interpreter's start; the heaviest runs measured at it took
# 16-17 s of CPU and at most 0.8 GiB (docs/speed.md). It admits the largest single run the schema
# allows, interleaved at pp 128 x v 2 and M 999,936 (its first short run of 768 microbatches and
# one period more, 512 ops each: 851,968), ZB-2p at pp 256 and M 10^6 (1,585,920), and the 82
# bundled runs (399,162 together) three times over, as the bench's 256-run file repeats them.
# torch 2.6's time steps count the most rank-steps their walk takes, its steady periods skipped
# (timestep.interleaved_slots: at pp 8 x v 2, 13,584 at M 1,000 and 19,344 at M 999,936);
# a rank-step cost 1.6 to 2.1 us on the 2-core machine (pp 8 and 64, v 2, measured), under an op.
MAX_PIPELINE_OPS = 1_600_000


# Times `plan calibrate` prices one run: it prices with the closed-form pipeline (no simulation),
# but a stack that runs torch 2.6's time steps walks their table at every pricing. The fit and the
# leave-one-out refits priced a run at most 206 times over the bundled A100 runs (4 to 41 runs,
# three factors; 16 runs, the most that are refitted, is the worst), measured, not a bound of
# Levenberg-Marquardt's worst case; 256 leaves room.
CALIBRATION_PRICINGS = 256


def case_work(setup: CaseSetup, simulated: bool = True) -> int:
    """The pipeline ops pricing one run asks for (0 for a run that is skipped); ``simulated``
    False: priced with the closed forms, as `plan calibrate` prices."""
    if setup.unsupported or setup.parallel is None or setup.options is None:
        return 0
    return pipeline_work(setup.parallel, setup.options, simulated)


def check_work(setups: list[CaseSetup], origin: str, simulated: bool = True,
               pricings: int = 1) -> int:
    """The runs' total work, each run priced ``pricings`` times; PlanInputError (one line, the
    heaviest run named) beyond MAX_PIPELINE_OPS."""
    work = [case_work(s, simulated) * pricings for s in setups]
    total = sum(work)
    if total > MAX_PIPELINE_OPS:
        heaviest = max(range(len(work)), key=work.__getitem__)
        par = setups[heaviest].parallel
        what = "give it" if work[heaviest] > MAX_PIPELINE_OPS else "split the file, or give it"
        raise PlanInputError(
            f"{origin}: its runs' pipelines walk {total:,} ops; at most "
            f"{MAX_PIPELINE_OPS:,} (planner/fidelity/work.py). The heaviest, "
            f"'{setups[heaviest].name}' ({par.schedule} pp {par.pp} v {par.virtual_stages}, "
            f"M {par.num_microbatches:,}), walks {work[heaviest]:,}: {what} fewer pipeline "
            "chunks or microbatches")
    return total
