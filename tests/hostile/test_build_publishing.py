"""Hostile builds against the shared build cache (issue 33, item 2): the checker publishes exactly
the inode the candidate's process mapped, never a build deleted or replaced after it was loaded,
and every cached build is verified against the checksum recorded at publication before it is
used; one that fails is rebuilt from source, and the report says so."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

import pytest

from conftest import full_report

from modulelens.kernels import (
    default_build_dir,
    get_backend,
    publish_build,
    publish_dir,
    published_build,
    published_mismatch,
    read_loaded_build,
)
from modulelens.registry import ToolContext
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

HERE = Path(__file__).parent


def _elf(marker: bytes) -> bytes:
    """A minimal 64-bit little-endian ELF shared object header (no segments) followed by ``marker``."""
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    header[16:18] = (3).to_bytes(2, "little")  # ET_DYN
    header[0x20:0x28] = (64).to_bytes(8, "little")
    header[0x36:0x38] = (56).to_bytes(2, "little")
    return bytes(header) + marker


def _holds(folder: Path, data: bytes) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and data in p.read_bytes()]


@pytest.mark.slow
def test_a_build_that_replaces_itself_is_not_published_and_its_source_is_built_afresh(softmax_card):
    repo, card_id = softmax_card
    tag = uuid.uuid4().hex[:12]  # new to this session: built, never found in the cache
    source = (HERE / "build_replaces_itself.cpp").read_text().replace("__TAG__", tag)
    address = get_backend("cpp").build_name(source)
    shared = publish_dir(default_build_dir())
    entry = shared / address

    def validate():
        return validate_kernel(ValidateKernelRequest(source_text=source, target=card_id, backend="cpp", time=False,
                                                     seeds=1), ToolContext(repo_root=repo))

    first = validate()
    assert first.verdict == "rejected" and "its build cannot be verified" in first.reason, first.reason
    assert "deleted or replaced after it was loaded" in first.reason, first.reason
    assert not entry.exists(), "a build replaced after loading was published"
    assert not _holds(shared, f"SWAPPED!-BUILD-{tag}".encode())

    # an entry at this address whose bytes are not those its checksum names: never used, rebuilt
    entry.mkdir(parents=True)
    planted = _elf(f"SWAPPED!-BUILD-{tag}".encode())
    (entry / f"{address}.so").write_bytes(planted)
    (entry / "sha256").write_text(hashlib.sha256(b"what was published").hexdigest())
    try:
        second = validate()
        checks = {c.name: c for c in full_report(second).checks}
        stale = checks.get("build: shared build cache")
        assert stale is not None and "does not match the sha256 recorded" in stale.detail, list(checks)
        assert "built from source again" in stale.detail, stale.detail
        # built afresh in its own scratch: its initialiser ran again and was caught again
        assert second.verdict == "rejected" and "deleted or replaced after it was loaded" in second.reason, \
            second.reason
        assert (entry / f"{address}.so").read_bytes() == planted  # the rejected build did not replace it
        assert published_build(address, f"{address}.so", default_build_dir()) is None
    finally:
        shutil.rmtree(entry, ignore_errors=True)


def test_an_entry_failing_its_checksum_is_named_and_replaced_by_the_next_verified_build(tmp_path):
    build = tmp_path / "build"
    good, bad = _elf(b"the build of its source"), _elf(b"another binary")
    assert publish_build(build, "abc123", good, "abc123.so") == publish_dir(build) / "abc123" / "abc123.so"
    assert published_mismatch(build, "abc123", "abc123.so") == ""
    (publish_dir(build) / "abc123" / "abc123.so").write_bytes(bad)
    why = published_mismatch(build, "abc123", "abc123.so")
    assert "does not match the sha256 recorded when it was published" in why, why
    assert published_build("abc123", "abc123.so", build) is None
    assert publish_build(build, "abc123", good, "abc123.so") is not None  # replaced, not kept
    assert (publish_dir(build) / "abc123" / "abc123.so").read_bytes() == good
    assert published_mismatch(build, "abc123", "abc123.so") == ""
    assert sorted(p.name for p in publish_dir(build).iterdir()) == ["abc123"]  # nothing stale left


def _maps_line(path: Path, st: os.stat_result, offset: int, length: int, perms: str = "r-xp",
               inode: int | None = None, deleted: bool = False) -> str:
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    start = 0x7F0000000000 + offset
    return (f"{start:x}-{start + length:x} {perms} {offset:08x} {dev} {inode or st.st_ino}    {path}"
            + (" (deleted)" if deleted else ""))


def test_only_the_inode_mapped_is_read_for_publication(tmp_path):
    page = os.sysconf("SC_PAGE_SIZE")
    folder = tmp_path / "scratch" / "build" / "abc"
    folder.mkdir(parents=True)
    lib = folder / "abc.so"
    data = bytearray(_elf(b"x" * (2 * page)))
    data[0x38:0x3A] = (1).to_bytes(2, "little")  # one PT_LOAD segment: the first page
    segment = bytearray(56)
    segment[0:4] = (1).to_bytes(4, "little")
    segment[32:40] = page.to_bytes(8, "little")
    data[64:120] = segment
    lib.write_bytes(bytes(data))
    st = lib.stat()
    parts = ["build", "abc", "abc.so"]

    def read(*lines: str) -> bytes:
        return read_loaded_build(tmp_path / "scratch", parts, "\n".join(lines))

    assert read(_maps_line(lib, st, 0, page)) == bytes(data)
    cases = {
        "not mapped in the candidate's process": [_maps_line(tmp_path / "other.so", st, 0, page)],
        "deleted or replaced after it was loaded": [_maps_line(lib, st, 0, page, deleted=True)],
        "was replaced after it was loaded": [_maps_line(lib, st, 0, page, inode=st.st_ino + 1)],
        "truncated after it was loaded": [_maps_line(lib, st, 0, 8 * page)],
        "in no loadable segment": [_maps_line(lib, st, 0, page), _maps_line(lib, st, 2 * page, page, "r--p")],
        "memory map could not be read": [],
    }
    for why, lines in cases.items():
        with pytest.raises(ValueError, match=why):
            read(*lines)
