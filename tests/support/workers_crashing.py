"""A worker that is no trio_graceful program: it checks its sockets, says it is
ready and why it is about to fail (sd_notify's words), and exits with status 3."""

from __future__ import annotations

import os
import socket
import sys
import time

from trio_graceful.workers import inherited_sockets

if __name__ == "__main__":
    [listening] = inherited_sockets()
    assert listening.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        address = os.environ["NOTIFY_SOCKET"]
        notify.sendto(b"READY=1", address)
        notify.sendto(b"STATUS=failing on purpose", address)
    time.sleep(0.1)
    sys.exit(3)
