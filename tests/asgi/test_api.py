"""serve_asgi's arguments, what handlers call, the admission gate and threads."""

from __future__ import annotations

import functools
import re
import threading
from pathlib import Path

import pytest
import trio
import trio.testing
from hypercorn.config import Config
from hypercorn.utils import LifespanFailureError

import trio_graceful
import trio_graceful.asgi
from tests.support.asgi_app import Log, make_app
from tests.support.asgi_server import Receive, Scope, Send, lifespan_only, serving


async def _fails_to_serve(
    error: type[Exception], message: str, **options: object
) -> None:
    async with trio_graceful.open_bundle() as bundle:
        _, inbox = bundle.open_inbox()
        with pytest.raises(error, match=message):
            await bundle.start(
                functools.partial(trio_graceful.asgi.serve_asgi, inbox, **options)
            )


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"app": 3}, TypeError, "app must be an ASGI app, not 3"),
        ({"config": {}}, TypeError, "config must be a hypercorn.config.Config, not {}"),
        ({"bind": []}, ValueError, "bind must be an address like '127.0.0.1:8000' "),
        ({"bind": [""]}, ValueError, "bind must be an address like '127.0.0.1:8000' "),
        ({"reserve": -1}, ValueError, "reserve must be >= 0, not -1"),
        (
            {"reserve": "1"},
            TypeError,
            "reserve must be a number of seconds, not str '1'",
        ),
        ({"thread_tokens": 0}, ValueError, "thread_tokens must be >= 1, not 0"),
        (
            {"thread_tokens": 1.5},
            TypeError,
            "thread_tokens must be an int, not 1.5",
        ),
    ],
)
async def test_bad_arguments_are_refused_before_anything_starts(
    options: dict[str, object], error: type[Exception], message: str
) -> None:
    options.setdefault("app", make_app(Log()))
    await _fails_to_serve(error, "^" + re.escape(message), **options)


async def test_an_address_in_use_fails_the_start() -> None:
    async with serving(make_app(Log())) as served:
        host, port = served.server.addresses[0]
        await _fails_to_serve(
            OSError,
            rf"^\[Errno 98\] cannot listen on {host}:{port}: Address already in use$",
            app=make_app(Log()),
            bind=f"{host}:{port}",
        )


async def test_an_address_of_another_host_fails_the_start() -> None:
    # TEST-NET-1 (RFC 5737): no interface of this machine has it.
    await _fails_to_serve(
        OSError,
        r"^\[Errno 99\] cannot listen on 192\.0\.2\.1:0: Cannot assign requested",
        app=make_app(Log()),
        bind="192.0.2.1:0",
    )


async def test_a_failed_lifespan_startup_fails_the_start() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no database"})

    await _fails_to_serve(LifespanFailureError, "no database", app=app)


