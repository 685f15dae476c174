"""The systemd notification protocol, against real AF_UNIX datagram sockets.

Each test binds the socket a service manager would (a path in ``tmp_path``,
or an abstract name) and reads what arrives. A datagram sent to a local
socket is queued by the time ``sendto`` returns, so the tests read with a
non-blocking ``recv`` and never wait. Only the child-process tests use the
real clock, to run a real interpreter.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from trio_graceful._deploy._sdnotify import (
    WATCHDOG_MIN_INTERVAL,
    SystemdNotifier,
    _open_socket,  # pyright: ignore[reportPrivateUsage]
    notifier_from_environment,
    watchdog_interval,
)

LOGGER = "trio_graceful.sdnotify"


class Manager:
    """The service manager's end: a bound datagram socket, read without waiting."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.setblocking(False)

    def received(self) -> list[bytes]:
        datagrams = []
        while True:
            try:
                datagrams.append(self.sock.recv(65536))
            except BlockingIOError:
                return datagrams


@pytest.fixture
def manager(tmp_path) -> Iterator[tuple[str, Manager]]:
    path = str(tmp_path / "notify")
    end = Manager(path)
    yield path, end
    end.sock.close()


def log_lines(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]


def make(environ: dict[str, str]) -> SystemdNotifier:
    return notifier_from_environment(environ, unset_environment=False)


MESSAGES = [
    (lambda n: n.ready(), b"READY=1"),
    (lambda n: n.ready(status="serving"), b"READY=1\nSTATUS=serving"),
    (lambda n: n.stopping(), b"STOPPING=1"),
    (lambda n: n.stopping(status="draining"), b"STOPPING=1\nSTATUS=draining"),
    (lambda n: n.status("3 tasks left"), b"STATUS=3 tasks left"),
    (
        lambda n: n.status("caf\N{LATIN SMALL LETTER E WITH ACUTE}"),
        b"STATUS=caf\xc3\xa9",
    ),
    (lambda n: n.watchdog(), b"WATCHDOG=1"),
    (lambda n: n.extend_timeout(2.5), b"EXTEND_TIMEOUT_USEC=2500000"),
    # 2.007 s is 2007000.0000000002 microseconds in floating point
    (lambda n: n.extend_timeout(2.007), b"EXTEND_TIMEOUT_USEC=2007000"),
    (lambda n: n.extend_timeout(1e-7), b"EXTEND_TIMEOUT_USEC=1"),
    (lambda n: n.extend_timeout(0), b"EXTEND_TIMEOUT_USEC=0"),
    (lambda n: n.extend_timeout(math.inf), b"EXTEND_TIMEOUT_USEC=18446744073709551615"),
    (lambda n: n.extend_timeout(1e300), b"EXTEND_TIMEOUT_USEC=18446744073709551615"),
    (
        lambda n: n.extend_timeout(30, status="draining, 30 s left"),
        b"EXTEND_TIMEOUT_USEC=30000000\nSTATUS=draining, 30 s left",
    ),
    (
        lambda n: n.notify(RELOADING="1", MONOTONIC_USEC="5"),
        b"RELOADING=1\nMONOTONIC_USEC=5",
    ),
]


