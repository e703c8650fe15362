"""Names and references (modulelens.repo.refs): what is accepted, what is refused, and how a
reference prints back."""

from __future__ import annotations

import pytest

from modulelens.errors import InvalidName
from modulelens.repo import Ref, parse_ref, validate_name


@pytest.mark.parametrize("text,ref", [
    ("enc0", Ref("enc0")),
    ("  enc0:v3 ", Ref("enc0", version=3)),
    ("enc0:V12", Ref("enc0", version=12)),
    ("enc0:7", Ref("enc0", version=7)),
    ("blk-1.attn_x@prod", Ref("blk-1.attn_x", tag="prod")),
    ("a@v2", Ref("a", tag="v2")),
])
def test_parse_ref(text, ref):
    assert parse_ref(text) == ref
    assert parse_ref(str(ref)) == ref  # prints back as a reference to the same thing


@pytest.mark.parametrize("text,match", [
    ("", "empty reference"),
    ("   ", "empty reference"),
    ("x:v0", "invalid version"),
    ("x:v", "invalid version"),
    ("x:-1", "invalid version"),
    ("x@", "invalid tag"),
    ("@prod", "invalid name"),
    ("a/b:v1", "invalid name"),
])
def test_bad_refs_are_refused_with_the_rule(text, match):
    with pytest.raises(InvalidName, match=match) as e:
        parse_ref(text)
    assert e.value.hint


def test_validate_name_rules():
    assert validate_name("a" * 128) == "a" * 128
    assert validate_name("v1.2-rc_3") == "v1.2-rc_3"
    for bad in ["a" * 129, "-lead", ".hidden", "a..b", "a b", "a/b", "a\\b", "é", "", None]:
        with pytest.raises(InvalidName):
            validate_name(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidName, match="invalid tag"):
        validate_name("../x", "tag")
