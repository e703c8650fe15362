"""Length-prefixed model JSON over a pipe or a socket (never over stdout, which candidates may write to).

The messages themselves are the caller's: :func:`receive` reads a frame as the TypeAdapter it is
given (for workers, :mod:`modulelens.sandbox.worker_messages` and their caller's results).

A frame may carry file descriptors when the channel is a Unix socket pair (the request channel of a
candidate process, the request channel of a fork server): :func:`send` attaches them to the frame's
first bytes (``SCM_RIGHTS``) and :func:`receive_with_fds` collects them with the frame, so a
descriptor always arrives with the message that says what it is."""

from __future__ import annotations

import array
import os
import socket
import struct
from typing import TypeVar

from pydantic import BaseModel, TypeAdapter

T = TypeVar("T")
MAX_FDS = 16


def send(fd: int, message: BaseModel, fds: tuple[int, ...] | list[int] = ()) -> None:
    """Write ``message`` as one frame: a 4-byte big-endian length, then its JSON. ``fds`` (only on a
    Unix socket) travel with the frame's first bytes."""
    data = message.model_dump_json().encode()
    view = memoryview(struct.pack("!I", len(data)) + data)
    if fds:
        sock = socket.socket(fileno=os.dup(fd))
        try:
            n = sock.sendmsg([view], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        finally:
            sock.close()
        view = view[n:]
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


def receive_fds(fd: int, nbytes: int) -> tuple[bytes, list[int]]:
    """Up to ``nbytes`` bytes from the Unix socket ``fd`` and the descriptors that came with them
    (close-on-exec). Empty bytes: the other end closed."""
    sock = socket.socket(fileno=os.dup(fd))
    try:
        space = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
        data, ancillary, _, _ = sock.recvmsg(nbytes, space, socket.MSG_CMSG_CLOEXEC)
    finally:
        sock.close()
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            got = array.array("i")
            got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
            fds.extend(got)
    return data, fds


def receive_with_fds(fd: int, schema: TypeAdapter[T]) -> tuple[T | None, list[int]]:
    """The next frame of the Unix socket ``fd`` read as ``schema`` and the descriptors sent with it
    (None and [] when the other end closed). The caller owns the descriptors."""
    header, fds = receive_fds(fd, 4)
    if not header:
        return None, fds
    if len(header) < 4:
        rest = _read_exact(fd, 4 - len(header))
        if rest is None:
            _close_all(fds)
            return None, []
        header += rest
    (size,) = struct.unpack("!I", header)
    body = _read_exact(fd, size)
    if body is None:
        _close_all(fds)
        return None, []
    try:
        return schema.validate_json(body), fds
    except ValueError:
        _close_all(fds)
        raise


def _close_all(fds: list[int]) -> None:
    for x in fds:
        try:
            os.close(x)
        except OSError:
            pass
