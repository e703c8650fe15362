"""The CPU-time clock of a side's process tree (issue 37, item 1): what it counts (threads and
processes the side started, ended ones through the process totals), what it flags (work outside
the batches, work in ended threads, more CPUs than the thread budget), and how the driver uses it:
when the wall-clock rounds were descheduled the CPU-time rounds may decide, and the result says
which clock did and why; a helper doing work outside the timed process gains nothing on either."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import threading
import time

from modulelens.timing import ThreadChoice, TimingPlan, TreeClock, measure_speedup
from modulelens.timing import noise
from modulelens.timing.cputime import own_pid_namespace, read_tree, tree_pids
from test_timing import FakeClock, FakeSide, fake_probe

ONE = ThreadChoice(threads=1, why="test")


class CpuSide(FakeSide):
    """A fake side with a CPU-time clock: ``cpu_per_call`` CPU seconds per call whatever the wall
    clock does; ``outside_per_batch`` CPU seconds of work after each batch; ``cpus``: how many CPUs
    its batches use at once (wall time divided by it)."""

    def __init__(self, clock, per_call, cpu_per_call, noise_fn=None, outside_per_batch=0.0, cpus=1):
        super().__init__(clock, per_call / cpus, noise_fn)
        self.cpu_per_call, self.outside, self.cpus = cpu_per_call, outside_per_batch, cpus
        self.cpu_clock = TreeClock(root=-1, complete=True, why="a fake tree")

    def batch(self, calls, round_index):
        wall = super().batch(calls, round_index)
        c = self.cpu_clock
        c.last_s = calls * self.cpu_per_call
        c.batches_s += c.last_s
        c.wall_s += wall
        c.outside_s += self.outside
        return wall


def _descheduled_wall(rng):
    """Wall noise of a busy machine: batches stretched by the slices they waited for a CPU."""
    return lambda: math.exp(rng.gauss(0, 0.8))


def _switched_out():
    n = {"i": 0}

    def counters(pids, cpus):
        n["i"] += 1
        return noise.SchedCounters(involuntary=n["i"])

    return counters


def _measure(base, cand, clock):
    return measure_speedup(base, cand, TimingPlan(budget_s=2.0), ONE, clock=clock,
                           probe=fake_probe(_switched_out(), lambda: (9.0, 2)))


def test_descheduled_wall_rounds_are_decided_by_cpu_time_and_say_so():
    clock, rng = FakeClock(), random.Random(1)
    base = CpuSide(clock, 40e-6, 40e-6, _descheduled_wall(rng))
    cand = CpuSide(clock, 10e-6, 10e-6, _descheduled_wall(rng))
    m = _measure(base, cand, clock)
    assert m.status == "ok" and m.clock == "cpu", (m.reason, m.clock_why)
    assert m.speedup == pytest_approx(4.0) and m.interval and m.interval[0] <= 4.0 <= m.interval[1]
    assert "descheduled" in m.clock_why and "CPU time" in m.reason and "decided by CPU time" in m.note("x")
    assert "CPU time of its process tree" in m.candidate.timer and m.candidate.median_s == pytest_approx(10e-6)


def test_work_left_running_outside_the_batches_blocks_both_clocks():
    clock, rng = FakeClock(), random.Random(2)
    base = CpuSide(clock, 40e-6, 40e-6, _descheduled_wall(rng))
    cand = CpuSide(clock, 5e-6, 5e-6, _descheduled_wall(rng), outside_per_batch=2e-3)  # half its work after the batch
    m = _measure(base, cand, clock)
    assert m.status == "undetermined" and m.speedup is None and m.clock == "wall"
    assert any(f.kind == "outside" and f.blocking and "candidate side" in f.detail for f in m.findings), m.findings
    assert "outside its timed batches" in m.reason and "hidden" in m.clock_why


def test_a_helper_on_another_cpu_is_not_timed_faster_than_its_honest_twin():
    """The same work split with a helper thread on a second CPU: half the wall time, the same CPU
    time. The wall clock is refused (more CPUs than the one thread allowed); CPU time gives the
    honest twin's figure."""
    figures = {}
    for cpus in (1, 2):
        clock, rng = FakeClock(), random.Random(3)

        def quiet(rng=rng):
            return math.exp(rng.gauss(0, 0.02))

        base = CpuSide(clock, 40e-6, 40e-6, quiet)
        cand = CpuSide(clock, 10e-6, 10e-6, quiet, cpus=cpus)
        m = measure_speedup(base, cand, TimingPlan(budget_s=2.0), ONE, clock=clock, probe=fake_probe())
        assert m.status == "ok", m.reason
        figures[cpus] = m
    honest, helped = figures[1], figures[2]
    assert honest.clock == "wall" and helped.clock == "cpu", helped.clock_why
    assert any(f.kind == "cpus" for f in helped.findings)
    assert helped.speedup <= honest.speedup * 1.05, (helped.speedup, honest.speedup)


