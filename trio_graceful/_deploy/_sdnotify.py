r"""The systemd notification protocol: telling the service manager how we are.

A service started with ``Type=notify`` finds the manager's socket in
``$NOTIFY_SOCKET`` and sends it datagrams of newline-separated ``KEY=VALUE``
fields (sd_notify(3)). This module is the mechanism, with no dependency; when
to send what is the runner's policy. The decisions, and why:

* **A fresh socket, and the address, for every message**, as libsystemd
  does: after ``systemctl daemon-reexec`` the manager's socket is a new one,
  which a connected socket would miss. Messages are few; a socket is cheap.
* **Sending is synchronous and never fails the program.** A non-blocking
  datagram to a local socket is queued or refused at once, so any code may
  send, without a checkpoint. A failure (the socket vanished, its queue is
  full) is logged, a WARNING naming ``$NOTIFY_SOCKET`` and the error the
  first time, DEBUG after, and the program goes on serving.
* **Fields are checked; status texts are folded.** A value with a line break
  would add a field (``STATUS=x\nREADY=1``), so `SystemdNotifier.notify`
  refuses it. A status is text for humans that may quote a reason from
  anywhere, so ``status`` arguments fold line breaks into spaces, and are
  shortened to fit the manager's 4096-byte buffer.
* **The environment is cleared** by default (libsystemd's
  ``unset_environment``): the processes the program starts do not inherit
  ``$NOTIFY_SOCKET``, so a child that speaks the protocol (another
  trio_graceful program, a daemon using libsystemd) cannot say ``READY=1`` or
  ``STOPPING=1`` for us. ``NotifyAccess=main`` would drop its messages, but
  ``NotifyAccess=all`` would not. The notifier keeps the address it read.
* **No ``MAINPID=``**: with ``Type=notify`` the manager knows its main
  process, the one it started; ``MAINPID=`` is for daemons that fork.
* **AF_UNIX only**: a path or ``@name`` (an abstract socket). The ``vsock:``
  addresses systemd also takes, for virtual machines, get a warning that they
  are not supported, and nothing is sent.
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import sys
from collections.abc import Mapping, MutableMapping
from typing import Final, final

import attrs

from .._core._checks import check_seconds
from .._core._log import library_logger
from .._core._lowlevel import NoPublicConstructor

logger = library_logger("trio_graceful.sdnotify")

ENVIRONMENT: Final = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
"""The variables `notifier_from_environment` reads (and removes by default)."""

WATCHDOG_MIN_INTERVAL: Final = 0.1
"""The shortest `watchdog_interval`, in seconds, whatever ``$WATCHDOG_USEC`` says.

