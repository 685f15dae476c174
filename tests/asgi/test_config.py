"""Hypercorn's Config in serve_asgi: each field honoured, or refused at once."""

from __future__ import annotations

import functools
import gc
import inspect
import logging
import re
import socket
import ssl
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
import trustme
import wsproto
import wsproto.events
from hypercorn.config import Config
from hypercorn.utils import LifespanTimeoutError

import trio_graceful
import trio_graceful.asgi
from tests.support.asgi_app import Log, make_app
from tests.support.asgi_server import (
    RawClient,
    Receive,
    Scope,
    Send,
    Served,
    lifespan_only,
    serving,
)
from trio_graceful.asgi._config import FIELDS, HONOURED, OnlyWith, Refused

DOCS = Path(__file__).parents[2] / "docs" / "asgi.rst"


def _settings() -> set[str]:
    """Every public field of Hypercorn's Config: its settings and properties."""
    names = set(vars(Config)) | set(Config.__annotations__)
    return {
        name
        for name in names
        if not name.startswith("_")
        and not inspect.isfunction(inspect.getattr_static(Config, name, None))
        and not isinstance(inspect.getattr_static(Config, name, None), classmethod)
    }


def test_the_table_decides_for_every_field_of_config() -> None:
    assert set(FIELDS) == _settings()


def test_the_docs_table_names_every_field_of_config() -> None:
    text = DOCS.read_text()
    table = text[text.index(".. _asgi-config:") :]
    rows = set(re.findall(r"^   \* - ``(\w+)``", table, re.MULTILINE))
    assert rows == _settings()


def _config(**fields: object) -> Config:
    config = Config()
    for name, value in fields.items():
        setattr(config, name, value)
    return config


async def _start_serving(
    bundle: trio_graceful.Bundle,
    inbox: trio_graceful.InboxReceiver[Any],
    app: object,
    config: Config,
) -> None:
    """Start ``app`` under `serve_asgi` as a child of ``bundle``."""
    await bundle.start(
        functools.partial(trio_graceful.asgi.serve_asgi, inbox, app, config=config)
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"workers": 4},
            "config.workers = 4 is not supported by serve_asgi: serve_asgi serves "
            "in its caller's Trio run, in one process: start, restart and count "
            "processes with the supervisor (systemd, Kubernetes...)",
        ),
        (
            {"graceful_timeout": 10},
            "config.graceful_timeout = 10 is not supported by serve_asgi: the grace "
            "of the shutdown decides (trio_graceful.run(grace=...), or the grace of "
            "the bundle's shutdown)",
        ),
        (
            {"use_reloader": True},
            "config.use_reloader = True is not supported by serve_asgi: restart the "
            "program when its files change with a watcher (watchfiles, say) or the "
            "supervisor",
        ),
        (
            {"worker_class": "uvloop"},
            "config.worker_class = 'uvloop' is not supported by serve_asgi: "
            "serve_asgi runs on Trio (only 'trio' is accepted)",
        ),
        (
            {"quic_bind": "127.0.0.1:4433"},
            "config.quic_bind = ['127.0.0.1:4433'] is not supported by serve_asgi: "
            "HTTP/3 over QUIC is not served; listen with bind",
        ),
        (
            {"certfile": "cert.pem"},
            "config.certfile = 'cert.pem' needs config.keyfile too",
        ),
        (
            {"ca_certs": "ca.pem"},
            "config.ca_certs = 'ca.pem' needs TLS: set config.certfile and "
            "config.keyfile",
        ),
        (
            {"insecure_bind": "127.0.0.1:0"},
            "config.insecure_bind = ['127.0.0.1:0'] needs TLS: set config.certfile "
            "and config.keyfile",
        ),
        (
            {"umask": 0o077, "bind": "127.0.0.1:0"},
            "config.umask = 63 needs a Unix socket: a bind of the form 'unix:PATH'",
        ),
        (
            {"statsd_prefix": "web"},
            "config.statsd_prefix = 'web' needs config.statsd_host",
        ),
        ({"read_timeout": 0}, "config.read_timeout must be None or > 0, not 0"),
    ],
)
async def test_a_field_that_cannot_be_honoured_is_refused_before_anything_starts(
    tmp_path: Path, fields: dict[str, object], message: str
) -> None:
    log = Log()
    sock = tmp_path / "server.sock"
    config = _config(**{"bind": f"unix:{sock}", **fields})
    async with trio_graceful.open_bundle() as bundle:
        _, inbox = bundle.open_inbox()
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            await _start_serving(bundle, inbox, make_app(log), config)
    assert log.events == []  # the app's lifespan never started
    assert not sock.exists()  # nothing was bound


