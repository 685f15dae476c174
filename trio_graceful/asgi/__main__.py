"""``python -m trio_graceful.asgi MODULE:APP --bind HOST:PORT [--workers N] ...``."""

import sys

from ._command import main

if __name__ == "__main__":
    sys.exit(main())
