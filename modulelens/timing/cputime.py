"""A CPU-time clock of a whole process tree, beside the wall clock (issue 37, item 1).

On a busy machine a batch's wall time includes the slices its threads spent waiting for a CPU;
the CPU time its processes *ran* does not. :class:`TreeClock` reads, from ``/proc`` (written by
the kernel: a process cannot forge it), the CPU time of every thread of every process in one
side's tree: the side's process and all its descendants (``/proc/PID/task/TID/children``,
recursively).

* **Precise** (per batch): the sum of ``sum_exec_runtime`` (ns, ``/proc/PID/task/TID/schedstat``)
  of the tree's live threads, read before a batch's request and after its answer (the process is
  blocked on its pipe then, so the counters are settled).
* **Complete** (per measurement): the process-level ``utime + stime + cutime + cstime`` of
  ``/proc/PID/stat`` (clock ticks), which also holds the threads that ended and the children that
  were reaped. Work in a thread or process that ended between two readings is missing from the
  precise sums; it shows as the complete total running ahead of them (:meth:`TreeClock.findings`).

Where work could hide from the clock, and what stops it:

* *a helper process outside the tree*: the candidate's process is PID 1 of its own PID namespace
  (the sandbox's namespaces layer), so every process it starts, a double-forked daemon included,
  stays a descendant (orphans are re-parented to PID 1) and is counted. Whether the process really
  is PID 1 of a child namespace is read from its ``NSpid`` line (kernel-written); where it is not,
  the tree is not known to be complete and this clock is not used (:attr:`TreeClock.complete`).
  A process elsewhere on the machine is out of reach: the sandbox gives the candidate no sockets,
  no signals and no writable shared files outside its scratch folder.
* *work left running after the batch*, or while the side is held: the tree's CPU time between
  the end of one of its batches and the start of the next (minus what the checker asked for, such
  as copying outputs out) is counted as outside work; above :data:`OUTSIDE_SHARE` of the batches'
  own it is a blocking finding on both clocks.
* *more CPUs than the thread budget* (a helper thread that moved itself to another core): the
  batches' CPU time over their wall time, beyond the threads allowed, is a blocking finding on the
  wall clock (on the CPU clock it gains nothing).

What this clock cannot see: memory-bandwidth and cache interference from other processes slows
the CPU time too. The round detectors (two modes, drift) still apply to the CPU-time rounds.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from modulelens.timing.noise import Finding

OUTSIDE_SHARE = 0.03  # CPU time outside the batches, as a share of the batches' own, that is flagged
OUTSIDE_FLOOR_S = 0.005  # ... and at least this much (the harness's own idle wake-ups stay below)
UNSEEN_SHARE = 0.05  # CPU time of ended threads/processes missing from the per-batch sums, flagged above
UNSEEN_FLOOR_S = 0.05  # ... and this much (the complete total is in clock ticks, a few per process)
_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


@dataclass
class TreeCpu:
    """One reading of a process tree."""

    precise_ns: int = 0  # sum_exec_runtime of the live threads
    complete_s: float = 0.0  # utime+stime+cutime+cstime of the processes (ticks, ended threads included)
    processes: int = 0
    threads: int = 0


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except (OSError, ValueError):
            pass
    return out


def tree_pids(root: int) -> list[int]:
    """``root`` and every descendant process (empty when ``root`` is gone)."""
    if not Path(f"/proc/{root}").exists():
        return []
    seen, todo = [root], [root]
    while todo:
        for child in _children(todo.pop()):
            if child not in seen:
                seen.append(child)
                todo.append(child)
    return seen


def read_tree(root: int) -> TreeCpu:
    """The CPU time of ``root``'s tree now (threads or processes that vanish while read count as zero)."""
    r = TreeCpu()
    for pid in tree_pids(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            r.complete_s += sum(int(x) for x in fields[11:15]) * _TICK_S  # utime stime cutime cstime
            r.processes += 1
        except (OSError, IndexError, ValueError):
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                r.precise_ns += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
                r.threads += 1
            except (OSError, IndexError, ValueError):
                pass
    return r


def own_pid_namespace(pid: int) -> bool:
    """Whether ``pid`` is PID 1 of a PID namespace below this process's (its ``NSpid`` line ends in 1)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                ids = line.split()[1:]
                return len(ids) >= 2 and ids[-1] == "1"
    except OSError:
        pass
    return False


@dataclass
class TreeClock:
    """The CPU-time clock of one side (see the module docstring): ``start``/``stop`` around each
    batch's request (``stop`` gives its CPU seconds), ``excused`` around work the checker asks of
    the side between batches. ``complete``: the tree is known to hold all the side's work."""

    root: int
    complete: bool
    why: str = ""
    batches_s: float = 0.0
    wall_s: float = 0.0
    outside_s: float = 0.0
    excused_s: float = 0.0
    last_s: float | None = None
    _first: TreeCpu | None = None
    _start: TreeCpu | None = None
    _end: TreeCpu | None = None
    _excused_since_end: float = 0.0
    _latest: TreeCpu | None = field(default=None, repr=False)

    @classmethod
    def of(cls, pid: int) -> TreeClock:
        if own_pid_namespace(pid):
            return cls(pid, True, "every thread of every process in its PID namespace")
        return cls(pid, False, "not PID 1 of its own PID namespace: a process it started could leave the tree")

    def _read(self) -> TreeCpu:
        r = read_tree(self.root)
        if self._first is None:
            self._first = r
        self._latest = r
        return r

    def start(self) -> None:
        r = self._read()
        if self._end is not None:
            self.outside_s += max(0.0, (r.precise_ns - self._end.precise_ns) / 1e9 - self._excused_since_end)
        self._excused_since_end = 0.0
        self._start = r

    def stop(self, wall_s: float) -> float:
        """CPU seconds of the tree since :meth:`start` (the batch that took ``wall_s``)."""
        r = self._read()
        start = self._start or r
        self.last_s = max(0.0, (r.precise_ns - start.precise_ns) / 1e9)
        self.batches_s += self.last_s
        self.wall_s += wall_s
        self._end = r
        return self.last_s

    @contextlib.contextmanager
    def excused(self) -> Iterator[None]:
        before = read_tree(self.root)
        try:
            yield
        finally:
            spent = max(0.0, (read_tree(self.root).precise_ns - before.precise_ns) / 1e9)
            self.excused_s += spent
            self._excused_since_end += spent

    def findings(self, who: str, threads: int) -> tuple[list[Finding], list[Finding]]:
        """(findings that block both clocks, findings that block the wall clock only)."""
        both: list[Finding] = []
        wall: list[Finding] = []
        share = OUTSIDE_SHARE if threads == 1 else 0.25  # idle pool threads spin for a while after a parallel region
        if self.outside_s > max(share * self.batches_s, OUTSIDE_FLOOR_S):
            both.append(Finding(kind="outside", blocking=True, detail=(
                f"{who}{self.outside_s * 1e3:.0f} ms of CPU time outside its timed batches (work left running "
                f"after a batch or while held; {self.batches_s * 1e3:.0f} ms in them)")))
        if self._first is not None and self._latest is not None:
            seen = self.batches_s + self.outside_s + self.excused_s
            complete = self._latest.complete_s - self._first.complete_s
            if complete - seen > max(UNSEEN_SHARE * seen, UNSEEN_FLOOR_S):
                both.append(Finding(kind="unseen", blocking=True, detail=(
                    f"{who}{(complete - seen) * 1e3:.0f} ms of CPU time in threads or processes that ended between "
                    f"readings (not in any batch's count)")))
        if self.wall_s > 0 and self.batches_s > self.wall_s * threads * 1.25 + 0.002:
            wall.append(Finding(kind="cpus", blocking=True, detail=(
                f"{who}its batches used {self.batches_s / self.wall_s:.1f} CPUs' worth of time with {threads} "
                f"thread(s) allowed")))
        return both, wall
