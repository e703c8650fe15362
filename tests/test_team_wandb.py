"""Team handover through W&B artifacts: `capture-module --push` writes a real offline W&B run whose
artifact (read back from the run's own record file, not from a mock of the client) lists every file
with W&B's digest, the local tags as aliases and the manifest as metadata, and holds no API key. A
simulated download (the same files copied into a folder) is imported verified and untrusted:
replay is refused until `trust`, then exact; one changed byte is a checksum error. Every W&B failure
is one line. Pulling from a real server runs only with credentials and a test project. A kernel
pack file is pushed the same way (stored as a version of kind packs, its candidates as inputs); a
pulled pack (W&B's API answered from local files) carries the remote's tags as local tags and is
refused by check-pack and use_pack until `trust`."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import struct
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from modulelens.errors import ChecksumMismatch, InvalidName
from modulelens.repo import Repository
from modulelens.team.importer import import_folder
from modulelens.team.model import parse_address

KEY = "sentinel-key-0123456789abcdef0123456789abcdef"
PROJECT = "wandb://my-team/kernels"
KERNELBENCH = """
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.linear = nn.Linear(n, 8)

        def forward(self, x):
            return torch.relu(self.linear(x))

    def get_inputs():
        return [torch.randn(4, 16)]

    def get_init_inputs():
        return [16]
"""


def wandb_records(run_file: Path) -> list:
    """The records of a W&B run file (``run-*.wandb``): a 7-byte header, then a LevelDB-style log of
    32 KiB blocks whose records (7-byte header: crc, length, type) carry protobuf ``Record``s."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, out, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            break
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind == 2 else buf + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


def artifact_records(wandb_dir: Path, timeout: float = 30.0) -> list:
    """The artifact records of the one run under ``wandb_dir``. W&B's service may still be writing
    the run file when ``finish`` returns, so its records are read until the artifacts are there."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        [run_file] = wandb_dir.rglob("run-*.wandb")
        records = [x.artifact for x in wandb_records(run_file) if x.WhichOneof("record_type") == "artifact"]
        if records or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def md5_b64(path: Path) -> str:
    return base64.b64encode(hashlib.md5(path.read_bytes()).digest()).decode()


@pytest.fixture(scope="module")
def pushed(app, tmp_path_factory):
    """One capture of a KernelBench file with `--push` to an offline W&B run, and the artifact
    record read back from that run's file."""
    tmp = tmp_path_factory.mktemp("team")
    (tmp / "kb.py").write_text(textwrap.dedent(KERNELBENCH))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_DIR", str(tmp / "wandb-dir"))
        mp.setenv("WANDB_API_KEY", KEY)
        (tmp / "wandb-dir").mkdir()
        r = CliRunner().invoke(app, ["capture-module", str(tmp / "kb.py"), "--name", "lin", "--push", PROJECT,
                                     "--repo", str(tmp / "repo"), "--json"])
        assert r.exit_code == 0, r.output
        result = json.loads(r.stdout)
        [record] = artifact_records(tmp / "wandb-dir")
        [run_file] = (tmp / "wandb-dir").rglob("run-*.wandb")
        yield {"tmp": tmp, "repo": tmp / "repo", "result": result, "record": record, "run_dir": run_file.parent}


def test_capture_push_writes_an_offline_artifact_with_every_file_its_digest_aliases_and_metadata(pushed):
    record, result = pushed["record"], pushed["result"]
    art = Repository(pushed["repo"]).open("captures", "lin")
    assert result["ref"] == "lin:v1" and result["pushed"] == f"{PROJECT}/capture-lin:local-v1"
    assert record.name == "capture-lin" and record.type == "modulelens-capture"
    assert set(record.aliases) >= {"latest", "local-v1"}
    contents = {entry.path: entry.digest for entry in record.manifest.contents}
    assert set(contents) == set(art.base.files) | {"manifest.json"}  # never the machine-local signature
    for rel, digest in contents.items():
        assert digest == md5_b64(art.path / rel), rel
    metadata = json.loads(record.metadata)
    assert metadata["ref"] == "lin:v1" and metadata["files"] == art.base.files
    assert metadata["modulelens"]["sha256"]["manifest.json"] == hashlib.sha256(
        (art.path / "manifest.json").read_bytes()).hexdigest()
    assert KEY not in record.metadata
    assert not [p for p in pushed["run_dir"].rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]


