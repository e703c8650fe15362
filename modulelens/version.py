"""The version the front ends report (CLI ``version``, the MCP server's ``serverInfo``)."""

from __future__ import annotations

__version__ = "0.1.0"  # pyproject.toml's version (re-exported as ``modulelens.__version__``)


def package_version() -> str:
    """The installed distribution's version; :data:`__version__` when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("modulelens")
    except PackageNotFoundError:
        return __version__
