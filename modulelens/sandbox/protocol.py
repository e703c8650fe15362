"""Length-prefixed model JSON over a pipe (never over stdout, which candidates may write to).

The messages themselves are the caller's: :func:`receive` reads a frame as the TypeAdapter it is
given (for workers, :mod:`modulelens.sandbox.worker_messages` and their caller's results)."""

from __future__ import annotations

import os
import struct
from typing import TypeVar

from pydantic import BaseModel, TypeAdapter

T = TypeVar("T")


def send(fd: int, message: BaseModel) -> None:
    """Write ``message`` as one frame: a 4-byte big-endian length, then its JSON."""
    data = message.model_dump_json().encode()
    view = memoryview(struct.pack("!I", len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def receive(fd: int, schema: TypeAdapter[T]) -> T | None:
    """The next frame read as ``schema``, or None when the other end closed the pipe."""
    header = _read_exact(fd, 4)
    if header is None:
        return None
    (size,) = struct.unpack("!I", header)
    body = _read_exact(fd, size)
    return None if body is None else schema.validate_json(body)
