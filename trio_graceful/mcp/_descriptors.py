"""Taking the client's pipes off descriptors 0 and 1 while a server runs.

An MCP client talks to its server over the server's stdin and stdout, so
anything else that reads fd 0 or writes fd 1 breaks the conversation: a
``print()`` in a tool puts a line that is not JSON-RPC on the wire, and a
subprocess that inherits fd 0 reads requests meant for the server. The SDK's
own transport avoids both by serving the wire from private duplicates and
pointing the standard descriptors elsewhere; `claim_stdio` does the same:

* the wire is read and written through duplicates above 2, close-on-exec, so
  no subprocess inherits them;
* fd 0 becomes ``/dev/null`` (a tool or subprocess that reads stdin reads
  end-of-file) and fd 1 becomes a copy of fd 2 (what is printed goes to
  stderr, with the log);
* both are put back when the server stops.

The duplicates share the open file descriptions of the originals, so their
flags are the originals' and are never changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Generator


@contextlib.contextmanager
def claim_stdio() -> Generator[tuple[int, int], None, None]:
    """Yield private duplicates of fds 0 and 1; divert the originals meanwhile.

    Raises:
        OSError: if fd 0 or fd 1 is not open.
    """
    sys.stdout.flush()
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    try:
        wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    except OSError:
        os.close(wire_in)
        raise
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
    finally:
        os.close(null)
    try:
        yield wire_in, wire_out
    finally:
        # What was printed meanwhile belongs on stderr, where fd 1 points.
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)
        os.close(wire_in)
        os.close(wire_out)
