"""Bad input to the kernel tools: a clear one-line error, never a traceback, never a host file's
contents."""

from __future__ import annotations

import anyio
import mcp
import pytest

from modulelens.kernels.source import read_source_file


def _one_line_error(code: int, result) -> str:
    text = result.output
    assert code != 0, text
    assert "Traceback" not in text, text
    return text


@pytest.mark.parametrize("args, word", [
    (["validate-kernel", "--source-text", "x", "--target", "a/1", "--backend", "cpp", "--rtol", "-1"], "rtol"),
    (["validate-kernel", "--source-text", "x", "--target", "a/1", "--backend", "cpp", "--atol", "-1"], "atol"),
    (["validate-kernel", "--source-text", "x", "--target", "a/1", "--backend", "nonsense"], "backend"),
    (["list-op-cards", "a", "--kind", "nonsense"], "kind"),
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
            r = await c.call_tool("validate_kernel", {"source": "/etc/passwd", "target": "a/1", "backend": "cpp"})
            text = " ".join(getattr(x, "text", "") for x in r.content)
            assert r.is_error and "not named like a kernel source" in text, text
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
