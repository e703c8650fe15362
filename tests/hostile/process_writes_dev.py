# Escape: reach outside through /dev. Append to a file another process keeps in /dev/shm, leave a
# file there, write a line into the kernel log. It reports what it got.
import errno

seen = []
for name, path, mode in (("shm-append", "__SHM_FILE__", "ab"), ("shm-new", "__SHM_NEW__", "wb"),
                         ("kmsg", "/dev/kmsg", "wb"), ("null", "/dev/null", "wb")):
    try:
        with open(path, mode) as f:
            f.write(b"__MARKER__\n" * (1 if name != "shm-append" else 1024))
        seen.append(f"{name}=ok")
    except OSError as e:
        seen.append(f"{name}={errno.errorcode.get(e.errno, e.errno)}")


def forward(x, dim, half_to_float):
    raise RuntimeError("dev " + " ".join(seen))
