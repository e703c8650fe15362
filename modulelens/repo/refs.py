"""Names and references: ``name``, ``name:v3``, ``name@tag``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from modulelens.errors import InvalidName

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
_NAME_RULE = (
    "use 1-128 characters from letters, digits, '_', '-' and '.', starting with a letter or digit, "
    "without '..' or path separators"
)


def validate_name(name: str, what: str = "name") -> str:
    """Return ``name`` if it is safe to use as a folder name inside the repository, else raise."""
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise InvalidName(f"invalid {what} {name!r}", _NAME_RULE)
    return name


@dataclass(frozen=True)
class Ref:
    """A parsed reference: exactly one of ``version`` or ``tag`` may be set; neither means latest."""

    name: str
    version: int | None = None
    tag: str | None = None

    def __str__(self) -> str:
        if self.version is not None:
            return f"{self.name}:v{self.version}"
        if self.tag is not None:
            return f"{self.name}@{self.tag}"
        return self.name


def parse_ref(text: str) -> Ref:
    """Parse ``name``, ``name:vN`` (or ``name:N``) and ``name@tag``."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidName("empty reference", "give a reference like 'enc0', 'enc0:v3' or 'enc0@prod'")
    text = text.strip()
    if "@" in text:
        name, tag = text.split("@", 1)
        return Ref(validate_name(name), tag=validate_name(tag, "tag"))
    if ":" in text:
        name, version = text.split(":", 1)
        digits = version[1:] if version[:1] in ("v", "V") else version
        if not digits.isdigit() or int(digits) < 1:
            raise InvalidName(
                f"invalid version {version!r} in reference {text!r}",
                "versions are written v1, v2, ... (for example 'enc0:v3')",
            )
        return Ref(validate_name(name), version=int(digits))
    return Ref(validate_name(text))
