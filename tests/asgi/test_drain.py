"""The drain of serve_asgi over HTTP/1.1, in exact virtual time.

The server listens on a Unix socket (see tests/support/asgi_server.py) and is
stopped as a runner stops a service: STOP, then the grace.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import trio
import trio.testing
from hypercorn.config import Config

from tests.support.asgi_app import Log, make_app
from tests.support.asgi_server import RawClient, serving


@pytest.fixture
def log() -> Log:
    return Log()


async def test_ready_once_the_lifespan_started_and_it_listens(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(log), tmp_path) as served:
        assert [name for name, _ in log.events] == ["lifespan.startup"]
        assert served.server.urls == (f"http://unix:{tmp_path / 'server.sock'}",)
        assert served.server.addresses == ()
        client = await served.connect()
        await client.send("/work")
        answer = await client.answer()
        assert (answer.status, answer.body, answer.chunked) == (200, b"done", False)
        assert answer.headers[b"content-length"] == b"4"
        assert not answer.closes


async def test_an_idle_keep_alive_connection_gets_a_fin_at_stop(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(log), tmp_path) as served:
        client = await served.connect()
        await client.send("/work")
        assert not (await client.answer()).closes
        await trio.sleep(3)
        stop = trio.current_time()
        async with served.stopping(10):
            assert await client.end() == "eof"
            assert trio.current_time() == stop
            await client.aclose()
        assert served.report is not None
        assert trio.current_time() == stop  # nothing else to wait for
    assert [name for name, _ in log.events] == ["lifespan.startup", "lifespan.shutdown"]


async def test_a_request_in_flight_is_answered_with_connection_close(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(log), tmp_path) as served:
        client = await served.connect()
        await client.send("/work?s=4")
        await trio.sleep(1)
        async with served.stopping(10):
            answer = await client.answer()
            assert (answer.status, answer.body, answer.closes) == (200, b"done", True)
            assert trio.current_time() == 4
            assert await client.end() == "eof"
            assert client.extra == b""
            await client.aclose()


async def test_pipelined_requests_are_all_answered_and_only_the_last_says_close(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(log), tmp_path) as served:
        client = await served.connect()
        await client.send("/work?s=2", "/work?s=1", "/work?s=1")
        await trio.sleep(1)
        async with served.stopping(10):
            answers = [await client.answer() for _ in range(3)]
            assert [a.status for a in answers] == [200, 200, 200]
            assert [a.closes for a in answers] == [False, False, True]
            assert trio.current_time() == 4  # one after the other
            assert await client.end() == "eof"
            await client.aclose()


async def test_the_last_response_before_keep_alive_max_requests_says_close_once(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    config = Config()
    config.keep_alive_max_requests = 2
    async with serving(make_app(log), tmp_path, config=config) as served:
        client = await served.connect()
        await client.send("/work")
        assert not (await client.answer()).closes
        await client.send("/work?s=4")
        await trio.sleep(1)
        async with served.stopping(10):
            answer = await client.answer()
            assert (answer.status, answer.closes) == (200, True)
            # Hypercorn's header for its request cap, and not the drain's too.
            assert client.raw.lower().count(b"\r\nconnection: close\r\n") == 1
            assert await client.end() == "eof"
            await client.aclose()


async def test_a_request_half_received_at_stop_is_not_started(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    # Only a complete request head counts as received: the answer before it
    # says close, and the half is dropped as the client was told.
    async with serving(make_app(log), tmp_path) as served:
        client = await served.connect()
        await client.send("/work?s=2")
        await client.send_raw(b"GET /work HTTP/1.1\r\nHost: te")
        async with served.stopping(10):
            answer = await client.answer()
            assert (answer.status, answer.closes) == (200, True)
            assert await client.end() == "eof"
            await client.aclose()
        assert served.server.statistics().requests_total == 1


async def test_the_listeners_close_at_stop(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(log), tmp_path) as served:
        busy = await served.request("/work?s=5")
        async with served.stopping(10):
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(OSError, match="Connection refused"):
                await served.connect()
            assert (await busy.answer()).closes
            await busy.aclose()


async def test_the_keep_alive_timeout_closes_an_idle_connection(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(log), tmp_path) as served:
        client = await served.connect()
        await client.send("/work?s=1")
        await client.answer()
        answered = trio.current_time()
        assert await client.end() == "eof"
        # Hypercorn's default keep_alive_timeout.
        assert trio.current_time() - answered == 5
        await client.aclose()


async def test_a_request_cut_before_its_response_gets_a_503(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(log), tmp_path) as served:
        client = await served.request("/work?s=60")
        async with served.stopping(10):
            answer = await client.answer()
            # The cut-off: the reserve of 1 s before the deadline.
            assert trio.current_time() == 9
            assert (answer.status, answer.closes, answer.body) == (503, True, b"")
            assert answer.headers[b"retry-after"] == b"1"
            assert await client.end() == "eof"
            await client.aclose()
        stats = served.server.statistics()
        assert (stats.requests_cut_off, stats.requests_running) == (1, 0)
    assert served.report is not None
    [server] = served.report.children
    assert server.notes == ("cut off: GET /work: refused with 503",)


async def test_a_stream_cut_off_ends_with_the_terminating_chunk(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(log), tmp_path) as served:
        client = await served.request("/stream?n=100&s=1")
        async with served.stopping(5):
            answer = await client.answer()  # a whole chunked message
            # A grace of 5: the last tenth is kept, so the cut-off is at 4.5.
            assert trio.current_time() == 4.5
            assert answer.chunked
            assert answer.body == b"".join(b"data: %02d\n\n" % i for i in range(5))
            assert client.raw.endswith(b"\r\n0\r\n\r\n")
            assert await client.end() == "eof"
            await client.aclose()


async def test_a_sized_response_cut_in_its_body_is_closed_not_completed(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(log), tmp_path) as served:
        client = await served.request("/sized?n=100&s=2")
        async with served.stopping(10):
            assert await client.end() == "eof"
            assert trio.current_time() == 9
            head, _, body = bytes(client.raw).partition(b"\r\n\r\n")
            assert b"content-length: 1000" in head
            assert len(body) == 10 * 5  # what was sent: the client can tell
            await client.aclose()


async def test_without_a_deadline_nothing_is_cut_off(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(log), tmp_path) as served:
        client = await served.request("/stream?n=30&s=1")
        async with served.stopping(math.inf):
            answer = await client.answer()
            assert trio.current_time() == 30
            assert len(answer.body) == 300
            await client.aclose()


async def test_the_lifespan_shuts_down_after_the_last_connection(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(log), tmp_path) as served:
        client = await served.request("/work?s=3")
        async with served.stopping(10):
            await client.answer()
            await trio.sleep(2)  # the client closes late: the server waits
            await client.aclose()
    # The server's FIN went out at 3; it waited for the client's until 4
    # (its linger of 1 s), then the lifespan shut down.
    assert log.when("lifespan.shutdown") == 4


async def test_handlers_hear_stop_in_band(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(make_app(log), tmp_path) as served:
        waiting, streaming = await served.connect(), await served.connect()
        await waiting.send("/wait-stop")
        await streaming.send("/until-stop")
        await trio.sleep(2.5)
        async with served.stopping(10):
            answer = await waiting.answer()
            assert (answer.body, answer.closes) == (b"9.0", True)
            streamed = await streaming.answer()
            assert streamed.body == b"tick\ntick\nbye\n"
            assert not streamed.closes  # its head went out before STOP
            assert await streaming.end() == "eof"
            for client in (waiting, streaming):
                await client.aclose()
    assert log.when("request heard STOP") == log.when("stream heard STOP") == 2.5


async def test_an_app_that_fails_gets_a_500_and_the_server_goes_on(
    tmp_path: Path,
    log: Log,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serving(make_app(log), tmp_path) as served:
        client = await served.connect()
        await client.send("/fail", "/work")
        failed = await client.answer()
        assert (failed.status, failed.closes) == (500, True)
        assert await client.end() == "eof"
        assert "Error in ASGI Framework" in caplog.text
        again = await served.connect()
        await again.send("/work")
        assert (await again.answer()).status == 200


async def test_a_hard_cancel_ends_the_server_at_once(
    tmp_path: Path, log: Log, autojump_clock: trio.testing.MockClock
) -> None:
    # What a second signal does: nothing of the drain is waited for.
    with trio.CancelScope() as scope:
        async with serving(make_app(log), tmp_path) as served:
            assert served.path is not None
            client = RawClient(await trio.open_unix_socket(str(served.path)))
            await client.send("/work?s=60")
            await trio.testing.wait_all_tasks_blocked()
            async with served.stopping(10):
                await trio.sleep(2)
                scope.cancel()
    assert trio.current_time() == 2
    assert await client.end() in ("eof", "reset")
    assert client.raw == b""  # no answer: it was hard-cancelled
    await client.aclose()