def test_tags_become_aliases(app, pushed, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(pushed["tmp"] / "wandb-dir"))
    runner = CliRunner()
    assert runner.invoke(app, ["tag-capture", "lin", "prod", "--repo", str(pushed["repo"])]).exit_code == 0
    r = runner.invoke(app, ["push", "lin@prod", "--to", PROJECT, "--repo", str(pushed["repo"]), "--json"])
    assert r.exit_code == 0, r.output
    [pushed_one] = json.loads(r.stdout)["pushed"]
    assert pushed_one["aliases"] == ["prod", "local-v1"] and pushed_one["files"] == len(pushed["record"].manifest.contents)


def _download(pushed, dest: Path) -> tuple[Path, dict[str, str]]:
    """What a pull fetches: the files the artifact lists, and W&B's digests of them."""
    src = Repository(pushed["repo"]).open("captures", "lin").path
    for entry in pushed["record"].manifest.contents:
        (dest / entry.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / entry.path, dest / entry.path)
    return dest, {entry.path: entry.digest for entry in pushed["record"].manifest.contents}


def test_pulled_capture_is_untrusted_until_trust_then_replays_exactly(cli, pushed, tmp_path, monkeypatch):
    monkeypatch.setenv("MODULELENS_CONFIG_DIR", str(tmp_path / "laptop-key"))  # another machine
    folder, digests = _download(pushed, tmp_path / "download")
    laptop = tmp_path / "laptop-repo"
    pulled = import_folder(Repository(laptop), folder, kind="captures", origin=pushed["result"]["pushed"],
                           digests=digests)
    assert (pulled.ref, pulled.trusted, pulled.origin_ref) == ("lin:v1", False, "lin:v1")
    assert "modulelens trust lin:v1" in pulled.next_step
    code, _, r = cli("replay-module", "lin", "--repo", laptop)
    assert code != 0 and "not trusted" in r.output and "Traceback" not in r.output, r.output
    code, data, r = cli("trust", "lin", "--yes", "--repo", laptop, "--json")
    assert code == 0 and data["signed"] is True, r.output
    code, data, r = cli("replay-module", "lin", "--repo", laptop, "--json")
    assert code == 0 and data["match"] is True, r.output
    again = import_folder(Repository(laptop), folder, kind="captures", origin=pushed["result"]["pushed"])
    assert again.already_present and again.ref == "lin:v1" and again.trusted


def test_one_changed_byte_is_a_checksum_error(pushed, tmp_path):
    folder, digests = _download(pushed, tmp_path / "download")
    victim = next(p for p in sorted(folder.rglob("*.safetensors")))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    for remote_digests in (digests, None):  # W&B's md5 first; without it, the manifest's sha256
        with pytest.raises(ChecksumMismatch, match=victim.name) as e:
            import_folder(Repository(tmp_path / "repo"), folder, kind="captures", origin="wandb://t/p/capture-lin:v0",
                          digests=remote_digests)
        assert "\n" not in str(e.value)
    assert not Repository(tmp_path / "repo").names("captures")


@pytest.mark.parametrize("text", ["wandb://team/proj", "wandb://team/proj/capture-lin", "wandb://t/p/capture-lin:prod"])
def test_addresses_parse(text):
    address = parse_address(text)
    assert (address.entity, address.name is None) == (text.split("/")[2], text.count("/") == 3)


@pytest.mark.parametrize("text", ["s3://team/proj", "wandb://team", "wandb://a/b/c/d", "wandb://te am/proj",
                                  "wandb://team/../x", "wandb://team/proj/name:bad alias"])
def test_malformed_addresses_are_refused(text):
    with pytest.raises(InvalidName, match="malformed remote address"):
        parse_address(text)


def _one_line_failure(cli, args: list, expected: str) -> None:
    code, _, r = cli(*args)
    assert code != 0 and expected in r.output and "Traceback" not in r.output, r.output


