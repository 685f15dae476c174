"""The library's logger: where bundles say what a shutdown is doing.

Logging is for operators and is always on; tracing (`trio_graceful._core._trace`)
is for tools and costs nothing until a hook is installed. Keeping the logger
here lets every layer log without importing the tracing machinery.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("trio_graceful")
"""The ``trio_graceful`` logger: progress and summaries of cancellations,
errors of trace hooks."""
