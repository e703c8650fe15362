"""Hostile candidates against the processes around a candidate (issue 22: the fork server; issue 24
items 1-4: a confined checker that follows no name or path the candidate controls, sealed shared
memory, nothing host-side reachable). Each candidate is a file next to this one, written to cheat;
each test asserts that the escape is closed, and for the right reason.

The repository's signing key is planted in a test config folder (``MODULELENS_CONFIG_DIR``), so
"the key never leaves its file" is checked against bytes this test knows. Python candidates (the
triton backend's plain ``forward``) are cheap; two C++ builds are made (a genuine kernel new to
this session -- the genuine softmax of ``tests/test_sandbox_hostile.py`` --, and one that swaps
its own build for a link)."""

from __future__ import annotations

import json
import secrets
import socket
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import anyio
import mcp
import pytest
import torch

import modulelens
from modulelens.kernels import get_backend
from modulelens.kernels import default_build_dir, publish_dir
from modulelens.kernels import KernelSource
from modulelens.registry import ToolContext
from modulelens.sandbox import forkserver
from modulelens.sandbox.containment import namespace_prefix
from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel
from modulelens.validation.candidate_messages import LoadRequest, ReadyRequest
from modulelens.validation.checker import HARNESS, candidates_folder, start_candidate
from tests.conftest import full_report
from tests.test_sandbox_hostile import GENUINE, SoftmaxHead

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
CONTAINED = bool(namespace_prefix()[0])
needs_namespaces = pytest.mark.skipif(not CONTAINED, reason="unshare is not usable on this machine")
LEGIT = "import torch\n\ndef forward(x, dim, half_to_float):\n    return torch.softmax(x, dim)\n"


def candidate(name: str, **values: object) -> str:
    """The hostile candidate ``name`` with its ``__PLACEHOLDERS__`` filled in."""
    text = (HERE / name).read_text()
    for key, value in values.items():
        text = text.replace(f"__{key}__", str(value))
    return text