def test_failures_are_one_line(cli, pushed, monkeypatch, tmp_path):
    repo = str(pushed["repo"])
    _one_line_failure(cli, ["push", "lin", "--to", "wandb://my-team", "--repo", repo], "malformed remote address")
    _one_line_failure(cli, ["pull", "wandb://my-team/kernels/capture-lin:v0", "--repo", repo], "needs a W&B server")
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_IDENTITY_TOKEN_FILE", raising=False)
    (tmp_path / "netrc").write_text("")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    _one_line_failure(cli, ["push", "lin", "--to", PROJECT, "--repo", repo], "no W&B credentials")
    _one_line_failure(cli, ["capture-module", "missing.py", "--push", PROJECT, "--repo", repo], "no W&B credentials")
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if wandb were not installed
    _one_line_failure(cli, ["push", "lin", "--to", PROJECT, "--repo", repo], "needs the wandb package")


def test_an_unknown_artifact_is_one_line(cli, pushed, monkeypatch):
    import wandb
    from wandb.errors import CommError

    class NoSuchArtifact:  # W&B's API answering "not found", without a network
        def artifact(self, path: str):
            raise CommError(f"artifact '{path}' not found in 'my-team/kernels'")

    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    monkeypatch.setattr(wandb, "Api", NoSuchArtifact)
    code, _, r = cli("pull", f"{PROJECT}/capture-nothing:latest", "--repo", pushed["repo"])
    assert code != 0 and "W&B has no artifact" in r.output and "Traceback" not in r.output, r.output
    assert KEY not in r.output


@pytest.mark.skipif(not (os.environ.get("WANDB_API_KEY") and os.environ.get("MODULELENS_TEST_WANDB_PROJECT")),
                    reason="pull from a real W&B server runs only when WANDB_API_KEY and "
                    "MODULELENS_TEST_WANDB_PROJECT (ENTITY/PROJECT) are set")
