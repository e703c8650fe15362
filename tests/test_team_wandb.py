"""Team handover through W&B artifacts: `capture-module --push` writes a real offline W&B run whose
artifact (read back from the run's own record file, not from a mock of the client) lists every file
with W&B's digest, the local tags as aliases and the manifest as metadata, and holds no API key. A
simulated download (the same files copied into a folder) is imported verified and untrusted:
replay is refused until `trust`, then exact; one changed byte is a checksum error. Every W&B failure
is one line. Pulling from a real server runs only with credentials and a test project."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import struct
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

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
        [run_file] = (tmp / "wandb-dir").rglob("run-*.wandb")
        [record] = [x.artifact for x in wandb_records(run_file) if x.WhichOneof("record_type") == "artifact"]
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
    from modulelens.kernels.candidates import CandidateManifest, CandidateTarget, ReportManifest
    from modulelens.kernels.report import ValidationSettings

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
