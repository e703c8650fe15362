"""Backends: each one small file behind the :class:`~modulelens.kernels.backends.base.Backend` protocol."""

from modulelens.kernels.backends.base import Backend, BackendStatus, CompileError, get_backend

__all__ = ["Backend", "BackendStatus", "CompileError", "get_backend"]