Half of ``WATCHDOG_USEC=1`` would be a keep-alive every half microsecond: a
busy loop sending datagrams. A keep-alive every 0.1 s costs nothing; a
manager that wants them faster (``WatchdogSec`` under 0.1 s) asks for more
than a Trio task can promise anyway."""

# The manager reads at most PIPE_BUF bytes of a datagram and ignores longer
# ones; a status text gets half of that, whatever other fields come with it.
_DATAGRAM_MAX: Final = 4096
_STATUS_MAX: Final = _DATAGRAM_MAX // 2
_USEC_INFINITY: Final = 2**64 - 1  # systemd's "no limit"
_KEY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_POSITIVE: Final = re.compile(r"0*[1-9][0-9]*", re.ASCII)
_LINE_BREAKS: Final = re.compile(r"[\r\n\0]+")


@final
@attrs.define(eq=False)
class SystemdNotifier(metaclass=NoPublicConstructor):
    """Sends notifications to the service manager; made by `notifier_from_environment`.

    Without a usable ``$NOTIFY_SOCKET`` it is disabled: it checks what it is
    given (so mistakes show without systemd) and sends nothing. Any thread and
    synchronous code may call its methods; none is a checkpoint.
    """

    notify_socket: str
    """The value of ``$NOTIFY_SOCKET`` as read (``""`` when it was unset)."""
    watchdog_interval: float | None
    """How often to send `watchdog`, in seconds (half of ``$WATCHDOG_USEC``),
    or None if the manager expects no keep-alives from this process."""
    _address: str | bytes | None
    _failures: int = attrs.field(default=0, init=False)

    @property
    def enabled(self) -> bool:
        """Whether messages are sent; False without a usable ``$NOTIFY_SOCKET``."""
        return self._address is not None

    def notify(self, /, **fields: str) -> bool:
        r"""Send one datagram of ``KEY=VALUE`` lines, in the order given.

        ``notify(READY="1", STATUS="up")`` sends ``b"READY=1\nSTATUS=up"``.

        Returns:
            bool: True if the datagram was handed to the manager's socket;
            False if the notifier is disabled or the send failed (logged).

        Raises:
            TypeError: if a value is not a `str`.
            ValueError: if there is no field, a key is not a variable name, a
                value holds a line break or a NUL, or the datagram is longer
                than 4096 bytes (the manager would drop it).
        """
        datagram = _encode(fields)  # checked even when disabled
        if self._address is None:
            return False
        try:
            with _open_socket() as sock:
                sock.sendto(datagram, self._address)
        except OSError as exc:
            # The first failure is news; a flood of the same would hide the rest.
            self._failures += 1
            level = logging.WARNING if self._failures == 1 else logging.DEBUG
            logger.log(
                level, "cannot notify NOTIFY_SOCKET=%r: %s", self.notify_socket, exc
            )
            return False
        return True

    def ready(self, *, status: str | None = None) -> bool:
        """Say that startup is finished (``READY=1``); see `status`."""
        return self.notify(READY="1", **_status_field(status))

    def stopping(self, *, status: str | None = None) -> bool:
        """Say that the shutdown has begun (``STOPPING=1``); see `status`."""
        return self.notify(STOPPING="1", **_status_field(status))

    def status(self, text: str) -> bool:
        """Send a one-line status for humans (``STATUS=text``).

        Each run of line breaks, carriage returns and NULs becomes one space,
        and a text longer than 2048 bytes (UTF-8) is cut to end with "…", so
        no text adds a field or makes the manager drop the datagram. Returns
        as `notify`.

        Raises:
            TypeError: if ``text`` is not a `str`.
        """
        return self.notify(**_status_field(text))

    def extend_timeout(self, seconds: float, *, status: str | None = None) -> bool:
        """Ask for ``seconds`` more before the manager's current timeout fires.

        Sends ``EXTEND_TIMEOUT_USEC`` in whole microseconds, rounded up. The
        manager moves its start, runtime or stop timeout to *now* plus that
        time, once; send again before it passes to extend again. `math.inf` is
        sent as systemd's infinity; ``0`` is sent, and the manager ignores it.
        Returns as `notify`.

        Raises:
            TypeError: if ``seconds`` is not an int or a float.
            ValueError: if ``seconds`` is negative or NaN.
        """
        usec = check_seconds("seconds", seconds) * 1e6
        # round() first: 2.007 s is 2007000.0000000002 us as a float, not 2007001.
        usec = math.ceil(round(usec, 6)) if usec < _USEC_INFINITY else _USEC_INFINITY
        return self.notify(EXTEND_TIMEOUT_USEC=str(usec), **_status_field(status))

    def watchdog(self) -> bool:
        """Send a keep-alive (``WATCHDOG=1``); see `watchdog_interval`."""
        return self.notify(WATCHDOG="1")


def notifier_from_environment(
    environ: MutableMapping[str, str] = os.environ, *, unset_environment: bool = True
) -> SystemdNotifier:
    """Read ``$NOTIFY_SOCKET`` and the watchdog settings, and make a notifier.

    Unset or empty, ``$NOTIFY_SOCKET`` gives a disabled notifier, silently.
    A value that is not an absolute path or ``@name`` (an abstract socket),
    or that names no socket one can send to, gives a disabled notifier and a
    WARNING naming the value; the program goes on.

    Args:
        environ (~collections.abc.MutableMapping[str, str]): where to read,
            `os.environ` by default.
        unset_environment (bool): remove the variables of `ENVIRONMENT` from
            ``environ`` (whatever they hold), so that the processes started
            later do not notify the manager on this process's behalf.
    """
    value = environ.get("NOTIFY_SOCKET", "")
    address = None
    try:
        address = _check_address(value) if value else None
    except ValueError as exc:
        logger.warning("NOTIFY_SOCKET=%r %s; no notifications are sent", value, exc)
    interval = watchdog_interval(environ) if address is not None else None
    if unset_environment:
        for name in ENVIRONMENT:
            environ.pop(name, None)
    new = SystemdNotifier._create  # pyright: ignore[reportPrivateUsage]
    return new(value, interval, address)


def watchdog_interval(environ: Mapping[str, str] = os.environ) -> float | None:
    """Return how often to send ``WATCHDOG=1``, in seconds, or None.

    That is half of ``$WATCHDOG_USEC``, as sd_watchdog_enabled(3) recommends,
    if it is set and ``$WATCHDOG_PID`` is unset or names this process, but
    never less than `WATCHDOG_MIN_INTERVAL`: a shorter half gives that floor,
    and a WARNING naming the value. A
    ``$WATCHDOG_PID`` naming another process means the keep-alives are that
    process's business: None, silently. A value that is not a positive whole
    number gives a WARNING naming it, and None.
    """
    pid = environ.get("WATCHDOG_PID", "")
    usec = environ.get("WATCHDOG_USEC", "")
    if pid and not _POSITIVE.fullmatch(pid):
        logger.warning(_NO_KEEPALIVES, "WATCHDOG_PID must be a process id", pid)
        return None
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    if not _POSITIVE.fullmatch(usec):
        logger.warning(_NO_KEEPALIVES, "WATCHDOG_USEC must be microseconds > 0", usec)
        return None
    interval = int(usec) / 2_000_000
    if interval < WATCHDOG_MIN_INTERVAL:
        logger.warning(
            "WATCHDOG_USEC=%r asks for a keep-alive every %g s; sending one "
            "every %g s instead (the floor), which may be too late for the "
            "manager's watchdog",
            usec,
            interval,
            WATCHDOG_MIN_INTERVAL,
        )
        return WATCHDOG_MIN_INTERVAL
    return interval


_NO_KEEPALIVES: Final = "%s, not %r; no watchdog keep-alives are sent"


def _check_address(value: str) -> str | bytes:
    """Return the address ``value`` names, or raise ValueError saying why not."""
    address: str | bytes
    unix = "an absolute path, or @name for an abstract socket"
    if value.startswith("/"):
        address = value
    elif value.startswith("@") and len(value) > 1:
        address = b"\0" + os.fsencode(value[1:])
    elif value.startswith("vsock"):
        raise ValueError(f"is AF_VSOCK, which is not supported (only AF_UNIX: {unix})")
    else:
        raise ValueError(f"is not an AF_UNIX address ({unix})")
    # Connecting sends nothing, but fails as a send would if no one listens.
    try:
        with _open_socket() as sock:
            sock.connect(address)
    except OSError as exc:
        raise ValueError(f"names no socket that can be sent to ({exc})") from exc
    return address


def _open_socket() -> socket.socket:
    if sys.platform == "linux":
        kind = socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
        return socket.socket(socket.AF_UNIX, kind)
    else:  # pragma: no cover - no systemd here; CPython sets CLOEXEC itself
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        return sock


def _encode(fields: Mapping[str, object]) -> bytes:
    if not fields:
        raise ValueError("a notification needs at least one field")
    lines: list[bytes] = []
    for key, value in fields.items():
        if not _KEY.fullmatch(key):
            raise ValueError(f"field names must be variable names, not {key!r}")
        if not isinstance(value, str):
            raise TypeError(f"{key} must be a str, not {type(value).__name__}")
        if "\n" in value or "\0" in value:
            raise ValueError(f"{key} must not hold a line break or a NUL: {value!r}")
        try:
            lines.append(f"{key}={value}".encode())
        except UnicodeEncodeError:
            raise ValueError(f"{key} must be valid Unicode: {value!r}") from None
    datagram = b"\n".join(lines)
    if len(datagram) > _DATAGRAM_MAX:
        raise ValueError(f"notifications must be <= 4096 bytes, not {len(datagram)}")
    return datagram


def _status_field(text: object) -> dict[str, str]:
    if text is None:
        return {}
    if not isinstance(text, str):
        raise TypeError(f"status must be a str, not {type(text).__name__} {text!r}")
    # A lone surrogate becomes "?": the manager wants UTF-8 it can show.
    encoded = _LINE_BREAKS.sub(" ", text).encode(errors="replace")
    if len(encoded) > _STATUS_MAX:
        # Cut whole characters only: a partly cut one is dropped.
        cut = encoded[: _STATUS_MAX - 3].decode(errors="ignore")
        return {"STATUS": cut + "\N{HORIZONTAL ELLIPSIS}"}
    return {"STATUS": encoded.decode()}
