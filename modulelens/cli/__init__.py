"""The ``modulelens`` command line, generated from the tool registry (see :mod:`modulelens.cli.app`).

``from modulelens.cli.app import app`` gives the click application built from every registered
tool (built on first access); :func:`build_app` builds one from any list of tools.
"""

from __future__ import annotations

from modulelens.cli.app import build_app, main

__all__ = ["build_app", "main"]
