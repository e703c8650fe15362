"""The version the front ends report (CLI ``version``, the MCP server's ``serverInfo``)."""

from __future__ import annotations


def package_version() -> str:
    """The installed distribution's version; ``modulelens.__version__`` when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("modulelens")
    except PackageNotFoundError:
        import modulelens

        return modulelens.__version__
