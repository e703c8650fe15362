"""Start the sandbox worker of a CLI command that will validate, before the command imports torch.

A one-shot ``modulelens validate-kernel ...`` needs two Python processes that import torch: the
command itself and the sandbox worker it validates in (a template that candidate processes are
forked from, see :mod:`modulelens.sandbox.worker`). Started one after the other, that is two
imports of torch in a row; imported first by ``modulelens/__init__``, this module starts the worker
at once when the command line (``sys.orig_argv``: the ``modulelens`` script or ``python -m
modulelens``) runs one of :data:`VALIDATING`, so both imports run side by side. It is the worker the
command's pool would start (same runner, memory limit and environment: see
:func:`modulelens.sandbox.pool.prestart`); one never used is killed at exit. It only ever starts
modulelens's own worker, and ``MODULELENS_PRESTART=0`` turns it off.
"""

from __future__ import annotations

import os
import sys

VALIDATING = frozenset({"validate-kernel"})


def command_args(orig_argv: list[str]) -> list[str] | None:
    """The arguments after ``modulelens`` on a command line that runs the CLI, else None."""
    for i, arg in enumerate(orig_argv[:-1]):
        if arg == "-m":
            return orig_argv[i + 2:] if orig_argv[i + 1] == "modulelens" else None
    if len(orig_argv) > 1 and os.path.basename(orig_argv[1]) == "modulelens":
        return orig_argv[2:]
    return None


def memory_limit(args: list[str], default: int) -> int:
    """The ``--memory-limit-mb`` the command gives, else ``default``."""
    for i, arg in enumerate(args):
        value = arg.partition("=")[2] if arg.startswith("--memory-limit-mb=") else (
            args[i + 1] if arg == "--memory-limit-mb" and i + 1 < len(args) else None)
        if value is not None and value.isdigit():
            return int(value)
    return default


def maybe_prestart() -> None:
    """Start the validation worker now when this process is a CLI command of :data:`VALIDATING`."""
    if os.environ.get("MODULELENS_PRESTART") == "0":
        return
    args = command_args(list(getattr(sys, "orig_argv", [])))
    if not args or args[0] not in VALIDATING or "--help" in args:
        return
    try:
        from modulelens.sandbox import DEFAULT_MEMORY_LIMIT_MB, prestart
        from modulelens.validation import VALIDATION_RUNNER

        prestart(VALIDATION_RUNNER, memory_limit(args, DEFAULT_MEMORY_LIMIT_MB))
    except Exception:  # noqa: BLE001 - a head start only: the pool starts its worker itself otherwise
        pass