@pytest.mark.parametrize(("send", "expected"), MESSAGES)
def test_each_message_is_one_datagram_of_exact_bytes(manager, send, expected):
    path, end = manager
    notifier = make({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert notifier.notify_socket == path
    assert send(notifier) is True
    assert end.received() == [expected]


def test_an_abstract_socket_is_named_with_an_at_sign(tmp_path, caplog):
    name = f"{tmp_path}/abstract"  # unique to this test, bound nowhere on disk
    end = Manager(b"\0" + name.encode())
    try:
        notifier = make({"NOTIFY_SOCKET": "@" + name})
        assert notifier.enabled
        assert notifier.ready(status="up") is True
        assert notifier.watchdog() is True
        assert end.received() == [b"READY=1\nSTATUS=up", b"WATCHDOG=1"]
        assert not (tmp_path / "abstract").exists()
    finally:
        end.sock.close()
    assert log_lines(caplog) == []


@pytest.mark.parametrize("environ", [{}, {"NOTIFY_SOCKET": ""}])
def test_unset_or_empty_gives_a_disabled_notifier_silently(environ, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    notifier = make({**environ, "WATCHDOG_USEC": "1000000"})
    assert not notifier.enabled
    assert notifier.notify_socket == ""
    # No keep-alives without a socket to send them to.
    assert notifier.watchdog_interval is None
    assert notifier.ready(status="up") is False
    assert notifier.watchdog() is False
    assert log_lines(caplog) == []


def test_a_disabled_notifier_still_refuses_bad_fields():
    notifier = make({})
    with pytest.raises(ValueError, match=r"^STATUS must not hold a line break"):
        notifier.notify(STATUS="a\nREADY=1")
    with pytest.raises(ValueError, match=r"^seconds must be >= 0, not -1$"):
        notifier.extend_timeout(-1)


UNIX = "an absolute path, or @name for an abstract socket"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("vsock:2:1234", f"is AF_VSOCK, which is not supported (only AF_UNIX: {UNIX})"),
        (
            "vsock-stream:2:1234",
            f"is AF_VSOCK, which is not supported (only AF_UNIX: {UNIX})",
        ),
        ("run/notify", f"is not an AF_UNIX address ({UNIX})"),
        ("@", f"is not an AF_UNIX address ({UNIX})"),
    ],
)
def test_other_addresses_are_refused_with_a_warning(value, why, caplog):
    notifier = make({"NOTIFY_SOCKET": value})
    assert not notifier.enabled
    assert notifier.notify_socket == value
    assert notifier.ready() is False
    assert log_lines(caplog) == [
        (logging.WARNING, f"NOTIFY_SOCKET={value!r} {why}; no notifications are sent")
    ]


def test_a_socket_missing_at_startup_is_a_warning(tmp_path, caplog):
    path = str(tmp_path / "absent")
    notifier = make({"NOTIFY_SOCKET": path})
    assert not notifier.enabled
    assert notifier.ready() is False  # the program goes on
    assert log_lines(caplog) == [
        (
            logging.WARNING,
            f"NOTIFY_SOCKET={path!r} names no socket that can be sent to "
            "([Errno 2] No such file or directory); no notifications are sent",
        )
    ]


def test_a_missing_abstract_socket_is_a_warning(tmp_path, caplog):
    value = f"@{tmp_path}/nobody"
    assert not make({"NOTIFY_SOCKET": value}).enabled
    assert log_lines(caplog) == [
        (
            logging.WARNING,
            f"NOTIFY_SOCKET={value!r} names no socket that can be sent to "
            "([Errno 111] Connection refused); no notifications are sent",
        )
    ]


def test_a_socket_removed_mid_run_warns_once_then_logs_at_debug(manager, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    path, end = manager
    notifier = make({"NOTIFY_SOCKET": path})
    assert notifier.ready() is True
    end.sock.close()
    os.unlink(path)
    assert notifier.status("still here") is False
    assert notifier.watchdog() is False
    failure = (
        f"cannot notify NOTIFY_SOCKET={path!r}: [Errno 2] No such file or directory"
    )
    assert log_lines(caplog) == [(logging.WARNING, failure), (logging.DEBUG, failure)]
    # The manager binds its socket anew (daemon-reexec): messages reach it.
    again = Manager(path)
    try:
        assert notifier.watchdog() is True
        assert again.received() == [b"WATCHDOG=1"]
    finally:
        again.sock.close()


def test_a_full_queue_fails_the_send_instead_of_blocking(manager, caplog):
    path, end = manager
    notifier = make({"NOTIFY_SOCKET": path})
    # The manager reads nothing; a blocking send would hang here for good.
    sent = 0
    while notifier.watchdog():
        sent += 1
        assert sent < 100_000
    assert sent > 0
    assert end.received() == [b"WATCHDOG=1"] * sent
    assert log_lines(caplog) == [
        (
            logging.WARNING,
            f"cannot notify NOTIFY_SOCKET={path!r}: "
            "[Errno 11] Resource temporarily unavailable",
        )
    ]
    assert notifier.watchdog() is True  # read, the queue takes messages again


@pytest.mark.skipif(sys.platform != "linux", reason="SOCK_CLOEXEC is Linux's")
def test_the_sending_socket_is_close_on_exec_and_non_blocking():
    with _open_socket() as sock:
        assert sock.family == socket.AF_UNIX
        assert sock.type == socket.SOCK_DGRAM
        assert fcntl.fcntl(sock.fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert fcntl.fcntl(sock.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
        assert not sock.getblocking()


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({}, ValueError, "a notification needs at least one field"),
        (
            {"STATUS": "a\nREADY=1"},
            ValueError,
            "STATUS must not hold a line break or a NUL: 'a\\nREADY=1'",
        ),
        (
            {"STATUS": "a\0b"},
            ValueError,
            "STATUS must not hold a line break or a NUL: 'a\\x00b'",
        ),
        ({"STATUS": "\udc80"}, ValueError, "STATUS must be valid Unicode: '\\udc80'"),
        ({"READY": 1}, TypeError, "READY must be a str, not int"),
        (
            {"1READY": "1"},
            ValueError,
            "field names must be variable names, not '1READY'",
        ),
        (
            {"READY=1\nX": "1"},
            ValueError,
            "field names must be variable names, not 'READY=1\\nX'",
        ),
        (
            {"STATUS": "x" * 4090},
            ValueError,
            "notifications must be <= 4096 bytes, not 4097",
        ),
    ],
)
def test_bad_fields_are_refused_and_nothing_is_sent(manager, fields, error, message):
    path, end = manager
    notifier = make({"NOTIFY_SOCKET": path})
    with pytest.raises(error) as caught:
        notifier.notify(**fields)
    assert str(caught.value) == message
    assert end.received() == []


def test_the_largest_datagram_is_sent(manager):
    path, end = manager
    assert make({"NOTIFY_SOCKET": path}).notify(STATUS="x" * 4089) is True
    assert end.received() == [b"STATUS=" + b"x" * 4089]


@pytest.mark.parametrize(
    ("seconds", "error", "message"),
    [
        (-1, ValueError, "seconds must be >= 0, not -1"),
        (-0.5, ValueError, "seconds must be >= 0, not -0.5"),
        (math.nan, ValueError, "seconds must be >= 0, not nan"),
        ("5", TypeError, "seconds must be a number of seconds, not str '5'"),
        (True, TypeError, "seconds must be a number of seconds, not bool True"),
    ],
)
def test_extend_timeout_refuses_bad_seconds(manager, seconds, error, message):
    path, end = manager
    with pytest.raises(error) as caught:
        make({"NOTIFY_SOCKET": path}).extend_timeout(seconds)
    assert str(caught.value) == message
    assert end.received() == []


def test_a_status_cannot_inject_a_field(manager):
    path, end = manager
    notifier = make({"NOTIFY_SOCKET": path})
    notifier.status("a\nREADY=1")
    notifier.stopping(status="one\r\n\r\ntwo\0three\n")
    notifier.ready(status="\udc80 lone surrogate")
    assert end.received() == [
        b"STATUS=a READY=1",
        b"STOPPING=1\nSTATUS=one two three ",
        b"READY=1\nSTATUS=? lone surrogate",
    ]


def test_a_long_status_is_cut_between_characters(manager):
    path, end = manager
    notifier = make({"NOTIFY_SOCKET": path})
    notifier.status("\N{EURO SIGN}" * 1000)  # 3000 bytes
    (datagram,) = end.received()
    # 2045 bytes leave room for 681 whole euro signs, then the ellipsis.
    assert (
        datagram
        == b"STATUS="
        + "\N{EURO SIGN}".encode() * 681
        + "\N{HORIZONTAL ELLIPSIS}".encode()
    )
    with pytest.raises(TypeError, match=r"^status must be a str, not bytes b'x'$"):
        notifier.status(b"x")  # type: ignore[arg-type]


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text())
def test_any_status_text_is_one_field_of_valid_utf8(manager, text):
    path, end = manager
    assert make({"NOTIFY_SOCKET": path}).status(text) is True
    (datagram,) = end.received()
    assert datagram.startswith(b"STATUS=")
    assert b"\n" not in datagram
    assert b"\0" not in datagram
    assert len(datagram) <= len("STATUS=") + 2048
    status = datagram.decode()[len("STATUS=") :]  # valid UTF-8, or this raises
    if len(text.encode(errors="replace")) <= 2048:
        # Folded, not shortened: only line breaks became spaces.
        sent = text.encode(errors="replace").decode()
        assert status.split() == sent.replace("\0", " ").split()


@pytest.mark.parametrize(
    ("environ", "interval"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "200000"}, 0.1),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": ""}, 15.0),
        ({}, None),
        ({"WATCHDOG_USEC": ""}, None),
        ({"WATCHDOG_PID": str(os.getpid())}, None),
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec(environ, interval, caplog):
    assert watchdog_interval(environ) == interval
    assert log_lines(caplog) == []


def test_a_watchdog_meant_for_another_process_is_ignored_silently(caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    other = str(os.getpid() + 1)
    assert (
        watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": other}) is None
    )
    # Not ours, so not ours to judge either.
    assert watchdog_interval({"WATCHDOG_USEC": "soon", "WATCHDOG_PID": other}) is None
    assert log_lines(caplog) == []


@pytest.mark.parametrize(
    ("usec", "half"), [("1", "5e-07"), ("199999", "0.0999995"), ("0000150", "7.5e-05")]
)
def test_the_watchdog_interval_has_a_floor_with_a_warning(usec, half, caplog):
    assert watchdog_interval({"WATCHDOG_USEC": usec}) == WATCHDOG_MIN_INTERVAL == 0.1
    assert log_lines(caplog) == [
        (
            logging.WARNING,
            f"WATCHDOG_USEC={usec!r} asks for a keep-alive every {half} s; "
            "sending one every 0.1 s instead (the floor), which may be too late "
            "for the manager's watchdog",
        )
    ]


@pytest.mark.parametrize(
    "usec", ["0", "-5", "1.5", "30s", " 5", "+5", "\N{ARABIC-INDIC DIGIT FIVE}"]
)
def test_a_bad_watchdog_usec_is_a_warning(usec, caplog):
    assert watchdog_interval({"WATCHDOG_USEC": usec}) is None
    assert log_lines(caplog) == [
        (
            logging.WARNING,
            f"WATCHDOG_USEC must be microseconds > 0, not {usec!r}; "
            "no watchdog keep-alives are sent",
        )
    ]


@pytest.mark.parametrize("pid", ["0", "-1", "self", "1e3"])
def test_a_bad_watchdog_pid_is_a_warning(pid, caplog):
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": pid}) is None
    assert log_lines(caplog) == [
        (
            logging.WARNING,
            f"WATCHDOG_PID must be a process id, not {pid!r}; "
            "no watchdog keep-alives are sent",
        )
    ]


def test_the_notifier_reads_then_removes_the_variables_by_default(manager):
    path, end = manager
    environ = {
        "NOTIFY_SOCKET": path,
        "WATCHDOG_USEC": "4000000",
        "WATCHDOG_PID": str(os.getpid()),
        "HOME": "/root",
    }
    notifier = notifier_from_environment(environ)
    assert environ == {"HOME": "/root"}
    # What was read is kept.
    assert notifier.watchdog_interval == 2.0
    assert notifier.ready() is True
    assert end.received() == [b"READY=1"]
    # Read again, the environment has nothing to say.
    assert not notifier_from_environment(environ).enabled


def test_a_failed_read_still_removes_the_variables():
    environ = {"NOTIFY_SOCKET": "vsock:2:1", "WATCHDOG_USEC": "x", "WATCHDOG_PID": "1"}
    notifier_from_environment(environ)
    assert environ == {}


def test_the_notifier_cannot_be_made_directly():
    with pytest.raises(TypeError, match=r"has no public constructor$"):
        SystemdNotifier("/run/systemd/notify", None, "/run/systemd/notify")


CHILD = (
    "from trio_graceful._deploy._sdnotify import notifier_from_environment as read\n"
    "notifier = read()\n"
    "print(notifier.enabled, notifier.ready(status='child'))\n"
)


def run_child() -> str:
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


@pytest.mark.realtime
def test_a_child_process_cannot_notify_on_our_behalf(manager, monkeypatch):
    path, end = manager
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    notifier = notifier_from_environment()
    assert "NOTIFY_SOCKET" not in os.environ
    assert "WATCHDOG_USEC" not in os.environ
    assert run_child() == "False False\n"
    assert end.received() == []  # the child has exited: what it sent has arrived
    assert notifier.ready() is True
    assert end.received() == [b"READY=1"]


@pytest.mark.realtime
def test_a_child_notifies_if_the_environment_is_kept(manager, monkeypatch):
    # The control for the test above: the child does speak when it can.
    path, end = manager
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    notifier_from_environment(unset_environment=False)
    assert os.environ["NOTIFY_SOCKET"] == path
    assert run_child() == "True True\n"
    assert end.received() == [b"READY=1\nSTATUS=child"]