def _refused_values() -> list[Any]:
    values: dict[str, object] = {
        "workers": 2,
        "worker_class": "asyncio-not",
        "daemon": False,
        "max_requests": 1000,
        "max_requests_jitter": 10,
        "use_reloader": True,
        "pid_path": "/run/app.pid",
        "application_path": "app:app",
        "debug": True,
        "wsgi_max_body_size": 1,
        "graceful_timeout": 1.0,
        "quic_bind": ["127.0.0.1:4433"],
        "keyfile": "key.pem",
        "keyfile_password": "secret",
        "ciphers": "ECDHE+CHACHA20",
        "verify_mode": ssl.CERT_REQUIRED,
        "verify_flags": ssl.VERIFY_X509_STRICT,
        "alpn_protocols": ["http/1.1"],
        "user": 1000,
        "group": 1000,
        "dogstatsd_tags": "env:test",
    }
    rules = {name for name, rule in FIELDS.items() if rule is not HONOURED}
    assert set(values) == rules - {
        "certfile",
        "ca_certs",
        "insecure_bind",
        "umask",
        "statsd_prefix",
    }  # those have a case above
    return [pytest.param(name, value, id=name) for name, value in values.items()]


@pytest.mark.parametrize(("name", "value"), _refused_values())
def test_every_refused_field_names_itself_and_its_value(
    name: str, value: object
) -> None:
    from trio_graceful.asgi._config import server_config

    config = _config(**{name: value})
    shown = repr(getattr(config, name))
    rule = FIELDS[name]
    assert isinstance(rule, (Refused, OnlyWith))
    with pytest.raises(ValueError, match="^" + re.escape(f"config.{name} = {shown} ")):
        server_config(config, None)


def test_a_default_config_and_the_worker_class_trio_pass() -> None:
    from trio_graceful.asgi._config import server_config

    server_config(Config(), None)
    server_config(_config(worker_class="trio"), None)


async def _silent_client_closed_after(
    tmp_path: Path, config: Config, first: bytes
) -> float:
    async with serving(make_app(Log()), tmp_path, config=config) as served:
        client = await served.connect()
        start = trio.current_time()
        if first:
            await client.send_raw(first)
        assert await client.end() == "eof"
        return trio.current_time() - start


