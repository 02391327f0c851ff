"""Where the points run: ``serial`` (this process, one after another), ``local`` (a process pool on
this machine, the default) or ``ray`` (Ray tasks: a local Ray instance, or the cluster of an
already initialised ``ray``). Each calls ``on_done(key, outcome)`` in this process as points
finish, in whatever order they finish; the caller puts them back in point order, so the rows are
the same whatever the backend or the number of workers."""

from __future__ import annotations

import os
import signal
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_all_start_methods, get_context

from planner.core.errors import PlanInputError

BACKENDS = ("local", "ray", "serial")


def machine_workers() -> int:
    """The cores this process may run on (a container's or taskset's limit, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _serial(evaluate, solve, items, workers, on_done):
    for key, kwargs in items:
        on_done(key, evaluate(solve, kwargs))


def _ignore_interrupt() -> None:
    """Workers leave Ctrl-C to the parent, which stops the sweep (no traceback per worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _local(evaluate, solve, items, workers, on_done):
    # forkserver where there is one: workers start from a clean process, not a fork of this one
    # (whose threads, a progress bar's say, may hold locks); each imports the planner once.
    method = "forkserver" if "forkserver" in get_all_start_methods() else None
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context(method),
                               initializer=_ignore_interrupt)
    try:
        pending = {pool.submit(evaluate, solve, kwargs): key for key, kwargs in items}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                on_done(pending.pop(future), future.result())
    finally:  # on an error or Ctrl-C: drop what has not started, wait for nothing
        pool.shutdown(wait=False, cancel_futures=True)


def _ray(evaluate, solve, items, workers, on_done):
    try:
        import ray
    except ImportError:
        raise PlanInputError("--backend ray needs Ray: pip install 'plan3d[sweep]'") from None
    started = not ray.is_initialized()
    if started:  # a local instance, for this sweep only
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    pending = {}
    try:
        task = ray.remote(num_cpus=1)(evaluate)
        solve_ref = ray.put(solve)
        pending = {task.remote(solve_ref, kwargs): key for key, kwargs in items}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                on_done(pending.pop(ref), ray.get(ref))
    finally:
        for ref in pending:  # on an error or Ctrl-C
            ray.cancel(ref)
        if started:
            ray.shutdown()


def run_points(evaluate, solve, items, backend: str = "local", workers: int | None = None,
               on_done=None) -> None:
    """``evaluate(solve, kwargs)`` for every (key, kwargs) of ``items`` on ``backend``."""
    if backend not in BACKENDS:
        raise PlanInputError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise PlanInputError(f"--workers must be a positive integer, got {workers!r}")
    items = list(items)
    if not items:
        return
    workers = min(workers or machine_workers(), len(items))
    runner = {"serial": _serial, "local": _local, "ray": _ray}[backend]
    runner(evaluate, solve, items, workers, on_done)
