# Escape: outlive the validation. Start a daemon in a new session (double fork, then exec so
# that it is a fresh program), then end its own process abruptly.
import os


def forward(x, dim, half_to_float):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sh", ["/bin/sh", "-c", "sleep 300; : __MARKER__"])
        os._exit(0)
    os._exit(0)
