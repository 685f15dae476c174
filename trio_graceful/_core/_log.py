r"""The library's loggers: where bundles, the runner and servers say what they do.

Logging is for operators and is always on; tracing (`trio_graceful._core._trace`)
is for tools and costs nothing until a hook is installed. Keeping the logger
here lets every layer log without importing the tracing machinery.

What the library logs carries text it did not write: names of children and
jobs, exception messages, paths. Such text may hold a lone surrogate (a file
name or a command-line argument that was not UTF-8, decoded with
``surrogateescape``, or a message built from one), which a handler writing
UTF-8 strictly (a file, a pipe, ``sys.stdout``) cannot encode: the line is
lost, and ``logging`` prints "--- Logging error ---" instead. Every logger of
the library is made by `library_logger`, whose filter escapes such
characters as ``\udcff`` in the message and the traceback of each record
before any handler sees it; a record without one is left as it is.
"""

from __future__ import annotations

import logging
import traceback
from typing import Final, final

from ._groups import as_group


def escape_surrogates(text: str) -> str:
    r"""Return ``text`` with its lone surrogates written as ``\udcff``.

    ``text`` itself if it has none. Not a checkpoint.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def plural(count: int, noun: str, plural: str | None = None) -> str:
    """Return ``count`` with ``noun``, in the plural unless ``count`` is 1.

    ``plural(1, "connection")`` is ``1 connection``, ``plural(0,
    "connection")`` ``0 connections``; ``plural`` gives an irregular plural
    (``plural(2, "child", "children")``). Every message of the library that
    counts something says it this way. Not a checkpoint.
    """
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def one_line(exc: BaseException) -> str:
    """Return ``exc`` as the last line of its traceback says it, on one line.

    ``OSError: [Errno 98] Address already in use``. A group of one
    exception is said as that exception. Not a checkpoint.
    """
    group = as_group(exc)
    while group is not None and len(group.exceptions) == 1:
        exc = group.exceptions[0]
        group = as_group(exc)
    text = traceback.format_exception_only(type(exc), exc)[0]
    return " ".join(text.split())


@final
class _EscapeSurrogates(logging.Filter):
    """Escape the lone surrogates of a record's message and traceback."""

    _formatter: Final = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        escaped = escape_surrogates(message)
        if escaped is not message:
            record.msg, record.args = escaped, None
        if record.exc_info and not record.exc_text:
            # The handler's formatter would write the same text, and fail.
            text = self._formatter.formatException(record.exc_info)
            escaped = escape_surrogates(text)
            if escaped is not text:
                record.exc_text = escaped
        return True


_ESCAPE: Final = _EscapeSurrogates()


def library_logger(name: str) -> logging.Logger:
    """Return the logger ``name``, whose records are safe for any handler.

    Its filter escapes lone surrogates (see the module docstring). Not a
    checkpoint.
    """
    result = logging.getLogger(name)
    if _ESCAPE not in result.filters:
        result.addFilter(_ESCAPE)
    return result


logger = library_logger("trio_graceful")
"""The ``trio_graceful`` logger: progress and summaries of cancellations,
errors of trace hooks."""
