"""Backends: each one small file behind the :class:`~modulelens.kernels.backends.base.Backend`
protocol, found through the table in :mod:`~modulelens.kernels.backends.base`."""

from modulelens.kernels.backends.base import BACKENDS, Backend, BackendStatus, CompileError, get_backend

__all__ = ["BACKENDS", "Backend", "BackendStatus", "CompileError", "get_backend"]
