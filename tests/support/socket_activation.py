"""Start a program the way systemd's socket activation does.

``python socket_activation.py FD COMMAND...`` moves descriptor FD to 3,
sets ``LISTEN_FDS=1``, ``LISTEN_FDNAMES=http`` and ``LISTEN_PID`` to its own
process id, and becomes COMMAND (exec keeps the process id).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    fd = int(sys.argv[1])
    if fd != 3:
        os.dup2(fd, 3)  # inheritable, as systemd leaves it
        os.close(fd)
    os.environ.update(
        LISTEN_FDS="1", LISTEN_FDNAMES="http", LISTEN_PID=str(os.getpid())
    )
    os.execvp(sys.argv[2], sys.argv[2:])
