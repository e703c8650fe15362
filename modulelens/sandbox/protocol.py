"""Length-prefixed JSON messages over a pipe (never over stdout, which candidates may write to)."""

from __future__ import annotations

import json
import os
import struct
from typing import Any


def send(fd: int, message: dict[str, Any]) -> None:
    data = json.dumps(message, default=str).encode()
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


def receive(fd: int) -> dict[str, Any] | None:
    """The next message, or None when the other end closed the pipe."""
    header = _read_exact(fd, 4)
    if header is None:
        return None
    (size,) = struct.unpack("!I", header)
    body = _read_exact(fd, size)
    return None if body is None else json.loads(body)