async def test_read_timeout_closes_a_silent_connection(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = _config(read_timeout=3, keep_alive_timeout=60)
    assert await _silent_client_closed_after(tmp_path, config, b"") == 3


async def test_read_timeout_closes_a_connection_silent_in_the_middle_of_a_head(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = _config(read_timeout=2, keep_alive_timeout=60)
    head = b"GET /work HTTP/1.1\r\nHost: x\r\n"  # no blank line: incomplete
    assert await _silent_client_closed_after(tmp_path, config, head) == 2


async def test_without_read_timeout_keep_alive_decides(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = _config(keep_alive_timeout=7)
    assert await _silent_client_closed_after(tmp_path, config, b"") == 7


async def _startup_hangs(scope: Scope, receive: Receive, send: Send) -> None:
    """An app whose lifespan startup never completes."""
    await receive()
    await trio.sleep_forever()


async def test_startup_timeout_bounds_the_lifespan_startup(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio_graceful.open_bundle() as bundle:
        _, inbox = bundle.open_inbox()
        config = _config(bind="127.0.0.1:0", startup_timeout=4)
        with pytest.raises(LifespanTimeoutError, match="awaiting startup"):
            await _start_serving(bundle, inbox, _startup_hangs, config)
        assert trio.current_time() == 4


async def test_stop_cuts_a_lifespan_startup_short(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio_graceful.open_bundle() as bundle:
        sender, inbox = bundle.open_inbox()

        async def stop_at(seconds: float) -> None:
            await trio.sleep(seconds)
            sender.stop()  # as a runner does to a service still starting

        bundle.start_soon(stop_at, 3)
        config = _config(bind="127.0.0.1:0", startup_timeout=60)
        with pytest.raises(RuntimeError, match=r"without calling task_status\.started"):
            await _start_serving(bundle, inbox, _startup_hangs, config)
        # At the STOP, not at the startup timeout nor at a hard deadline.
        assert trio.current_time() == 3


async def test_shutdown_timeout_bounds_the_lifespan_shutdown(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await trio.sleep_forever()  # never completes its shutdown

    with pytest.RaisesGroup(
        pytest.RaisesExc(LifespanTimeoutError, match="awaiting shutdown")
    ):
        async with serving(app, tmp_path, config=_config(shutdown_timeout=6)) as served:
            start = trio.current_time()
            try:
                await served.shutdown(100)
            finally:
                assert trio.current_time() - start == 6


async def test_response_headers_follow_the_config(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = _config(
        include_server_header=False,
        include_date_header=False,
        alt_svc_headers=['h3=":443"'],
        keep_alive_max_requests=1,
    )
    async with serving(make_app(Log()), tmp_path, config=config) as served:
        answer = await (await served.request("/work")).answer()
    assert b"server" not in answer.headers
    assert b"date" not in answer.headers
    assert answer.headers[b"alt-svc"] == b'h3=":443"'
    assert answer.closes  # the one request keep_alive_max_requests allows


async def _scope_app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await lifespan_only(receive, send)
        return
    body = scope["root_path"].encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


async def test_root_path_and_server_names_reach_the_protocols(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = _config(root_path="/api/", server_names=["known"])
    async with serving(_scope_app, tmp_path, config=config) as served:
        known = await served.connect()
        await known.send("/", host="known")
        answer = await known.answer()
        assert (answer.status, answer.body) == (200, b"/api")
        unknown = await served.connect()
        await unknown.send("/", host="other")
        assert (await unknown.answer()).status == 404


async def test_h11_max_incomplete_size_refuses_a_longer_head(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = _config(h11_max_incomplete_size=200)
    async with serving(make_app(Log()), tmp_path, config=config) as served:
        client = await served.connect()
        await client.send_raw(b"GET /work HTTP/1.1\r\nX: " + b"x" * 300 + b"\r\n")
        assert (await client.answer()).status == 431


async def test_the_access_log_and_logconfig_are_set_up_before_the_server_is_ready(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    access = logging.getLogger("tests.asgi.access")
    configured = logging.getLogger("tests.asgi.logconfig")
    config = _config(
        accesslog=access,
        access_log_format="%(m)s %(U)s %(s)s",
        logconfig_dict={
            "version": 1,
            "incremental": True,
            "loggers": {"tests.asgi.logconfig": {"level": "ERROR"}},
        },
    )
    configured.setLevel(logging.NOTSET)
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    access.addHandler(keep := Keep())
    access.setLevel(logging.INFO)
    try:
        async with serving(make_app(Log()), tmp_path, config=config) as served:
            assert configured.level == logging.ERROR  # applied at the start
            await (await served.request("/work")).answer()
            await trio.testing.wait_all_tasks_blocked()
    finally:
        access.removeHandler(keep)
        access.setLevel(logging.NOTSET)
        configured.setLevel(logging.NOTSET)
    assert lines == ["GET /work 200"]


async def test_statsd_host_gets_hypercorns_metrics(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    receiver = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    with receiver:
        await receiver.bind(("127.0.0.1", 0))
        host, port = receiver.getsockname()
        config = _config(statsd_host=f"{host}:{port}", statsd_prefix="web")
        async with serving(make_app(Log()), tmp_path, config=config) as served:
            await (await served.request("/work")).answer()
            metrics: set[bytes] = set()
            with trio.fail_after(1):
                while b"web.hypercorn.request.status.200:1|c|@1.0" not in metrics:
                    metrics.add(await receiver.recv(1024))
        assert b"web.hypercorn.requests:1|c|@1.0" in metrics


async def test_umask_sets_the_mode_of_the_unix_socket(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(Log()), tmp_path, config=_config(umask=0o077)):
        mode = stat.S_IMODE((tmp_path / "server.sock").stat().st_mode)
    assert mode & 0o077 == 0


def _pending_connections(path: Path) -> int:
    """Connect to ``path`` until the listen queue is full; return how many got in.

    Nothing here is a checkpoint: the server accepts none of them meanwhile.
    """
    clients: list[socket.socket] = []
    try:
        while len(clients) < 200:
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            clients.append(client)
            client.setblocking(False)
            try:
                client.connect(str(path))
            except BlockingIOError:
                return len(clients) - 1
        return len(clients)
    finally:
        for client in clients:
            client.close()


@pytest.mark.parametrize("backlog", [2, 100])
async def test_backlog_is_the_listen_queue_of_each_socket(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, backlog: int
) -> None:
    config = _config(backlog=backlog)
    async with serving(make_app(Log()), tmp_path, config=config):
        # Linux lets one more than the backlog wait on a Unix socket.
        assert _pending_connections(tmp_path / "server.sock") == backlog + 1


@pytest.fixture
def tls_files() -> Iterator[tuple[str, str]]:
    certificate = trustme.CA().issue_cert("127.0.0.1")
    with (
        certificate.private_key_pem.tempfile() as key,
        certificate.cert_chain_pems[0].tempfile() as cert,
    ):
        yield cert, key


async def test_ssl_handshake_timeout_closes_a_client_that_does_not_shake_hands(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    tls_files: tuple[str, str],
) -> None:
    cert, key = tls_files
    config = _config(certfile=cert, keyfile=key, ssl_handshake_timeout=4)
    assert await _silent_client_closed_after(tmp_path, config, b"") == 4


async def test_insecure_bind_listens_beside_tls(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    tls_files: tuple[str, str],
) -> None:
    cert, key = tls_files
    plain = tmp_path / "plain.sock"
    config = _config(certfile=cert, keyfile=key, insecure_bind=f"unix:{plain}")
    async with serving(make_app(Log()), tmp_path, config=config) as served:
        assert served.server.urls == (
            f"https://unix:{tmp_path / 'server.sock'}",
            f"http://unix:{plain}",
        )
        client = RawClient(await trio.open_unix_socket(str(plain)))
        served.clients.append(client)
        await client.send("/work")
        assert (await client.answer()).status == 200


async def _websocket(served: Served) -> tuple[RawClient, wsproto.WSConnection]:
    """Open a WebSocket to the server; return its stream and wsproto's state."""
    client = await served.connect()
    ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    await client.send_raw(ws.send(wsproto.events.Request(host="x", target="/ws")))
    ws.receive_data(bytes(await client.stream.receive_some()))
    assert isinstance(next(ws.events()), wsproto.events.AcceptConnection)
    return client, ws


async def _next_event(client: RawClient, ws: wsproto.WSConnection) -> object:
    while True:
        for event in ws.events():
            return event
        ws.receive_data(bytes(await client.stream.receive_some()) or None)


async def test_websocket_ping_interval_pings_the_client(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = _config(websocket_ping_interval=5)
    async with serving(make_app(Log()), tmp_path, config=config) as served:
        client, ws = await _websocket(served)
        start = trio.current_time()
        pings: list[float] = []
        while len(pings) < 3:
            event = await _next_event(client, ws)
            assert isinstance(event, wsproto.events.Ping)
            pings.append(trio.current_time() - start)
    assert pings == [0, 5, 10]


async def test_websocket_max_message_size_closes_with_1009(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = _config(websocket_max_message_size=100)
    async with serving(make_app(Log()), tmp_path, config=config) as served:
        client, ws = await _websocket(served)
        await client.send_raw(ws.send(wsproto.events.TextMessage(data="x" * 50)))
        echoed = await _next_event(client, ws)
        assert isinstance(echoed, wsproto.events.TextMessage)
        await client.send_raw(ws.send(wsproto.events.TextMessage(data="x" * 101)))
        closed = await _next_event(client, ws)
        assert isinstance(closed, wsproto.events.CloseConnection)
        assert closed.code == 1009


async def test_errorlog_gets_the_errors_of_the_app(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    errors = logging.getLogger("tests.asgi.errorlog")
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    errors.addHandler(keep := Keep())
    try:
        config = _config(errorlog=errors)
        async with serving(make_app(Log()), tmp_path, config=config) as served:
            assert (await (await served.request("/fail")).answer()).status == 500
    finally:
        errors.removeHandler(keep)
    assert lines == ["Error in ASGI Framework"]


async def _headers_app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await lifespan_only(receive, send)
        return
    names = b",".join(name for name, _ in scope["headers"])
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": names})


@pytest.mark.parametrize(("raw", "names"), [(False, b"host"), (True, b"Host")])
async def test_h11_pass_raw_headers_keeps_the_case_of_header_names(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, raw: bool, names: bytes
) -> None:
    config = _config(h11_pass_raw_headers=raw)
    async with serving(_headers_app, tmp_path, config=config) as served:
        assert (await (await served.request("/")).answer()).body == names


async def test_the_statsd_socket_is_closed_when_the_start_fails(
    tmp_path: Path,
) -> None:
    config = _config(statsd_host="127.0.0.1:9", bind=f"unix:{tmp_path}")
    async with trio_graceful.open_bundle() as bundle:
        _, inbox = bundle.open_inbox()
        with pytest.raises(OSError, match=f"cannot listen on unix:{tmp_path}"):
            await _start_serving(bundle, inbox, make_app(Log()), config)
    gc.collect()  # an unclosed socket would warn here, and warnings are errors


@pytest.mark.parametrize("value", ["5", True])
def test_read_timeout_must_be_a_number_of_seconds(value: object) -> None:
    from trio_graceful.asgi._config import server_config

    with pytest.raises(
        TypeError,
        match=re.escape(
            f"config.read_timeout must be None or a number of seconds, not {value!r}"
        )
        + "$",
    ):
        server_config(_config(read_timeout=value), None)
