"""Unit tests of the sandbox's parts: the shared arena, argument encoding, isolation reports and
the removal of scratch folders left by killed checkers."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

from modulelens.sandbox.candidate_process import OWNER, remove_orphaned_scratch
from modulelens.sandbox.containment import Isolation, landlock_abi
from modulelens.sandbox.shm import SharedArena, TensorSlot, aligned, decode_value, encode_value


def test_arena_round_trips_strided_tensors_and_values():
    arena = SharedArena()
    x = torch.randn(6, 4).t()  # non-contiguous
    offset = 0

    def put(t):
        nonlocal offset
        slot = arena.put(t, offset)
        offset = aligned(offset + slot.nbytes)
        return slot

    encoded = encode_value([x, 3, 2.5, None, (1, 2), torch.float16, torch.device("cpu")], put)
    other = SharedArena(size=arena.size, fd=os.dup(arena.fd))  # what the candidate process maps
    back = decode_value(encoded, other.view)
    assert torch.equal(back[0], x) and back[0].stride() == x.stride()
    assert back[1:] == [3, 2.5, None, (1, 2), torch.float16, torch.device("cpu")]
    back[0].fill_(7.0)  # a write in the other mapping is seen here: input mutation is visible to the checker
    assert bool((arena.view(TensorSlot.model_validate(encoded["l"][0]["t"])) == 7.0).all())
    other.close()
    arena.close()


def test_isolation_summary_names_what_is_and_is_not_in_force():
    iso = Isolation()
    iso.add("namespaces", True, "user, PID")
    iso.add("seccomp", False, "no filter")
    assert iso.summary() == "in force: namespaces; not in force: seccomp (no filter)"
    assert isinstance(landlock_abi(), int)


def test_scratch_of_a_killed_checker_is_removed_and_a_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone, kept = tmp_path / "modulelens-candidate-gone", tmp_path / "modulelens-candidate-kept"
    for folder, pid in ((gone, dead.pid), (kept, os.getpid())):
        folder.mkdir()
        (folder / OWNER).write_text(str(pid))
        old = time.time() - 3600
        os.utime(folder, (old, old))
    assert remove_orphaned_scratch(tmp_path) == [gone]
    assert kept.exists() and not gone.exists()
