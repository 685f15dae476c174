"""Hypercorn's ``Config`` as `serve_asgi` reads it: every field honoured or refused.

Hypercorn's ``Config`` also configures its command line: worker processes,
a reloader, a PID file, QUIC. `serve_asgi` serves in its caller's Trio run,
so those settings cannot have their effect there, and a server that quietly
ignored them would not be the one its operator asked for. `FIELDS` is the
one table of what each field of Hypercorn 0.18's ``Config`` does here:

* `HONOURED`: it has its effect, through Hypercorn's protocols, lifespan,
  logger and sockets, or through this package's connection and listeners.
* `Refused`: it has no meaning here; left at its default (the value of a
  fresh ``Config()``) it passes, set to anything else it is refused, with
  what to use instead.
* `OnlyWith`: it is honoured when another setting it depends on is there
  (TLS options need ``certfile`` and ``keyfile``, say), and refused without
  it, since Hypercorn would ignore it.

`server_config` applies that table: it raises `ValueError` naming the first
field refused, its value and what to use instead, before anything is bound
or started. ``docs/asgi.rst`` has the same table for readers; a test checks
that both name every field of ``Config``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Final, cast

import attrs
from hypercorn.config import Config
from hypercorn.trio.statsd import StatsdLogger

_MISSING: Final = object()


@attrs.frozen
class _Honoured:
    """A field that has its effect."""


HONOURED: Final = _Honoured()


@attrs.frozen
class Refused:
    """A field that has no effect here: refused unless left at its default."""

    instead: str
    """What to use instead, for the error message."""


@attrs.frozen
class OnlyWith:
    """A field honoured only if ``applies(config)``; refused otherwise."""

    applies: Callable[[Config], bool]
    needs: str
    """What it needs, for the error message: ``"TLS: set certfile and keyfile"``."""


Rule = _Honoured | Refused | OnlyWith


def _tls(config: Config) -> bool:
    return config.certfile is not None and config.keyfile is not None


def _unix_bind(config: Config) -> bool:
    return any(bind.startswith("unix:") for bind in config.bind)


def _unix_bind_and_owner(config: Config) -> bool:
    return _unix_bind(config) and None not in (config.user, config.group)


def _statsd(config: Config) -> bool:
    return config.statsd_host is not None


_NEEDS_TLS: Final = OnlyWith(_tls, "TLS: set config.certfile and config.keyfile")
_RUN_SUPERVISED: Final = (
    "serve_asgi serves in its caller's Trio run, in one process: start, restart "
    "and count processes with the supervisor (systemd, Kubernetes...)"
)

FIELDS: Final[dict[str, Rule]] = {
    # Where to listen.
    "bind": HONOURED,
    "insecure_bind": _NEEDS_TLS,
    "quic_bind": Refused("HTTP/3 over QUIC is not served; listen with bind"),
    "backlog": HONOURED,
    "umask": OnlyWith(_unix_bind, "a Unix socket: a bind of the form 'unix:PATH'"),
    "user": OnlyWith(
        _unix_bind_and_owner,
        "a Unix socket ('unix:PATH' in bind) and config.group: "
        "the socket's file is given to both",
    ),
    "group": OnlyWith(
        _unix_bind_and_owner,
        "a Unix socket ('unix:PATH' in bind) and config.user: "
        "the socket's file is given to both",
    ),
    # TLS.
    "certfile": OnlyWith(_tls, "config.keyfile too"),
    "keyfile": OnlyWith(_tls, "config.certfile too"),
    "keyfile_password": _NEEDS_TLS,
    "ca_certs": _NEEDS_TLS,
    "ciphers": _NEEDS_TLS,
    "verify_mode": _NEEDS_TLS,
    "verify_flags": _NEEDS_TLS,
    "alpn_protocols": _NEEDS_TLS,
    "ssl_handshake_timeout": HONOURED,
    # Connections and protocols.
    "keep_alive_timeout": HONOURED,
    "keep_alive_max_requests": HONOURED,
    "read_timeout": HONOURED,
    "h11_max_incomplete_size": HONOURED,
    "h11_pass_raw_headers": HONOURED,
    "h2_max_concurrent_streams": HONOURED,
    "h2_max_header_list_size": HONOURED,
    "h2_max_inbound_frame_size": HONOURED,
    "websocket_max_message_size": HONOURED,
    "websocket_ping_interval": HONOURED,
    "max_app_queue_size": HONOURED,
    "root_path": HONOURED,
    "server_names": HONOURED,
    "include_date_header": HONOURED,
    "include_server_header": HONOURED,
    "alt_svc_headers": HONOURED,
    # The app's lifespan and the shutdown.
    "startup_timeout": HONOURED,
    "shutdown_timeout": HONOURED,
    "graceful_timeout": Refused(
        "the grace of the shutdown decides (trio_graceful.run(grace=...), "
        "or the grace of the bundle's shutdown)"
    ),
    # Logging and metrics.
    "accesslog": HONOURED,
    "access_log_format": HONOURED,
    "errorlog": HONOURED,
    "loglevel": HONOURED,
    "logconfig": HONOURED,
    "logconfig_dict": HONOURED,
    "logger_class": HONOURED,
    "statsd_host": HONOURED,
    "statsd_prefix": OnlyWith(_statsd, "config.statsd_host"),
    "dogstatsd_tags": OnlyWith(_statsd, "config.statsd_host"),
    # Hypercorn's command line: processes, reloads, the app to import.
    "workers": Refused(_RUN_SUPERVISED),
    "worker_class": Refused("serve_asgi runs on Trio (only 'trio' is accepted)"),
    "daemon": Refused(
        "it is for the worker processes of Hypercorn's command line, "
        "and serve_asgi starts none"
    ),
    "max_requests": Refused(_RUN_SUPERVISED),
    "max_requests_jitter": Refused(_RUN_SUPERVISED),
    "use_reloader": Refused(
        "restart the program when its files change with a watcher "
        "(watchfiles, say) or the supervisor"
    ),
    "pid_path": Refused("the supervisor knows the PID; or write it from main"),
    "application_path": Refused("pass the app itself to serve_asgi"),
    "debug": Refused("it sets asyncio's debug mode, and serve_asgi runs on Trio"),
    "wsgi_max_body_size": Refused(
        "serve_asgi serves ASGI apps only; for a WSGI app, wrap it in an ASGI adapter"
    ),
    # Derived from other fields, or Hypercorn's own state.
    "log": HONOURED,  # the logger made from the logging fields above
    "ssl_enabled": HONOURED,  # certfile and keyfile, read only
    "cert_reqs": HONOURED,  # an old, write-only name for verify_mode
}

# Values of a refused field that are accepted although not the default.
_ALSO_ACCEPTED: Final[dict[str, tuple[object, ...]]] = {"worker_class": ("trio",)}


def server_config(config: Config | None, bind: str | Sequence[str] | None) -> Config:
    """Return the configuration `serve_asgi` serves with: a copy of ``config``.

    ``bind`` (if not None) replaces ``config.bind``; a ``statsd_host`` makes
    the logger send Hypercorn's metrics over Trio, as Hypercorn's Trio
    worker does. The caller's ``config`` is left as it was.

    Raises:
        TypeError: if ``config`` is not a Hypercorn ``Config``, or
            ``read_timeout`` is not a number of seconds.
        ValueError: if ``bind`` is empty, ``read_timeout`` is not positive,
            or a field is refused (see `FIELDS`).
    """
    if config is None:
        config = Config()
    elif not isinstance(cast("object", config), Config):
        raise TypeError(f"config must be a hypercorn.config.Config, not {config!r}")
    else:
        config = copy.copy(config)
    if bind is not None:
        binds = [bind] if isinstance(bind, str) else list(bind)
        if not binds or not all(
            isinstance(cast("object", b), str) and b for b in binds
        ):
            raise ValueError(
                f"bind must be an address like '127.0.0.1:8000' or a list of them, "
                f"not {bind!r}"
            )
        config.bind = binds
    check_config(config)
    config.set_statsd_logger_class(StatsdLogger)
    return config


def check_config(config: Config) -> None:
    """Refuse the fields of ``config`` that `serve_asgi` cannot honour.

    Raises:
        TypeError: if ``read_timeout`` is not a number of seconds.
        ValueError: naming the first field refused, its value and what to
            use instead; or if ``read_timeout`` is not positive.
    """
    default = Config()
    for name, rule in FIELDS.items():
        if rule is HONOURED:
            continue  # cert_reqs (write-only) and log (made when read) among them
        value = getattr(config, name, _MISSING)
        if value == getattr(default, name, _MISSING):
            continue
        if isinstance(rule, Refused):
            if value in _ALSO_ACCEPTED.get(name, ()):
                continue
            raise ValueError(
                f"config.{name} = {value!r} is not supported by serve_asgi: "
                f"{rule.instead}"
            )
        if isinstance(rule, OnlyWith) and not rule.applies(config):
            raise ValueError(f"config.{name} = {value!r} needs {rule.needs}")
    timeout = cast("object", config.read_timeout)
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(
                "config.read_timeout must be None or a number of seconds, "
                f"not {timeout!r}"
            )
        if not timeout > 0:
            raise ValueError(
                f"config.read_timeout must be None or > 0, not {timeout!r}"
            )
