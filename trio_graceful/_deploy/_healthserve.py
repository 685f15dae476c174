"""Serving the health endpoint: its listeners, and the service that answers on them.

The endpoint itself, what it answers and how it treats its connections, is
``_health``; this module opens its listeners and runs it as a service.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import trio

from .._core._checks import check_name, check_port, check_seconds
from .._core._inboxreceiver import InboxReceiver
from ._health import HealthAnswer, HealthEndpoint


async def open_health_listeners(
    host: str | None, port: int
) -> list[trio.SocketListener]:
    """Open the TCP listeners of a health endpoint, as `trio.open_tcp_listeners` does.

    This is a checkpoint.

    Args:
        host (str or None): The address to listen on; None listens on every
            interface (IPv4 and IPv6 where available).
        port (int): The port; 0 picks a free one (find it with
            ``listener.socket.getsockname()``).

    Returns:
        list[trio.SocketListener]: The listeners, to pass to `serve_health`.

    Raises:
        TypeError: if ``port`` is not an int (a `bool` is refused too), or
            ``host`` is neither a string nor None.
        ValueError: if ``port`` is not in 0..65535, or ``host`` cannot be a
            host name (IDNA refuses it).
        OSError: if the port cannot be used (taken, not permitted); the
            message names the host and the port, and ``errno`` is the
            system's.
    """
    check_port("port", port)
    check_name("host", host)
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        where = f"port {port} of {host or 'every interface'}"
        why = exc.strerror or exc
        message = f"the health endpoint cannot listen on {where}: {why}"
        raise OSError(exc.errno, message) from exc
    except UnicodeError as exc:  # the IDNA encoding of a name that cannot be one
        raise ValueError(f"host must be a host name or address, not {host!r}") from exc


async def serve_health(
    inbox: InboxReceiver[object],
    listeners: Sequence[trio.abc.Listener[trio.abc.Stream]],
    answer: Callable[[], HealthAnswer],
    *,
    idle_timeout: float = 10.0,
    head_timeout: float = 2.0,
    max_connections: int = 32,
    max_header_bytes: int = 8192,
    task_status: trio.TaskStatus[HealthEndpoint] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer health probes on ``listeners`` until `STOP` comes in ``inbox``.

    A service, as `Runner.start_service` runs it. ``GET`` or ``HEAD`` of
    ``/livez`` answers 200 while `HealthAnswer.live` (else 503), of
    ``/readyz`` 200 while `HealthAnswer.ready` (else 503 with the reason),
    of ``/statusz`` 200 and `HealthAnswer.status` as JSON. A query string is
    ignored. Other paths get 404, other methods 405, a request that is not
    HTTP/1.1 400 (431 for a head too large), an ``answer`` that raises 500.
    Every answer has ``Content-Length`` and ``Cache-Control: no-store``;
    connections are kept alive unless the client says ``Connection: close``.

    ``answer`` is called at each request, in the Trio thread, and must not
    block. The listeners belong to `serve_health` from the call on: they are
    closed when it returns or raises. At STOP they close at once (new probes
    are refused), connections waiting for a request or for the rest of one
    are closed, and answers being sent are finished; those sent after STOP
    say ``Connection: close``. It returns then, within ``idle_timeout`` and
    a second at worst (a client that stops reading in the middle of an
    answer). This is a checkpoint.

    Args:
        inbox: The service's inbox; STOP there ends the service. Send
            nothing else: STOP would wait behind it, and nothing reads it.
        listeners: Where probes come in, from `open_health_listeners`.
        answer: Returns the `HealthAnswer` of this instant.
        idle_timeout (float): Seconds a connection may take to complete a
            request, counted from its opening or its previous answer.
        head_timeout (float): Seconds a request's head may take to arrive,
            counted from its first byte (a slowloris is closed then).
        max_connections (int): Connections open at once. At the limit, a
            new connection closes one waiting for a request (a slow head
            first: see ``_health``'s docstring); if every one is being
            answered, the new one is closed instead. Both are counted in
            `HealthStatistics` and logged, one WARNING with the counts every
            10 s at most.
        max_header_bytes (int): The most bytes held of a request head not
            complete yet (h11's ``max_incomplete_event_size``); beyond, 431.
        task_status: Started with the `HealthEndpoint` once it is listening.

    Raises:
        TypeError: if ``answer`` is not callable, or an option has the wrong type.
        ValueError: if a timeout is negative or NaN, or a count is below 1.
    """
    listeners = list(listeners)
    try:
        if not callable(answer):
            raise TypeError(f"answer must be a callable, not {answer!r}")
        endpoint = HealthEndpoint._create(  # pyright: ignore[reportPrivateUsage]
            inbox,
            answer,
            check_seconds("idle_timeout", idle_timeout),
            check_seconds("head_timeout", head_timeout),
            max_connections,
            max_header_bytes,
        )
        async with trio.open_nursery() as connections:
            accept = functools.partial(
                trio.serve_listeners,
                endpoint._serve,  # pyright: ignore[reportPrivateUsage]
                listeners,
                handler_nursery=connections,
            )
            async with trio.open_nursery() as reporting:
                reporting.start_soon(
                    endpoint._report_periodically  # pyright: ignore[reportPrivateUsage]
                )
                task_status.started(endpoint)
                # Cancelled at STOP, serve_listeners closes the listeners; the
                # connections run in their own nursery and finish their answers.
                await inbox.until_stop(accept)
                reporting.cancel_scope.cancel(reason="the health endpoint is stopping")
            endpoint._stop_reading()  # pyright: ignore[reportPrivateUsage]
        endpoint._report()  # pyright: ignore[reportPrivateUsage]
    finally:
        for listener in listeners:
            await trio.aclose_forcefully(listener)
