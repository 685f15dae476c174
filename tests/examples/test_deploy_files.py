"""The deployment files in docs/deploy/ say what docs/deployment.rst says.

Each file runs the WebSocket example server with a drain delay and a grace;
its stop budget (Kubernetes' ``terminationGracePeriodSeconds``, systemd's
``TimeoutStopSec=``, compose's ``stop_grace_period``) must hold the drain
delay, the grace, the unwind budget and the watchdog's last two seconds, as
`trio_graceful.run` spends them. The Kubernetes and compose files are read
with PyYAML when it is installed; the systemd unit and the Dockerfile are
read here.
"""

from __future__ import annotations

import configparser
import inspect
import json
import re
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

import trio_graceful
from tests.support.examples import load_example
from trio_graceful._run._shutdown._stoptime import (
    WATCHDOG_MARGIN,
    StopTimes,
    fit_stop_budget,
)

DEPLOY = Path(__file__).resolve().parent.parent.parent / "docs" / "deploy"
EXAMPLE = "websocket_close_server.py"

UNWIND_BUDGET: float = (
    inspect.signature(trio_graceful.run).parameters["unwind_budget"].default
)


@attrs.frozen
class Budget:
    """What the example server's command line asks of its stop budget."""

    drain_delay: float
    grace: float

    @classmethod
    def of(cls, args: Sequence[str]) -> Budget:
        assert not [arg for arg in args if arg.startswith("--") and "=" in arg]
        server = load_example("websocket_close_server")

        def option(name: str, default: float) -> float:
            return float(args[args.index(name) + 1]) if name in args else default

        return cls(
            drain_delay=option("--drain-delay", 0.0),
            grace=option("--grace", server.parse_args([]).grace),
        )

    @property
    def needed(self) -> float:
        """Seconds from the stop signal to the latest exit."""
        return self.drain_delay + self.grace + UNWIND_BUDGET + WATCHDOG_MARGIN


def server_args(argv: Sequence[str]) -> list[str]:
    """The options after the example's path in a command line."""
    (index,) = [i for i, arg in enumerate(argv) if arg.endswith("/" + EXAMPLE)]
    return list(argv[index + 1 :])


def test_the_budgets_arithmetic_is_the_one_the_files_show():
    budget = Budget.of(["--drain-delay", "5", "--grace", "20"])
    assert (UNWIND_BUDGET, WATCHDOG_MARGIN) == (3.0, 2.0)
    assert budget.needed == 5 + 20 + 3 + 2 == 30


# -- Dockerfile ------------------------------------------------------------------


def dockerfile() -> dict[str, list[str]]:
    """The Dockerfile's instructions by keyword, continuation lines joined."""
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    instructions: dict[str, list[str]] = {}
    for instruction in "\n".join(lines).replace("\\\n", " ").splitlines():
        if instruction.strip():
            keyword, _, value = instruction.partition(" ")
            instructions.setdefault(keyword, []).append(value.strip())
    return instructions


def only(keyword: str) -> str:
    """The one instruction of its kind (a second one would override it)."""
    (value,) = dockerfile()[keyword]
    return value


def exec_form(value: str) -> list[str]:
    """An ENTRYPOINT or CMD in exec form (a JSON array of strings)."""
    argv = json.loads(value)
    assert isinstance(argv, list)
    assert all(isinstance(arg, str) for arg in argv)
    return argv


def test_the_dockerfile_runs_the_server_under_tini_in_exec_form():
    entrypoint = exec_form(only("ENTRYPOINT"))
    # tini is PID 1, the server its child: no shell that would keep SIGTERM.
    assert entrypoint == ["tini", "--", "python", f"/app/{EXAMPLE}"]
    installed, copied = dockerfile()["RUN"]
    assert "apt-get install -y --no-install-recommends tini" in installed
    assert f"cp /src/examples/{EXAMPLE} " in copied
    exec_form(only("CMD"))


def test_the_dockerfiles_stop_signal_is_one_the_runner_handles():
    stop_signal = signal.Signals[only("STOPSIGNAL")]
    handled = inspect.signature(trio_graceful.run).parameters["signals"].default
    assert stop_signal in handled


# -- YAML: Kubernetes and compose ---------------------------------------------------


def load_yaml(name: str) -> list[Any]:
    return list(yaml.safe_load_all((DEPLOY / name).read_text()))


