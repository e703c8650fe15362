# Escape: kill the checker. The shared memory the checker reads outputs from is a file the
# candidate holds too: truncate it (a checker reading a mapping past the end dies of SIGBUS), or
# grow it without bound, or seal it against the checker's writes. It reports what it got.
import errno
import fcntl
import os

seen = []
for fd in range(3, 64):
    try:
        if "modulelens-arena" not in os.readlink(f"/proc/self/fd/{fd}"):
            continue
    except OSError:
        continue
    for name in ("truncate", "grow", "write past the end", "seal writes"):
        try:
            if name == "truncate":
                os.ftruncate(fd, 0)
            elif name == "grow":
                os.ftruncate(fd, 1 << 40)
            elif name == "write past the end":
                os.pwrite(fd, b"x", os.fstat(fd).st_size)
            else:
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
            seen.append(f"{name}=ok")
        except OSError as e:
            seen.append(f"{name}={errno.errorcode.get(e.errno, e.errno)}")


def forward(x, dim, half_to_float):
    raise RuntimeError("arena " + " ".join(seen))
