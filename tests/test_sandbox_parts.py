"""Unit tests of the sandbox's parts: the shared arena, argument encoding, isolation reports, the
removal of scratch folders left by killed checkers, and removing a tree whatever it holds."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

from modulelens.repo.owners import owner_of, this_process
from modulelens.sandbox.candidate_process import PREFIX, remove_orphaned_scratch
from modulelens.sandbox.cleanup import remove_tree
from modulelens.sandbox.containment import Isolation, landlock_abi
from modulelens.sandbox.shm import MappedArena, SharedArena, aligned, decode_value, encode_value


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
    other = MappedArena(os.dup(arena.fd))  # what the candidate process maps
    back = decode_value(encoded, other.view)
    assert torch.equal(back[0], x) and back[0].stride() == x.stride()
    assert back[1:] == [3, 2.5, None, (1, 2), torch.float16, torch.device("cpu")]
    back[0].fill_(7.0)  # a write in the other mapping is seen here: input mutation is visible to the checker
    slot = decode_value(encoded, lambda s: s)[0]
    assert bool((arena.read(slot) == 7.0).all()) and arena.read(slot).stride() == x.stride()
    arena.close()


def test_the_arena_is_sealed_and_a_bigger_one_keeps_its_content():
    import errno
    import fcntl

    arena = SharedArena(1 << 16)
    slot = arena.put(torch.arange(10.0), 0)
    assert arena.sealed
    for size in (0, arena.size * 4):  # neither side can shrink it (SIGBUS) nor grow it (memory)
        try:
            os.ftruncate(arena.fd, size)
            raise AssertionError("the arena could be resized")
        except OSError as e:
            assert e.errno == errno.EPERM
    assert fcntl.fcntl(arena.fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SEAL
    before = arena.generation
    arena.resize(1 << 20)
    assert arena.generation == before + 1 and torch.equal(arena.read(slot), torch.arange(10.0))
    arena.close()


def test_isolation_summary_names_what_is_and_is_not_in_force():
    iso = Isolation()
    iso.add("namespaces", True, "user, PID")
    iso.add("seccomp", False, "no filter")
    assert iso.summary() == "in force: namespaces; not in force: seccomp (no filter)"
    assert isinstance(landlock_abi(), int)


def test_scratch_of_a_killed_checker_is_removed_and_a_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = owner_of(dead.pid)
    dead.wait()
    gone, kept = tmp_path / f"{PREFIX}{owner}-abc", tmp_path / f"{PREFIX}{this_process()}-def"
    unnamed = tmp_path / f"{PREFIX}q7x2ab"  # an older version's folder: no owner to ask, kept for a day
    for folder in (gone, kept, unnamed):
        folder.mkdir()
        (folder / "owner.pid").symlink_to("/dev/zero")  # nothing inside is read: a candidate wrote it
        old = time.time() - 3600
        os.utime(folder, (old, old))
    assert remove_orphaned_scratch(tmp_path) == [gone]
    assert kept.exists() and unnamed.exists() and not gone.exists()


def test_a_tree_is_removed_whatever_its_depth_names_links_and_permissions(tmp_path):
    target = tmp_path / "outside.txt"
    target.write_text("keep me")
    root = tmp_path / "scratch"
    fd = os.open(tmp_path, os.O_RDONLY)
    os.mkdir("scratch", dir_fd=fd)
    for depth in range(1500):  # deeper than recursion or PATH_MAX allow
        nxt = os.open("scratch" if depth == 0 else "d" * 200, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
        os.mkdir("d" * 200, dir_fd=fd)
        if depth % 300 == 0:
            os.symlink(str(target), "link", dir_fd=fd)
            os.mkfifo("fifo", dir_fd=fd)
            os.chmod("d" * 200, 0, dir_fd=fd)  # a folder it may not enter at first
    os.close(fd)
    assert remove_tree(root) and not root.exists()
    assert target.read_text() == "keep me"
    link = tmp_path / "link-to-dir"
    link.symlink_to(tmp_path)
    assert remove_tree(link) and not link.exists() and target.exists()  # the link, never what it names


def test_an_arena_shrunk_under_the_checker_is_a_short_read_not_a_sigbus(monkeypatch):
    """Where a kernel cannot seal a memfd, a candidate can truncate the arena: the checker never
    maps it, so reading a slot past the new end is a ValueError (a rejection), not a SIGBUS."""
    import pytest

    from modulelens.sandbox import shm

    monkeypatch.setattr(shm, "sealing_available", lambda: False)
    arena = SharedArena(1 << 16)
    slot = arena.put(torch.randn(1000), 4096)
    assert not arena.sealed
    os.ftruncate(arena.fd, 4096)  # what the candidate does with its copy of the descriptor
    with pytest.raises(ValueError, match="shrunk"):
        arena.read(slot)
    arena.close()


def test_a_validating_cli_command_is_recognised_for_its_head_start():
    from modulelens.prestart import command_args, memory_limit
    from modulelens.validation import VALIDATION_RUNNER
    from modulelens.validation.messages import VALIDATION_WORKER

    assert VALIDATION_RUNNER == VALIDATION_WORKER.runner  # the worker it starts is the one the pool would
    assert command_args(["/usr/bin/python3", "-m", "modulelens", "validate-kernel", "c:v1"]) == ["validate-kernel", "c:v1"]
    assert command_args(["/venv/bin/python", "/venv/bin/modulelens", "validate-kernel", "--source", "m.py"])[0] == \
        "validate-kernel"
    assert command_args(["/usr/bin/python3", "-m", "pytest", "-q"]) is None
    assert command_args(["/usr/bin/python3", "-m", "modulelens.sandbox.worker", "x"]) is None
    assert memory_limit(["validate-kernel", "c", "--memory-limit-mb", "2048"], 6144) == 2048
    assert memory_limit(["validate-kernel", "c", "--memory-limit-mb=1024"], 6144) == 1024
    assert memory_limit(["validate-kernel", "c"], 6144) == 6144
