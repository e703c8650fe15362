"""The thread policy of a CPU measurement: both sides run with the same intra-op thread count,
by default the one the user's run uses, capped at the cores that are free now.

Why the user's count: a kernel is worth what it gains in the user's run, with the user's threads.
Why capped at the free cores: more threads than free cores means a thread of one side is
descheduled mid-parallel-region and the whole call waits a scheduler slice for it; that measures
the machine's load, not the kernel. Why the same on both sides: a ratio between a 2-thread eager
and a 1-thread candidate says nothing about either. The retime policy (:func:`fewer_threads`)
halves the count when the first attempt was disturbed.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field


class ThreadChoice(BaseModel):
    threads: int = Field(ge=1, description="Intra-op threads of both sides.")
    why: str = Field(description="Where the count came from, in words.")


def user_threads() -> tuple[int, str]:
    """The thread count of the user's run, as this process inherited it, and where it came from."""
    import torch

    n = torch.get_num_threads()
    env = os.environ.get("OMP_NUM_THREADS")
    if env:
        return n, f"OMP_NUM_THREADS={env}"
    return n, "torch's default for this machine"


def choose_threads(user: int, source: str, cores: int, load: float) -> ThreadChoice:
    """``user`` threads (from ``source``), capped at the free cores: ``cores`` minus the
    1-minute ``load`` rounded, at least 1."""
    free = max(1, round(cores - load))
    if user <= free:
        return ThreadChoice(threads=max(1, user), why=f"{user} as in your run ({source})")
    return ThreadChoice(threads=free, why=f"{free}, your run's {user} ({source}) capped at the free cores "
                        f"(load {load:.1f} on {cores})")


def fewer_threads(choice: ThreadChoice, reason: str) -> ThreadChoice | None:
    """Half the threads (None at 1 already), saying why."""
    if choice.threads <= 1:
        return None
    n = max(1, choice.threads // 2)
    return ThreadChoice(threads=n, why=f"{n}, retimed with fewer than {choice.threads} because {reason}")


def thread_choice(user: int | None = None, source: str = "") -> ThreadChoice:
    """:func:`choose_threads` for now: ``user`` threads (default: this process's, see
    :func:`user_threads`) capped at this machine's free cores."""
    from modulelens.timing.noise import machine_load

    n, src = (user, source or "asked for") if user else user_threads()
    load, cores = machine_load()
    return choose_threads(n, src, cores, load)
