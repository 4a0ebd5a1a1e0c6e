"""Every solve returns by its time limit, with the best plan it had so far.

The methods watch the clock themselves where they can (phases share the limit, loops look
at it, native solvers get what is left), but some steps cannot be cut short from inside:
building a large integer program, one pass of a kernel.  :func:`within` is the backstop:
the method runs in a thread of its own; if it has not returned GRACE after the limit, the
caller gets the best valid plan the method offered on the way (:func:`offer`: warm
starts, improved incumbents; else the whole model on one device where that is valid) with
status "time_limit", and the method's thread is told to stop (its loops and HiGHS's
interrupt callback see :func:`onnxsplit.interrupt.check`).

Write-up: docs/README.md (Limits).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from .. import interrupt
from ..plan import Plan, gap_of
from ..workload import Workload
from . import evaluate


STOP_WAIT_S = 0.5  # for a method told to stop, before the caller goes on without it
PROGRESS_S = 5.0  # a long solve says where it stands this often (where a reporter is set)

#: called as report(method, seconds, best value or None, bound or None) on long solves
#: (the CLI's solve sets it to a line on stderr; --quiet and --json leave it None)
report: Callable[[str, float, float | None, float | None], None] | None = None


def grace(time_limit: float) -> float:
    """How long after its limit a method may still return by itself."""
    return 0.25 + min(2.0, 0.05 * time_limit)


class _Offers:
    def __init__(self, workload: Workload, objective: str):
        self.workload, self.objective = workload, objective
        self.best: tuple[float, dict[int, str], str] | None = None
        self.bound: float | None = None  # the best lower bound the method proved so far
        self.began = time.perf_counter()
        self.first: float | None = None  # seconds to the first valid plan offered
        self.trace: list[list] = []  # [seconds, best value, bound] at each improvement
        self.lock = threading.Lock()

    def _note(self) -> None:
        """A point of the trace (the lock held)."""
        self.trace.append([round(time.perf_counter() - self.began, 3),
                           self.best[0] if self.best is not None else None, self.bound])

    def offer(self, assignment: dict[int, str] | None, by: str) -> None:
        if not assignment or evaluate.check(self.workload, assignment):
            return
        value = evaluate.score(self.workload, assignment, self.objective).value
        with self.lock:
            if self.first is None:
                self.first = time.perf_counter() - self.began
            if self.best is None or value < self.best[0]:
                self.best = (value, dict(assignment), by)
                self._note()


_local = threading.local()


def _watching() -> _Offers | None:
    """The running method's watch, None outside :func:`within` or inside :func:`apart`."""
    return None if getattr(_local, "apart", 0) else getattr(_local, "offers", None)


@contextmanager
def apart() -> Iterator[None]:
    """Solves of another workload inside the running method (a block of the graph alone,
    its ends pinned, a memory room of its own): their bounds bound that workload, not the
    method's (a block's 12.52 beside the whole's plan of 4.10 once gave the progress line
    a gap of -205% and the stopped plan a false proof), and their plans are not the
    method's, so neither reaches the watch."""
    _local.apart = getattr(_local, "apart", 0) + 1
    try:
        yield
    finally:
        _local.apart -= 1


def offer(assignment: dict[int, str] | None, by: str) -> None:
    """A valid plan the running method has in hand (scored and checked here); a no-op
    outside :func:`within` (and inside :func:`apart`)."""
    offers = _watching()
    if offers is not None:
        offers.offer(assignment, by)


def prove(bound: float | None) -> None:
    """A lower bound the running method has proven (kept with the plan should it be
    stopped); a no-op outside :func:`within` (and inside :func:`apart`)."""
    offers = _watching()
    if offers is not None and bound is not None and bound > 0:
        with offers.lock:
            if offers.bound is None or bound > offers.bound:
                offers.bound = float(bound)
                offers._note()


def within(time_limit: float | None, workload: Workload, objective: str, method: str,
           solve: Callable[[], Plan]) -> Plan:
    """``solve()``, or past ``time_limit`` + :func:`grace` the best plan it offered."""
    if not time_limit or getattr(_local, "offers", None) is not None:
        return solve()  # no limit, or inside an outer solve: its watch holds
    began = time.perf_counter()
    offers = _Offers(workload, objective)
    stop = threading.Event()
    done = threading.Event()
    outcome: dict = {}

    def work() -> None:
        _local.offers = offers
        interrupt.adopt(stop)
        try:
            outcome["plan"] = solve()
        except BaseException as e:  # handed to the caller (unless it has moved on)
            outcome["error"] = e
        finally:
            done.set()

    thread = threading.Thread(target=work, name=f"solve:{method}", daemon=True)
    thread.start()
    until = began + time_limit + grace(time_limit)
    try:
        while not done.wait(max(0.0, min(PROGRESS_S, until - time.perf_counter()))):
            if time.perf_counter() >= until:
                break
            if report is not None:
                with offers.lock:
                    best = offers.best[0] if offers.best is not None else None
                    bound = offers.bound
                report(method, time.perf_counter() - began, best, bound)
    except BaseException:  # Ctrl-C in a library caller's main thread: the method stops too
        stop.set()
        raise
    if done.is_set():
        if "error" in outcome:
            raise outcome["error"]
        plan = outcome["plan"]
        plan.details.setdefault("first_plan_s", offers.first if offers.first is not None else plan.seconds)
        if offers.trace:
            plan.details.setdefault("trace", offers.trace)
        return plan
    stop.set()
    done.wait(STOP_WAIT_S)  # most stop at once: not left running beside what comes next
    if not done.is_set():
        interrupt.abandon(thread)
    interrupt.check()  # Ctrl-C rather than a late plan
    if "plan" in outcome:  # it finished as it was told to stop: its own plan
        return outcome["plan"]
    if offers.best is None:  # the model whole on one device, where that is a valid plan
        firsts = [workload.devices[int(workload.device_class.tolist().index(c))].name
                  for c, count in enumerate(workload.class_counts) if count]
        for device in ["cpu0"] * bool(workload.num_cpus) + firsts:
            offers.offer({int(i): device for i in workload.ids}, f"the fallback: all on {device}")
            if offers.best is not None:
                break
    seconds = time.perf_counter() - began
    why = f"{method} ran past its time limit ({time_limit:g} s) and was stopped"
    if offers.best is None:
        return Plan(objective, method, "time_limit", None, {}, seconds=seconds,
                    details={"stopped": why + " before it had a plan"})
    value, assignment, by = offers.best
    lb = min(offers.bound, value) if offers.bound is not None else None
    return Plan(objective, method, "time_limit", value, assignment, seconds=seconds,
                lower_bound=lb, gap=gap_of(value, lb),
                details={"stopped": f"{why}; this is the best plan it had ({by})", "first_plan_s": offers.first,
                         "trace": offers.trace})
