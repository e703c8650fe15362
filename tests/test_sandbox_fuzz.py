"""Bad input to the kernel tools: a clear one-line error, never a traceback, never a host file's
contents."""

from __future__ import annotations

import anyio
import mcp
import pytest

from modulelens.kernels import read_source_file


def _one_line_error(code: int, result) -> str:
    text = result.output
    assert code != 0, text
    assert "Traceback" not in text, text
    return text


@pytest.mark.parametrize("args, word", [
    (["validate-kernel", "--source-text", "x", "--target", "a/1", "--backend", "cpp", "--rtol", "-1"], "rtol"),
    (["validate-kernel", "--source-text", "x", "--target", "a/1", "--backend", "cpp", "--atol", "-1"], "atol"),
    (["validate-kernel", "--source-text", "x", "--target", "a/1", "--backend", "nonsense"], "backend"),
    (["list", "cards", "a", "--op-kind", "nonsense"], "kind"),
    (["capture-ops", "a", "--max-tensor-bytes", "-1"], "max-tensor-bytes"),
])
def test_invalid_numbers_and_unknown_enum_values_are_refused(cli, tmp_path, args, word):
    code, _, result = cli(*args, "--repo", str(tmp_path))
    text = _one_line_error(code, result)
    assert word.replace("-", "_") in text.replace("-", "_"), text


def test_a_host_file_is_not_read_as_a_kernel_source(tmp_path):
    from modulelens.errors import ModuleLensError

    with pytest.raises(ModuleLensError, match="not named like a kernel source"):
        read_source_file(tmp_path.parent / "passwd")
    big = tmp_path / "k.cpp"
    big.write_bytes(b"//" + b"x" * (2 << 20))
    with pytest.raises(ModuleLensError, match="larger than 1 MiB"):
        read_source_file(big)


def test_validate_kernel_over_mcp_does_not_echo_etc_passwd(tmp_path):
    from modulelens.mcp_server.server import build_server
    from modulelens.tools import all_tools

    first = open("/etc/passwd").read().split(":")[0]

    async def session():
        async with mcp.Client(build_server(all_tools(), repo_root=tmp_path)) as c:
            for allow, refusal in ((False, "outside the project folder"), (True, "not named like a kernel source")):
                r = await c.call_tool("validate_kernel", {"source": "/etc/passwd", "target": "a/1", "backend": "cpp",
                                                          "allow_outside": allow})
                text = " ".join(getattr(x, "text", "") for x in r.content)
                assert r.is_error and refusal in text, text
                assert f"{first}:x" not in text and "/bin/" not in text

    anyio.run(session)


def test_a_corrupt_aliases_file_breaks_neither_listing_nor_resolving(tmp_path):
    from modulelens.repo import Repository

    repo = Repository(tmp_path)
    repo.create("captures", "blk", lambda folder: {})
    (tmp_path / "captures" / "blk" / "aliases.json").write_text("{not json")
    assert repo.aliases("captures", "blk") == {"latest": 1}
    assert repo.resolve("captures", "blk") == ("blk", 1)
    (tmp_path / "captures" / "blk" / "aliases.json").write_text('["v1"]')
    assert repo.resolve("captures", "blk:v1") == ("blk", 1)
    repo.create("captures", "blk", lambda folder: {})
    assert repo.aliases("captures", "blk") == {"latest": 2}


@pytest.mark.parametrize("args, word", [
    (["validate-kernel", "--source-text", "x", "--target", "a", "--rtol", "-1"], "rtol"),
    (["validate-kernel", "--source-text", "x", "--target", "a", "--atol", "-1"], "atol"),
    (["capture-module", "x.py", "--module", "m", "--max-tensor-bytes", "-1"], "max-tensor-bytes"),
])
def test_module_tools_refuse_negative_numbers(cli, tmp_path, args, word):
    code, _, result = cli(*args, "--repo", str(tmp_path))
    text = _one_line_error(code, result)
    assert word.replace("-", "_") in text.replace("-", "_"), text


@pytest.mark.parametrize("target", ["/proc", "/sys/kernel"])
def test_install_skills_into_an_unwritable_folder_is_one_line(cli, target):
    code, _, result = cli("install-skills", target)
    text = _one_line_error(code, result)
    assert "nothing is written" in text and repr(target) in text, text


def test_install_skills_where_a_file_blocks_a_folder_is_one_line(cli, tmp_path):
    (tmp_path / ".claude").write_text("a file, not a folder")
    code, _, result = cli("install-skills", str(tmp_path))
    text = _one_line_error(code, result)
    assert "cannot write" in text and f"{tmp_path / '.claude'} is a file, not a folder" in text, text


def _disk_full(*args, **kwargs):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_while_storing_a_capture_names_the_repository_and_what_to_free(tmp_path, monkeypatch):
    import torch

    import modulelens
    from modulelens.errors import ModuleLensError
    from modulelens.repo import store

    monkeypatch.setattr(store, "sign_folder", _disk_full)
    with pytest.raises(ModuleLensError) as caught:
        with modulelens.capture("", name="lin", repo=tmp_path, export=False):
            torch.nn.Linear(4, 4)(torch.randn(2, 4))
    text = str(caught.value)
    assert "no space left" in text and str(tmp_path) in text and "free space" in (caught.value.hint or ""), text
    assert not list((tmp_path / ".tmp").glob("*")), "the half-written version is removed"


def test_a_full_disk_on_a_cli_write_is_one_line(cli, tmp_path, monkeypatch):
    from modulelens.repo import Repository, store

    Repository(tmp_path).create("captures", "blk", lambda folder: {})
    monkeypatch.setattr(store, "_write_json_atomic", _disk_full)
    code, _, result = cli("tag-capture", "blk", "best", "--repo", str(tmp_path))
    text = _one_line_error(code, result)
    assert "no space left" in text and str(tmp_path) in text, text


def test_a_corrupt_aliases_file_does_not_break_list_captures(cli, tmp_path):
    from modulelens.repo import Repository

    Repository(tmp_path).create("captures", "blk", lambda folder: {})
    (tmp_path / "captures" / "blk" / "aliases.json").write_text("{not json")
    code, data, result = cli("list", "captures", "--repo", str(tmp_path), "--json")
    assert code == 0 and "Traceback" not in result.output, result.output


def test_validate_module_over_mcp_does_not_read_etc_passwd(tmp_path):
    from modulelens.mcp_server.server import build_server
    from modulelens.tools import all_tools

    first = open("/etc/passwd").read().split(":")[0]

    async def session():
        async with mcp.Client(build_server(all_tools(), repo_root=tmp_path)) as c:
            for allow, refusal in ((False, "outside the project folder"), (True, "not named like a kernel source")):
                r = await c.call_tool("validate_kernel", {"source": "/etc/passwd", "target": "a", "allow_outside": allow})
                text = " ".join(getattr(x, "text", "") for x in r.content)
                assert r.is_error and refusal in text, text
                assert f"{first}:x" not in text

    anyio.run(session)