async def test_a_failed_lifespan_shutdown_is_raised_after_the_drain(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "lifespan.startup"
        await send({"type": "lifespan.startup.complete"})
        assert (await receive())["type"] == "lifespan.shutdown"
        await send({"type": "lifespan.shutdown.failed", "message": "flush failed"})

    with pytest.RaisesGroup(
        pytest.RaisesExc(LifespanFailureError, match="flush failed")
    ):
        async with serving(app, tmp_path) as served:
            await served.shutdown(5)


async def test_the_config_is_used_and_bind_overrides_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = Config()
    config.keep_alive_timeout = 2
    config.bind = ["127.0.0.1:1"]  # replaced by bind=
    async with serving(make_app(Log()), tmp_path, config=config) as served:
        client = await served.connect()
        await client.send("/work")
        await client.answer()
        start = trio.current_time()
        assert await client.end() == "eof"
        assert trio.current_time() - start == 2
    assert config.bind == ["127.0.0.1:1"]  # the caller's config is left alone


@pytest.mark.parametrize(
    "call",
    [
        trio_graceful.asgi.stop_received,
        trio_graceful.asgi.stop_deadline,
        trio_graceful.asgi.current_stop_flag,
    ],
)
def test_the_stop_functions_say_where_they_work(call: object) -> None:
    assert callable(call)
    name = getattr(call, "__name__", "")
    with pytest.raises(
        RuntimeError,
        match=rf"^trio_graceful\.asgi\.{name}\(\) was called outside a request "
        r"served by trio_graceful\.asgi\.serve_asgi\(\)$",
    ):
        call()


async def test_the_async_stop_functions_say_where_they_work_too() -> None:
    with pytest.raises(RuntimeError, match=r"^trio_graceful\.asgi\.wait_stop\(\)"):
        await trio_graceful.asgi.wait_stop()
    with pytest.raises(RuntimeError, match=r"^trio_graceful\.asgi\.until_stop\(\)"):
        await trio_graceful.asgi.until_stop(trio.sleep, 1)


async def test_statistics_and_running_requests_name_method_and_path(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(Log()), tmp_path) as served:
        one, two = await served.connect(), await served.connect()
        await one.send("/work?s=5")
        await two.send("/stream?n=3&s=5")
        await trio.testing.wait_all_tasks_blocked()
        assert served.server.running_requests() == ["GET /stream", "GET /work"]
        stats = served.server.statistics()
        assert (stats.connections_open, stats.connections_total) == (2, 2)
        assert (stats.requests_running, stats.requests_total) == (2, 2)
        assert (stats.requests_cut_off, stats.draining) == (0, False)
        assert repr(served.server).startswith("<trio_graceful.asgi.AsgiServer http://")


async def test_request_tasks_are_traced_by_method_and_path(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio_graceful.record_trace() as trace:
        async with serving(make_app(Log()), tmp_path) as served:
            client = await served.connect()
            await client.send("/work?s=1")
            await client.answer()
            await served.shutdown(5)
    ended = [
        event.task
        for event in trace.events
        if event.kind is trio_graceful.TraceKind.CHILD_ENDED and event.task
    ]
    assert any(path.endswith("/requests/GET /work") for path in ended), ended


def _gated(gate: trio_graceful.AdmissionGate, release: trio.Event) -> object:
    async def slow(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan_only(receive, send)
            return
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return trio_graceful.asgi.AdmissionMiddleware(slow, gate=gate, retry_after=7)


async def test_the_admission_middleware_answers_503_at_once_when_full(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    gate = trio_graceful.AdmissionGate(2, name="reports")
    release = trio.Event()
    async with serving(_gated(gate, release), tmp_path) as served:
        admitted = [await served.connect() for _ in range(2)]
        for client in admitted:
            await client.send("/report")
        await trio.testing.wait_all_tasks_blocked()
        refused = await served.connect()
        await refused.send("/report")
        answer = await refused.answer()
        assert trio.current_time() == 0
        assert (answer.status, answer.closes) == (503, False)  # still usable
        assert answer.headers[b"retry-after"] == b"7"
        release.set()
        assert [(await c.answer()).status for c in admitted] == [200, 200]
    stats = gate.statistics()
    assert (stats.admitted_total, stats.rejected_total, stats.in_use) == (2, 1, 0)


def test_the_admission_middleware_checks_its_arguments() -> None:
    gate = trio_graceful.AdmissionGate(1)
    app = make_app(Log())
    with pytest.raises(TypeError, match=r"^app must be an ASGI app, not None$"):
        trio_graceful.asgi.AdmissionMiddleware(None, gate=gate)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^gate must be an AdmissionGate, not 1$"):
        trio_graceful.asgi.AdmissionMiddleware(app, gate=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^retry_after must be >= 1, not 0$"):
        trio_graceful.asgi.AdmissionMiddleware(app, gate=gate, retry_after=0)


def test_sync_to_async_refuses_an_async_function() -> None:
    with pytest.raises(TypeError, match=r"^sync_fn must be a synchronous function"):
        trio_graceful.asgi.sync_to_async(trio.sleep)


def _threaded_app(
    started: threading.Event, release: threading.Event | None = None
) -> object:
    def polite() -> bytes:
        started.set()
        flag = trio_graceful.asgi.current_stop_flag()
        return b"stopped" if flag.wait(60) else b"timed out"

    def stuck() -> bytes:
        started.set()
        assert release is not None
        release.wait(60)  # ignores STOP; outlives the cut-off
        return b"late"

    endpoints = {"/polite": polite, "/stuck": stuck}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan_only(receive, send)
            return
        run = trio_graceful.asgi.sync_to_async(endpoints[scope["path"]])
        body = await run()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    return app


@pytest.mark.realtime
async def test_a_thread_hears_stop_through_the_stop_flag() -> None:
    started = threading.Event()
    async with serving(_threaded_app(started), thread_tokens=3) as served:
        client = await served.connect()
        await client.send("/polite")
        await trio.to_thread.run_sync(started.wait)
        budget = served.server.thread_budget.statistics()
        assert (budget.total_tokens, budget.threads_running) == (3, 1)
        assert trio.to_thread.current_default_thread_limiter().total_tokens == 3
        async with served.stopping(30):
            answer = await client.answer()
            assert (answer.status, answer.body, answer.closes) == (
                200,
                b"stopped",
                True,
            )
    assert served.report is not None
    assert served.report.hard_cancelled_at is None


@pytest.mark.realtime
async def test_a_thread_still_running_at_the_cut_off_is_abandoned() -> None:
    started, release = threading.Event(), threading.Event()
    # The cut-off comes 1 s after STOP; the hard deadline, which would close
    # the connection unanswered, 2 s later, ample on a loaded machine.
    async with serving(_threaded_app(started, release), reserve=2.0) as served:
        client = await served.connect()
        await client.send("/stuck")
        await trio.to_thread.run_sync(started.wait)
        async with served.stopping(3.0):
            answer = await client.answer()
            assert (answer.status, answer.closes) == (503, True)
        stats = served.server.statistics()
        assert (stats.threads_abandoned, stats.requests_cut_off) == (1, 1)
        budget = served.server.thread_budget.statistics()
        assert budget.threads_abandoned_total == 1
    release.set()  # the abandoned thread may end now
    assert served.report is not None
    assert served.report.abandoned == ("thread '_threaded_app.<locals>.stuck'",)


@pytest.mark.realtime
async def test_a_request_stuck_in_a_thread_that_cannot_be_abandoned_is_answered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What a Starlette "def" endpoint does: a thread without abandon_on_cancel.
    started, release = threading.Event(), threading.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan_only(receive, send)
            return
        started.set()
        await trio.to_thread.run_sync(release.wait)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"late"})

    async with serving(app, reserve=2.0) as served:
        client = await served.connect()
        await client.send("/blocking")
        await trio.to_thread.run_sync(started.wait)
        async with served.stopping(3.0):
            answer = await client.answer()
            assert (answer.status, answer.closes) == (503, True)
            assert not release.is_set()  # answered while its thread still runs
            release.set()
    assert "GET /blocking did not end when it was cut off" in caplog.text
    assert served.server.statistics().requests_cut_off == 1
