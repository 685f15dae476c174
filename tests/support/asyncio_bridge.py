"""trio_asyncio, imported without tripping the warnings filter on Python 3.12+.

trio-asyncio subclasses `asyncio.AbstractChildWatcher`, which Python 3.12
deprecated, so importing it warns (in trio-asyncio's code, not ours), and the
test suite turns warnings into errors. Test modules import it from here.
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore",
        message="'AbstractChildWatcher' is deprecated",
        category=DeprecationWarning,
    )
    import trio_asyncio

__all__ = ["trio_asyncio"]