def test_push_and_pull_through_a_real_server(cli, pushed, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("MODULELENS_CONFIG_DIR", str(tmp_path / "laptop-key"))
    project = f"wandb://{os.environ['MODULELENS_TEST_WANDB_PROJECT']}"
    code, data, r = cli("push", "lin", "--to", project, "--repo", pushed["repo"], "--json")
    assert code == 0, r.output
    code, data, r = cli("pull", data["pushed"][0]["address"], "--repo", tmp_path / "laptop", "--json")
    assert code == 0 and data["trusted"] is False, r.output


def test_a_candidate_goes_with_its_report_and_names_its_card_set_as_input(cli, pushed, tmp_path, monkeypatch):
    from modulelens.kernels.candidates import CandidateManifest, CandidateTarget
    from modulelens.validation.stored_reports import ReportManifest
    from modulelens.validation.report import ValidationSettings

    repo = Repository(tmp_path / "repo")
    repo.create("opsets", "blk", lambda folder: {})  # stands for the card set (only its version is read)

    def candidate(folder: Path) -> CandidateManifest:
        (folder / "kernel.cpp").write_text("// kernel")
        return CandidateManifest(target=CandidateTarget(card_id="blk:v1/0", op="aten.relu.default"), backend="cpp",
                                 source_file="kernel.cpp")

    repo.create("candidates", "blk.card0", candidate)
    repo.create("reports", "blk.card0.v1", lambda folder: ReportManifest(
        candidate="blk.card0:v1", verdict="custom", correct=True, settings=ValidationSettings(card_id="blk:v1/0")))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    code, data, r = cli("push", "blk.card0", "--kind", "candidates", "--to", PROJECT, "--repo", repo.root, "--json")
    assert code == 0, r.output
    cand, report = data["pushed"]
    assert (cand["type"], cand["address"]) == ("modulelens-candidate", f"{PROJECT}/candidate-blk.card0:local-v1")
    assert cand["unresolved_uses"] == [f"{PROJECT}/opset-blk:local-v1"]  # offline: lineage only in metadata
    assert (report["type"], report["unresolved_uses"]) == ("modulelens-report", [cand["address"]])


def test_mcp_push_returns_the_address_and_prints_nothing(pushed, tmp_path, monkeypatch, capfd):
    import anyio
    from mcp import Client

    from modulelens.mcp_server.server import build_server
    from modulelens.tools import all_tools

    monkeypatch.setenv("WANDB_DIR", str(tmp_path))

    async def main():
        async with Client(build_server(all_tools(), repo_root=pushed["repo"])) as client:
            return await client.call_tool("push", {"ref": "lin", "to": PROJECT})

    res = anyio.run(main)
    assert not res.is_error, res.content
    assert res.structured_content["pushed"][0]["address"] == f"{PROJECT}/capture-lin:local-v1"
    assert capfd.readouterr().out == ""  # stdout may be the MCP wire


# ---------------------------------------------------------------------------------------------
# Kernel packs: a pack file is stored as a version of kind packs, pushed with its candidates as
# inputs, pulled as an untrusted version whose pack.json loads only after `trust`.

SOFTMAX_KERNEL = """
import torch
def forward(x, dim, half_to_float):
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)
"""


def _softmax_pack(path: Path, speedup: float = 2.0) -> str:
    """A pack of one Python kernel for the softmax call of the session's `sm` capture; its sha256."""
    import torch

    from modulelens.dispatch.pack import PackContent, PackEntry, current_environment, write_pack
    from modulelens.dispatch.patterns import describe_call
    from modulelens.validation.report import ValidationReport

    report = ValidationReport(verdict="custom", correct=True, reason="test entry", stage="done", backend="triton",
                              speedup_vs_eager=speedup, speedup_interval=[speedup * 0.9, speedup * 1.1])
    entry = PackEntry(candidate_id="sm.card0:v1", kind="op", target="sm:v1/0", capture="sm:v1",
                      op="aten._softmax.default", backend="triton", source=SOFTMAX_KERNEL, source_sha256="test",
                      pattern=describe_call([torch.randn(16, 24), -1, False], {}, grad_enabled=True),
                      report=report, speedup_vs_eager=speedup, speedup_interval=report.speedup_interval)
    return write_pack(path, PackContent(environment=current_environment({"triton"}), entries=[entry]))


@pytest.fixture(scope="module")
def pushed_pack(app, tmp_path_factory):
    """A pack file of the candidate sm.card0:v1, stored and tagged `prod`, pushed to an offline run by
    its path; the artifact record read back from that run's file."""
    from modulelens.kernels.candidates import CandidateManifest, CandidateTarget
    from modulelens.team.packs import store_pack

    tmp = tmp_path_factory.mktemp("team-pack")
    repo = Repository(tmp / "cluster")

    def candidate(folder: Path) -> CandidateManifest:
        (folder / "kernel.py").write_text(SOFTMAX_KERNEL)
        return CandidateManifest(target=CandidateTarget(card_id="sm:v1/0", op="aten._softmax.default"),
                                 backend="triton", source_file="kernel.py")

    repo.create("candidates", "sm.card0", candidate)
    sha = _softmax_pack(tmp / "softmax.pack")
    repo.tag("packs", store_pack(repo, tmp / "softmax.pack").ref, "prod")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_DIR", str(tmp / "wandb-dir"))
        (tmp / "wandb-dir").mkdir()
        r = CliRunner().invoke(app, ["push", str(tmp / "softmax.pack"), "--kind", "packs", "--to", PROJECT,
                                     "--repo", str(repo.root), "--json"])
        assert r.exit_code == 0, r.output
    [record] = artifact_records(tmp / "wandb-dir")
    return {"tmp": tmp, "repo": repo, "sha": sha, "result": json.loads(r.stdout), "record": record}


def test_a_pack_file_is_pushed_as_a_stored_version_with_its_sha256_environment_entries_and_candidates(pushed_pack):
    record, repo = pushed_pack["record"], pushed_pack["repo"]
    [pushed_one] = pushed_pack["result"]["pushed"]
    assert repo.versions("packs", "softmax") == [1]  # the push found the stored version by its sha256
    assert (pushed_one["ref"], pushed_one["type"]) == ("softmax:v1", "modulelens-pack")
    assert pushed_one["address"] == f"{PROJECT}/pack-softmax:local-v1"
    assert pushed_one["unresolved_uses"] == [f"{PROJECT}/candidate-sm.card0:local-v1"]  # offline: metadata only
    assert (record.name, record.type) == ("pack-softmax", "modulelens-pack")
    assert set(record.aliases) >= {"latest", "local-v1", "prod"}
    stored = repo.open("packs", "softmax").path
    contents = {entry.path: entry.digest for entry in record.manifest.contents}
    assert set(contents) == {"manifest.json", "pack.json"}
    for rel, digest in contents.items():
        assert digest == md5_b64(stored / rel), rel
    assert md5_b64(pushed_pack["tmp"] / "softmax.pack") == contents["pack.json"]  # the file as written
    metadata = json.loads(record.metadata)
    assert metadata["sha256"] == pushed_pack["sha"] and metadata["candidates"] == ["sm.card0:v1"]
    assert metadata["environment"]["torch"] and metadata["entries"][0]["dispatched"] is True
    assert metadata["modulelens"]["uses"] == ["sm.card0:v1"]


class _FakeApi:
    """W&B's public API answering one pushed artifact from local files (no network): what a pull
    downloads, with W&B's digests, its version and its aliases."""

    def __init__(self, record, folder: Path):
        from types import SimpleNamespace

        self.artifact_ = SimpleNamespace(
            type=record.type, name=f"{record.name}:v0", version="v0", aliases=[*record.aliases, "v0"],
            manifest=SimpleNamespace(entries={e.path: SimpleNamespace(digest=e.digest) for e in record.manifest.contents}),
            download=lambda root: shutil.copytree(folder, root, dirs_exist_ok=True,
                                                  ignore=shutil.ignore_patterns("manifest.sig")))

    def __call__(self):
        return self

    def artifact(self, path: str):
        return self.artifact_


def _serve(pushed_pack, monkeypatch) -> None:
    import wandb

    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    monkeypatch.setattr(wandb, "Api", _FakeApi(pushed_pack["record"], pushed_pack["repo"].open("packs", "softmax").path))


def test_a_pulled_pack_is_refused_until_trusted_then_check_pack_uses_it(cli, pushed_pack, softmax_card, tmp_path,
                                                                        monkeypatch):
    import modulelens
    from modulelens.repo import UntrustedArtifact

    _serve(pushed_pack, monkeypatch)
    laptop, captures = tmp_path / "laptop", softmax_card[0]
    code, pulled, r = cli("pull", f"{PROJECT}/pack-softmax:prod", "--repo", laptop, "--json")
    assert code == 0, r.output
    assert (pulled["ref"], pulled["origin_ref"], pulled["trusted"], pulled["tags"]) == ("softmax:v1", "softmax:v1",
                                                                                        False, ["prod"])
    path = pulled["path"]
    assert path == str(laptop / "packs" / "softmax" / "v1" / "pack.json") and f"--pack {path}" in pulled["next_step"]
    code, _, r = cli("check-pack", path, "--repo", captures)
    assert code != 0 and "not trusted" in r.output and "Traceback" not in r.output, r.output
    with pytest.raises(UntrustedArtifact, match=re.escape('trust {"ref": "softmax:v1", "kind": "packs"}')):
        modulelens.use_pack(path)
    code, data, r = cli("trust", "softmax", "--kind", "packs", "--yes", "--repo", laptop, "--json")
    assert code == 0 and data["signed"] is True, r.output
    code, data, r = cli("check-pack", path, "--repo", captures, "--json")
    assert code == 0 and data["ok"] is True and data["checks"][0]["hits"] > 0, r.output
    code, again, r = cli("pull", f"{PROJECT}/pack-softmax:latest", "--repo", laptop, "--json")
    assert code == 0 and again["already_present"] and again["trusted"] and again["tags"] == ["prod"], r.output


def test_a_copied_pack_file_is_refused_and_pull_keeps_a_local_tag_that_points_elsewhere(cli, pushed_pack, tmp_path,
                                                                                         monkeypatch):
    from modulelens.dispatch.pack import read_pack
    from modulelens.repo import UntrustedArtifact
    from modulelens.team.packs import store_pack

    (tmp_path / "copy").mkdir()
    shutil.copyfile(pushed_pack["tmp"] / "softmax.pack", tmp_path / "copy" / "softmax.pack")  # not its .sig
    with pytest.raises(UntrustedArtifact, match="not trusted here"):
        read_pack(tmp_path / "copy" / "softmax.pack")
    laptop = Repository(tmp_path / "laptop")
    _softmax_pack(tmp_path / "softmax.pack", speedup=3.0)  # another pack of the same name, tagged prod here
    laptop.tag("packs", store_pack(laptop, tmp_path / "softmax.pack").ref, "prod")
    _serve(pushed_pack, monkeypatch)
    code, pulled, r = cli("pull", f"{PROJECT}/pack-softmax:prod", "--repo", laptop.root, "--json")
    assert code == 0 and pulled["ref"] == "softmax:v2", r.output
    assert pulled["tags"] == [] and pulled["tags_not_set"] == ["prod: already points at softmax:v1 here"]
    assert laptop.aliases("packs", "softmax")["prod"] == 1
