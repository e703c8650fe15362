# Escape: talk to a host process through a Unix socket, path-based or abstract, and send it what
# it can find. It reports what it got.
import errno
import socket

seen = []
for name, address in (("path", "__PATH__"), ("abstract", "\0__ABSTRACT__")):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        try:
            s = socket.socket(socket.AF_UNIX, kind)
            s.connect(address)
            s.sendall(b"__MARKER__")
            seen.append(f"{name}=sent")
        except OSError as e:
            seen.append(f"{name}={errno.errorcode.get(e.errno, e.errno)}")


def forward(x, dim, half_to_float):
    raise RuntimeError("sockets " + " ".join(seen))