def test_compose_waits_for_the_images_budget():
    (compose,) = load_yaml("compose.yaml")
    (service,) = compose["services"].values()
    assert service["build"]["dockerfile"] == "docs/deploy/Dockerfile"
    match = re.fullmatch(r"(\d+)s", service["stop_grace_period"])
    assert match is not None
    budget = Budget.of(exec_form(only("CMD")))
    assert int(match[1]) >= budget.needed


def kubernetes() -> tuple[dict[str, Any], dict[str, Any]]:
    deployment, service = load_yaml("kubernetes.yaml")
    assert (deployment["kind"], service["kind"]) == ("Deployment", "Service")
    return deployment, service


def test_kubernetes_waits_for_the_servers_budget():
    deployment, _ = kubernetes()
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # The image's ENTRYPOINT stays (tini, then the server); args replace CMD.
    assert "command" not in container
    budget = Budget.of(container["args"])
    pre_stop = container.get("lifecycle", {}).get("preStop", {})
    pre_stop_seconds = pre_stop.get("sleep", {}).get("seconds", 0)
    assert set(pre_stop) <= {"sleep"}  # a hook of another kind: count it here
    # The preStop hook's time counts against the grace period too.
    assert pod["terminationGracePeriodSeconds"] >= pre_stop_seconds + budget.needed


def test_kubernetes_probes_the_health_endpoint_of_the_command_line():
    deployment, service = kubernetes()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    # A probe comes from the node, not from inside the pod: not loopback.
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert ports["health"] == int(args[args.index("--health-port") + 1])
    assert ports["websocket"] == int(args[args.index("--port") + 1])
    ready = container["readinessProbe"]
    live = container["livenessProbe"]
    assert (ready["httpGet"], live["httpGet"]) == (
        {"path": "/readyz", "port": "health"},
        {"path": "/livez", "port": "health"},
    )
    # The kubelet notices the withdrawal well within the drain delay.
    noticed = ready["periodSeconds"] * ready["failureThreshold"]
    assert noticed + ready["timeoutSeconds"] <= Budget.of(args).drain_delay
    assert service["spec"]["ports"][0]["targetPort"] == "websocket"
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector


# -- systemd -----------------------------------------------------------------------


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((DEPLOY / "websocket-server.service").read_text())
    return parser


def test_the_systemd_unit_is_notify_with_killmode_mixed():
    service = unit()["Service"]
    settings = ("Type", "NotifyAccess", "KillMode", "KillSignal")
    assert {name: service[name] for name in settings} == {
        "Type": "notify",
        "NotifyAccess": "main",
        "KillMode": "mixed",
        "KillSignal": "SIGTERM",
    }
    assert int(service["WatchdogSec"]) > 0


def test_the_systemd_unit_waits_for_the_servers_budget():
    service = unit()["Service"]
    argv = service["ExecStart"].split()
    assert int(service["TimeoutStopSec"]) >= Budget.of(server_args(argv)).needed


# -- every command line ------------------------------------------------------------


def command_lines() -> dict[str, list[str]]:
    deployment, _ = kubernetes()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {
        "Dockerfile": exec_form(only("CMD")),
        "kubernetes.yaml": container["args"],
        "websocket-server.service": server_args(unit()["Service"]["ExecStart"].split()),
    }


def test_every_command_line_is_one_the_example_accepts():
    server = load_example("websocket_close_server")
    for name, args in command_lines().items():
        options = server.parse_args(args)
        budget = Budget.of(args)
        assert (options.drain_delay, options.grace) == (
            budget.drain_delay,
            budget.grace,
        ), name
        assert options.health_port == 8081, name


def test_every_command_line_tells_the_runner_its_orchestrators_budget():
    deployment, _ = kubernetes()
    pod = deployment["spec"]["template"]["spec"]
    compose = load_yaml("compose.yaml")[0]["services"]["websocket-server"]
    orchestrators = {
        "Dockerfile": float(compose["stop_grace_period"].removesuffix("s")),
        "kubernetes.yaml": float(pod["terminationGracePeriodSeconds"]),
        "websocket-server.service": float(unit()["Service"]["TimeoutStopSec"]),
    }
    server = load_example("websocket_close_server")
    for name, args in command_lines().items():
        options = server.parse_args(args)
        assert options.stop_budget == orchestrators[name], name
        # ... and the runner finds that everything fits: nothing shortened.
        times = StopTimes(
            drain_delay=options.drain_delay,
            grace=options.grace,
            unwind_budget=UNWIND_BUDGET,
            stop_budget=options.stop_budget,
        )
        assert fit_stop_budget(times) == (times, None), name
