"""The skill pack: its files in this repository, and install_skills through the CLI and Python."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from modulelens.cli.app import build_app
from modulelens.errors import ModuleLensError
from modulelens.registry import ToolContext
from modulelens.tools import all_tools, get_tool
from modulelens.tools.install_skills import (
    InstallSkillsRequest,
    available_skills,
    install_skills,
    parse_skill,
    skill_to_mdc,
    skills_dir,
)

ROOT = Path(__file__).resolve().parent.parent
SKILL_FILES = sorted((ROOT / "skills").glob("*/SKILL.md"))
EXPECTED_SERVER = {"command": "modulelens", "args": ["mcp"]}


@pytest.fixture(scope="module")
def app():
    return build_app(all_tools())


def _cli(app, *args: str):
    return CliRunner().invoke(app, list(args))


def _expected_files(names: list[str]) -> set[str]:
    files = {".mcp.json", ".cursor/mcp.json"}
    for n in names:
        files |= {f"skills/{n}/SKILL.md", f".claude/skills/{n}/SKILL.md", f".cursor/rules/{n}.mdc"}
    return files


# --------------------------------------------------------------------------------------------
# The files in this repository
# --------------------------------------------------------------------------------------------


def test_skills_have_name_and_description():
    assert SKILL_FILES, "no skills/*/SKILL.md"
    for path in SKILL_FILES:
        meta, body = parse_skill(path.read_text(encoding="utf-8"), str(path))
        assert meta.get("name") == path.parent.name, path
        assert len(meta.get("description", "")) > 40, path
        assert "Use when" in meta["description"], path
        assert body.strip(), path


def test_claude_skills_resolve_to_the_canonical_files():
    for path in SKILL_FILES:
        claude = ROOT / ".claude" / "skills" / path.parent.name / "SKILL.md"
        assert claude.resolve() == path.resolve(), claude


def test_packaged_skills_are_the_repository_skills():
    assert skills_dir().resolve() == (ROOT / "skills").resolve()
    assert set(available_skills()) == {p.parent.name for p in SKILL_FILES}


def test_cursor_rules_are_generated_from_the_skills():
    for path in SKILL_FILES:
        name = path.parent.name
        mdc = ROOT / ".cursor" / "rules" / f"{name}.mdc"
        expected = skill_to_mdc(path.read_text(encoding="utf-8"), name, str(path))
        assert mdc.read_text(encoding="utf-8") == expected, (
            f"{mdc} drifted from {path}: regenerate it with skill_to_mdc (or `modulelens install-skills . --force`)"
        )
        meta, body = parse_skill(expected)
        assert meta["alwaysApply"] == "false"
        assert meta["description"] == parse_skill(path.read_text(encoding="utf-8"))[0]["description"]
        assert body.endswith(parse_skill(path.read_text(encoding="utf-8"))[1])


@pytest.mark.parametrize("rel", [".mcp.json", ".cursor/mcp.json"])
def test_mcp_configs_start_modulelens_mcp(rel):
    data = json.loads((ROOT / rel).read_text(encoding="utf-8"))
    assert data["mcpServers"]["modulelens"] == EXPECTED_SERVER


def test_claude_settings_enable_the_server():
    data = json.loads((ROOT / ".claude" / "settings.json").read_text(encoding="utf-8"))
    assert "modulelens" in data["enabledMcpjsonServers"]
    assert "Bash(modulelens:*)" in data["permissions"]["allow"]


def test_mdc_description_is_quoted_when_yaml_needs_it():
    text = "---\nname: x\ndescription: 'Does a: b. Use when c'\n---\nbody\n"
    meta, body = parse_skill(skill_to_mdc(text, "x"))
    assert meta["description"] == "Does a: b. Use when c"
    assert body.endswith("body\n")


# --------------------------------------------------------------------------------------------
# install_skills
# --------------------------------------------------------------------------------------------


def test_install_through_the_cli_then_unchanged(app, tmp_path):
    names = [p.parent.name for p in SKILL_FILES]
    r = _cli(app, "install-skills", str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    first = json.loads(r.stdout)
    assert set(first["written"]) == _expected_files(names)
    assert first["unchanged"] == [] and first["skipped"] == []
    assert first["skills"] == names and first["next_steps"]
    for path in SKILL_FILES:
        n = path.parent.name
        text = path.read_text(encoding="utf-8")
        assert (tmp_path / "skills" / n / "SKILL.md").read_text(encoding="utf-8") == text
        claude = tmp_path / ".claude" / "skills" / n / "SKILL.md"
        assert not claude.is_symlink() and claude.read_text(encoding="utf-8") == text
        assert (tmp_path / ".cursor" / "rules" / f"{n}.mdc").read_text(encoding="utf-8") == skill_to_mdc(text, n)
    for rel in (".mcp.json", ".cursor/mcp.json"):
        assert json.loads((tmp_path / rel).read_text())["mcpServers"] == {"modulelens": EXPECTED_SERVER}

    r = _cli(app, "install-skills", str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    second = json.loads(r.stdout)
    assert second["written"] == [] and second["skipped"] == []
    assert set(second["unchanged"]) == _expected_files(names)

    r = _cli(app, "install-skills", str(tmp_path))  # the human view
    assert r.exit_code == 0, r.output
    assert "unchanged" in r.stdout


def test_existing_servers_and_keys_are_kept(tmp_path):
    other = {"command": "node", "args": ["server.js"], "env": {"A": "1"}}
    (tmp_path / ".mcp.json").write_text(json.dumps({"mcpServers": {"other": other}, "note": "keep"}))
    (tmp_path / ".cursor").mkdir()
    (tmp_path / ".cursor" / "mcp.json").write_text(json.dumps({"mcpServers": {
        "modulelens": {**EXPECTED_SERVER, "env": {"MODULELENS_HOME": "/data"}}}}))
    res = install_skills(InstallSkillsRequest(target=str(tmp_path)), ToolContext())
    assert ".mcp.json" in res.written
    assert ".cursor/mcp.json" in res.unchanged  # same command and args; the user's env stays
    data = json.loads((tmp_path / ".mcp.json").read_text())
    assert data["note"] == "keep"
    assert data["mcpServers"] == {"other": other, "modulelens": EXPECTED_SERVER}
    cursor = json.loads((tmp_path / ".cursor" / "mcp.json").read_text())
    assert cursor["mcpServers"]["modulelens"]["env"] == {"MODULELENS_HOME": "/data"}


def test_differing_files_are_skipped_unless_forced(tmp_path):
    name = SKILL_FILES[0].parent.name
    tool = get_tool("install_skills")
    mine = tmp_path / ".cursor" / "rules" / f"{name}.mdc"
    mine.parent.mkdir(parents=True)
    mine.write_text("my own rule\n")
    (tmp_path / ".mcp.json").write_text(json.dumps({"mcpServers": {"modulelens": {"command": "other"}}}))
    res = tool(InstallSkillsRequest(target=str(tmp_path), skills=[name]))
    assert set(res.skipped) == {f".cursor/rules/{name}.mdc", ".mcp.json"}
    assert "--force" in res.next_steps
    assert mine.read_text() == "my own rule\n"

    res = tool(InstallSkillsRequest(target=str(tmp_path), skills=[name], force=True))
    assert res.skipped == [] and set(res.written) == {f".cursor/rules/{name}.mdc", ".mcp.json"}
    assert mine.read_text() != "my own rule\n"
    assert json.loads((tmp_path / ".mcp.json").read_text())["mcpServers"]["modulelens"] == EXPECTED_SERVER


def test_invalid_json_names_the_file_and_writes_nothing(app, tmp_path):
    (tmp_path / ".cursor").mkdir()
    bad = tmp_path / ".cursor" / "mcp.json"
    bad.write_text("{not json")
    r = _cli(app, "install-skills", str(tmp_path))
    assert r.exit_code == 2
    assert "mcp.json" in r.output and "not valid JSON" in r.output
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [".cursor", ".cursor/mcp.json"]
    assert bad.read_text() == "{not json"

    r = _cli(app, "install-skills", str(tmp_path), "--json")
    assert r.exit_code == 2
    assert str(bad) in json.loads(r.stdout)["error"]


def test_mcp_servers_must_be_an_object(tmp_path):
    (tmp_path / ".mcp.json").write_text('{"mcpServers": []}')
    with pytest.raises(ModuleLensError, match="mcpServers"):
        install_skills(InstallSkillsRequest(target=str(tmp_path)), ToolContext())
    assert not (tmp_path / "skills").exists()


def test_unknown_skill_and_missing_target(app, tmp_path):
    r = _cli(app, "install-skills", str(tmp_path), "--skills", "no-such-skill")
    assert r.exit_code == 2 and "no-such-skill" in r.output
    r = _cli(app, "install-skills", str(tmp_path / "absent"))
    assert r.exit_code == 2 and "does not exist" in r.output


def test_default_target_is_the_current_folder(app, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = _cli(app, "install-skills", "--json")
    assert r.exit_code == 0, r.output
    assert Path(json.loads(r.stdout)["target"]) == tmp_path.resolve()
    assert (tmp_path / ".mcp.json").is_file()