@dataclass
class World:
    repo: Path
    card_id: str
    key_path: Path
    key: bytes

    def validate(self, source: str, backend: str = "triton", **kw):
        return validate_kernel(ValidateKernelRequest(source_text=source, target=self.card_id, backend=backend, **kw),
                               ToolContext(repo_root=self.repo))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A repository with a softmax card, signed with a key planted in a test config folder."""
    patch = pytest.MonkeyPatch()
    config = tmp_path_factory.mktemp("config")
    key = secrets.token_bytes(32)
    key_path = config / "key"
    key_path.write_bytes(key)
    key_path.chmod(0o600)
    patch.setenv("MODULELENS_CONFIG_DIR", str(config))
    repo = tmp_path_factory.mktemp("repo")
    with modulelens.capture("", name="head", repo=repo, export=False):
        SoftmaxHead()(torch.randn(64, 32))
    ops = capture_ops(CaptureOpsRequest(ref="head", repeats=3), ToolContext(repo_root=repo))
    yield World(repo, next(c for c in ops.cards if c.op == "aten._softmax.default").card_id, key_path, key)
    patch.undo()


def _holds(folder: Path, data: bytes) -> list[Path]:
    """Files under ``folder`` whose bytes contain ``data`` (links are not followed)."""
    found = []
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and data in path.read_bytes():
                found.append(path)
        except OSError:
            continue
    return found


# -- item 1 and 2: the checker follows no name or path of the candidate's, and cannot read the key --

def test_a_build_swapped_for_a_link_to_the_key_is_refused_and_the_key_stays_in_its_file(world):
    r = world.validate(candidate("process_symlinked_build.cpp", KEY_PATH=world.key_path), backend="cpp", time=False)
    assert r.verdict == "rejected" and "its build cannot be verified" in r.reason, r.reason
    assert "without following links" in r.reason, r.reason
    assert not _holds(publish_dir(default_build_dir()), world.key)
    assert world.key.hex() not in r.model_dump_json()
    layers = {x.name: x for x in full_report(r).isolation.layers}
    for name in ("checker: landlock", "checker: signing key and repository unreadable"):
        assert layers[name].in_force, r.isolation.summary()
    assert str(world.key_path) in layers["checker: signing key and repository unreadable"].detail


def test_a_candidate_claiming_another_kernels_build_changes_nothing(world):
    genuine = f"// session {uuid.uuid4().hex}: new to this one, so built before the claim is checked\n" + GENUINE
    victim = get_backend("cpp").build_name(genuine)
    entry = publish_dir(default_build_dir()) / victim
    r = world.validate(candidate("process_claims_build_name.py", VICTIM=victim, KEY_PATH=world.key_path), time=False)
    assert r.verdict == "rejected" and "output 0 is wrong" in r.reason, r.reason
    assert not entry.exists(), "a name the candidate reported was published"
    r = world.validate(genuine, backend="cpp", time=False)
    assert r.verdict == "custom" and r.correct, (r.reason, r.backend_calls)
    library = entry / f"{victim}.so"
    assert library.is_file() and not library.is_symlink()
    assert (entry / "sha256").read_text().strip() == __import__("hashlib").sha256(library.read_bytes()).hexdigest()
    assert not _holds(publish_dir(default_build_dir()), world.key)
    again = world.validate(genuine, backend="cpp", time=False)  # now loaded from the shared cache
    assert again.verdict == "custom", again.reason


def test_no_host_file_content_in_the_report(world):
    manifest = next((world.repo / "opsets" / "head").glob("v*/manifest.json"))
    r = world.validate(candidate("process_symlinked_logs.py", TARGET=manifest))
    assert r.verdict == "rejected" and "SIGSEGV" in r.reason, r.reason
    text = r.model_dump_json()
    stored = json.loads(manifest.read_text())
    needles = [*stored["files"].values(), '"views_time_share"', '"bytes_per_call"']  # sha256 values, keys
    assert needles[0] and '"views_time_share"' in manifest.read_text()
    assert not [n for n in needles if n in text], text[:2000]


def test_validations_after_a_deep_folder_candidate_still_work(world):
    marker = f"ml-deep-{uuid.uuid4().hex[:8]}"
    r = world.validate(candidate("process_deep_folder.py", MARKER=marker), time=False)
    assert r.verdict == "rejected" and "output 0 is wrong" in r.reason, r.reason
    assert not list(candidates_folder().glob(f"*/{marker}")), "the deep folder was left behind"
    r = world.validate(LEGIT, time=False)
    assert r.verdict == "wrapper" and r.correct, r.reason


# -- item 3: shared memory that cannot be pulled away ----------------------------------------------

def test_truncating_the_arena_is_refused_and_the_checker_stays_alive(world):
    from modulelens.mcp_server.server import build_server
    from modulelens.tools import all_tools

    hostile = candidate("process_truncates_arena.py")

    async def session():
        async with mcp.Client(build_server(all_tools(), repo_root=world.repo)) as c:
            r = await c.call_tool("validate_kernel", {"source_text": hostile, "target": world.card_id,
                                                      "backend": "triton", "time": False})
            got = r.structured_content
            assert not r.is_error and got["verdict"] == "rejected", got
            for attempt in ("truncate=EPERM", "grow=EPERM", "write past the end=EPERM", "seal writes=EPERM"):
                assert attempt in got["reason"], got["reason"]
            sealed = next(x for x in got["isolation"]["layers"] if x["name"] == "sealed shared memory")
            assert sealed["in_force"], got["isolation"]
            r = await c.call_tool("validate_kernel", {"source_text": LEGIT, "target": world.card_id,
                                                      "backend": "triton", "time": False})
            assert not r.is_error and r.structured_content["verdict"] == "wrapper", r.structured_content

    anyio.run(session)


# -- item 4: nothing host-side reachable -------------------------------------------------------------

@needs_namespaces
def test_no_write_under_dev_outside_the_private_one(world):
    tag = uuid.uuid4().hex[:8]
    kept, new = Path(f"/dev/shm/ml-hostile-{tag}"), Path(f"/dev/shm/ml-hostile-new-{tag}")
    kept.write_bytes(b"before")
    try:
        r = world.validate(candidate("process_writes_dev.py", SHM_FILE=kept, SHM_NEW=new, MARKER=tag), time=False)
        assert kept.read_bytes() == b"before" and not new.exists()
    finally:
        kept.unlink(missing_ok=True)
        new.unlink(missing_ok=True)
    assert r.verdict == "rejected" and "null=ok" in r.reason, r.reason
    assert "kmsg=EACCES" in r.reason, r.reason  # no file made in /dev, let alone the kernel log
    assert "private /dev" in r.isolation.in_force(), r.isolation.summary()


def test_no_byte_reaches_a_host_unix_socket(world, tmp_path):
    path = str(tmp_path / "host.sock")
    abstract = f"ml-hostile-{uuid.uuid4().hex[:8]}"
    listeners = []
    for address in (path, "\0" + abstract):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(address)
        s.listen(4)
        s.settimeout(0.2)
        listeners.append(s)
    received: list[bytes] = []
    stop = threading.Event()

    def accept(s: socket.socket) -> None:
        while not stop.is_set():
            try:
                conn, _ = s.accept()
                received.append(conn.recv(100) or b"<connected>")
            except OSError:
                pass

    threads = [threading.Thread(target=accept, args=(s,), daemon=True) for s in listeners]
    for t in threads:
        t.start()
    try:
        r = world.validate(candidate("process_unix_sockets.py", PATH=path, ABSTRACT=abstract, MARKER="leak"),
                           time=False)
    finally:
        stop.set()
        for t in threads:
            t.join()
        for s in listeners:
            s.close()
    assert not received, received
    assert r.verdict == "rejected" and "path=EPERM" in r.reason and "abstract=EPERM" in r.reason, r.reason
    seccomp = next(x for x in full_report(r).isolation.layers if x.name == "seccomp")
    assert seccomp.in_force and "socket (every family" in seccomp.detail


# -- issue 22: forks of one template cannot reach it or each other, and leave nothing ----------------

def test_a_candidate_cannot_reach_the_template_or_a_sibling_running_at_the_same_time():
    victim = start_candidate(4096, read_only=[])
    attacker = None
    try:
        assert victim.request(ReadyRequest(backend="triton"), timeout=300).pid == (1 if CONTAINED else victim.pid)
        client, why = forkserver.template(HARNESS, {})
        assert client is not None and client.process is not None, why
        source = candidate("process_reaches_siblings.py", TEMPLATE=client.process.pid, SIBLING=victim.candidate_pid())
        attacker = start_candidate(4096, read_only=[])
        attacker.request(ReadyRequest(backend="triton"), timeout=300)
        loaded = attacker.request(LoadRequest(candidate=KernelSource(backend="triton", source=source),
                                              build_dir=str(attacker.scratch / "build")), timeout=300)
        assert not loaded.ok and "reach " in loaded.error, loaded.error
        attempts = loaded.error.split("reach ", 1)[1].split()
        assert len(attempts) == 12 and not [a for a in attempts if a.endswith("=ok")], attempts
        assert client.alive()
        legit = victim.request(LoadRequest(candidate=KernelSource(backend="triton", source=LEGIT),
                                           build_dir=str(victim.scratch / "build")), timeout=300)
        assert legit.ok, legit.error
        assert victim.layers[0].name == "fork server" and victim.layers[0].in_force
    finally:
        for proc in (victim, attacker):
            if proc is not None:
                proc.remove()


def test_a_candidate_that_forks_and_exits_leaves_nothing_behind(world):
    marker = f"ml-daemon-{uuid.uuid4().hex[:8]}"
    r = world.validate(candidate("process_forks_and_exits.py", MARKER=marker), time=False)
    assert r.verdict == "rejected" and "exited with code 0" in r.reason, r.reason
    deadline = time.monotonic() + 5
    while True:
        survivors = []
        for cmdline in Path("/proc").glob("*/cmdline"):
            try:
                if marker.encode() in cmdline.read_bytes():
                    survivors.append(cmdline)
            except OSError:
                pass
        if not survivors or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not survivors


def test_without_the_fork_server_validation_falls_back_and_says_so(world, monkeypatch):
    import modulelens.sandbox.pool as pools

    monkeypatch.setenv(forkserver.DISABLE, "0")
    monkeypatch.setattr(pools, "_POOLS", {})  # a worker started now, with the variable
    try:
        r = world.validate(LEGIT, time=False)
    finally:
        for found in pools._POOLS.values():
            found.close()
    assert r.verdict == "wrapper" and r.correct, r.reason
    layer = next(x for x in r.isolation.layers if x.name == "fork server")
    assert not layer.in_force and "MODULELENS_FORK_SERVER=0" in layer.detail and "fresh process" in layer.detail
    assert {"seccomp", "landlock", "not dumpable"} <= set(r.isolation.in_force()), r.isolation.summary()


def test_the_candidate_sources_here_are_what_the_tests_run():
    """Every candidate file in this folder is used by a test above (none left unrun)."""
    used = textwrap.dedent(Path(__file__).read_text())
    for path in HERE.glob("process_*"):
        assert f'"{path.name}"' in used, path.name
