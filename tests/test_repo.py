"""The artifact repository: references, names, versions, aliases, checksums, atomicity, concurrency."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from modulelens.errors import ChecksumMismatch, InvalidName, ReferenceNotFound
from modulelens.repo import Repository, parse_ref


def _write(text: str):
    def write(folder: Path):
        (folder / "data.txt").write_text(text)
        (folder / "sub").mkdir()
        (folder / "sub" / "more.txt").write_text(text * 2)
        return {"payload": text}

    return write


def test_refs_parse():
    assert parse_ref("enc0").version is None
    assert parse_ref("enc0:v3").version == 3
    assert parse_ref("enc0:3").version == 3
    assert parse_ref("enc0@prod").tag == "prod"
    for bad in ["../x", "a/b", "..", "x:v0", "x:vv", "", "a@../b", "/abs", "x\\y"]:
        with pytest.raises(InvalidName):
            parse_ref(bad)


def test_versions_aliases_and_resolution(tmp_path):
    repo = Repository(tmp_path)
    a1 = repo.create("captures", "enc0", _write("one"))
    a2 = repo.create("captures", "enc0", _write("two"))
    assert (a1.version, a2.version) == (1, 2)
    assert repo.open("captures", "enc0").raw_manifest["payload"] == "two"
    assert repo.open("captures", "enc0:v1").raw_manifest["payload"] == "one"
    repo.tag("captures", "enc0:v1", "prod")
    assert repo.open("captures", "enc0@prod").version == 1
    assert repo.open("captures", "enc0@latest").version == 2
    m = a1.raw_manifest
    assert m["schema_version"] == 1 and set(m["files"]) == {"data.txt", "sub/more.txt"}
    with pytest.raises(ReferenceNotFound, match="no version v9"):
        repo.open("captures", "enc0:v9")
    with pytest.raises(ReferenceNotFound, match="no tag"):
        repo.open("captures", "enc0@nope")
    with pytest.raises(ReferenceNotFound, match="did you mean enc0"):
        repo.open("captures", "enc1")


def test_tampered_file_is_detected(tmp_path):
    repo = Repository(tmp_path)
    art = repo.create("captures", "x", _write("good"))
    (art.path / "data.txt").write_text("evil")
    fresh = repo.open("captures", "x")
    with pytest.raises(ChecksumMismatch, match="does not match the sha256"):
        fresh.file("data.txt")
    assert fresh.file("sub/more.txt").read_text() == "goodgood"


def test_failed_write_leaves_nothing(tmp_path):
    repo = Repository(tmp_path)
    repo.create("captures", "x", _write("ok"))

    def broken(folder: Path):
        (folder / "half.bin").write_bytes(b"123")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        repo.create("captures", "x", broken)
    assert repo.versions("captures", "x") == [1]
    assert not any((tmp_path / ".tmp").iterdir())


def test_bad_name_cannot_escape(tmp_path):
    repo = Repository(tmp_path / "repo")
    with pytest.raises(InvalidName):
        repo.create("captures", "../x", _write("no"))
    assert not (tmp_path / "x").exists()


def _create_many(root: str, n: int) -> list[int]:
    repo = Repository(root)
    return [repo.create("captures", "same", _write(f"{i}")).version for i in range(n)]


def test_concurrent_writers_get_distinct_versions(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.starmap(_create_many, [(str(tmp_path), 5)] * 4)
    versions = sorted(v for r in results for v in r)
    assert versions == list(range(1, 21))
    repo = Repository(tmp_path)
    for v in versions:
        art = repo.open("captures", f"same:v{v}")
        assert art.file("data.txt").read_text() == art.raw_manifest["payload"]
    assert json.loads((tmp_path / "captures" / "same" / "aliases.json").read_text())["latest"] == 20


def test_a_manifest_keeps_non_finite_floats(tmp_path):
    """-inf and NaN survive create -> open, and the JSON form of the manifest keeps them too."""
    import math

    from modulelens.repo import ManifestBase

    class Limits(ManifestBase):
        low: float
        spread: float
        values: list[float]

    repo = Repository(tmp_path)
    art = repo.create("limits", "l", lambda folder: Limits(low=-math.inf, spread=math.nan, values=[math.inf, 1.0]))
    m = repo.open("limits", art.ref).manifest_as(Limits)
    assert m.low == -math.inf and math.isnan(m.spread) and m.values == [math.inf, 1.0]
    text = m.model_dump_json()
    assert '"low":-Infinity' in text and '"spread":NaN' in text
    assert Limits.model_validate_json(text).low == -math.inf