def test_an_incomplete_tree_never_decides():
    clock, rng = FakeClock(), random.Random(4)
    base = CpuSide(clock, 40e-6, 40e-6, _descheduled_wall(rng))
    cand = CpuSide(clock, 10e-6, 10e-6, _descheduled_wall(rng))
    cand.cpu_clock.complete, cand.cpu_clock.why = False, "not PID 1 of its own PID namespace"
    m = _measure(base, cand, clock)
    assert m.clock == "wall" and "not PID 1 of its own PID namespace" in m.clock_why


def pytest_approx(x, rel=0.03):
    import pytest

    return pytest.approx(x, rel=rel)


# -- the real clock on real processes -----------------------------------------------------------

def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass




HELPERS = """
import subprocess, sys, threading, time
stop = False
def spin():
    while not stop:
        pass
t = threading.Thread(target=spin)
t.start()
p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
print(p.pid, flush=True)
sys.stdin.readline()  # then the helpers end: the thread joined, the process reaped
stop = True
t.join()
p.kill()
p.wait()
print("ended", flush=True)
sys.stdin.readline()
"""


def test_the_tree_counts_helper_threads_and_processes_and_flags_ended_ones():
    proc = subprocess.Popen([sys.executable, "-c", HELPERS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        helper = int(proc.stdout.readline())
        assert helper in tree_pids(proc.pid) and read_tree(proc.pid).processes == 2
        clock = TreeClock(proc.pid, complete=True)
        clock.start()
        time.sleep(1.0)  # the helper thread and process spin, alive: in the precise count
        live = clock.stop(1.0)
        assert live > 0.2, live
        assert clock.findings("x: ", 1)[0] == []  # precise and complete counts agree
        clock.start()
        time.sleep(1.0)
        proc.stdin.write("end\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "ended"
        clock.stop(1.0)  # the ended thread and the reaped process took their precise counts with them
        both, _ = clock.findings("x: ", 1)
        assert any(f.kind == "unseen" and f.blocking for f in both), (both, clock)
    finally:
        proc.kill()
        proc.wait()


def test_work_between_batches_is_counted_outside_and_excused_work_is_not():
    clock = TreeClock(os.getpid(), complete=True)
    clock.start()
    _spin(0.05)
    clock.stop(0.05)
    with clock.excused():
        _spin(0.05)  # what the checker asked for (copying outputs out)
    clock.start()
    assert clock.outside_s < 0.02, clock.outside_s
    clock.stop(0.0)
    done = threading.Event()
    helper = threading.Thread(target=lambda: [None for _ in iter(done.is_set, True)])
    helper.start()  # work left running after the batch
    try:
        deadline = time.thread_time()
        time.sleep(0.5)
        clock.start()
    finally:
        done.set()
        helper.join()
    assert time.thread_time() - deadline < 0.05  # this thread slept: the work was the helper's
    assert clock.outside_s > 0.05, clock.outside_s
    both, _ = clock.findings("candidate side: ", 1)
    assert any(f.kind == "outside" for f in both)


def test_this_test_process_is_not_pid_1_of_a_namespace():
    assert not own_pid_namespace(os.getpid()) and not TreeClock.of(os.getpid()).complete


def test_gpu_sides_are_never_decided_by_cpu_time():
    clock, rng = FakeClock(), random.Random(5)
    base = CpuSide(clock, 40e-6, 40e-6, _descheduled_wall(rng))
    cand = CpuSide(clock, 10e-6, 10e-6, _descheduled_wall(rng))
    base.device = cand.device = "cuda"
    m = _measure(base, cand, clock)
    assert m.clock == "wall" and "GPU work" in m.clock_why, m.clock_why
