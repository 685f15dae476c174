"""examples/stdio_service.py as a real subprocess receiving real signals.

Each scenario runs ``REPEAT`` times, several processes at once, to show that
it does not depend on luck: the exit status, the time to exit (generous
bounds: far below the grace where it must not be waited for, at least the
unwind budget where it must), the saved state, and a stderr free of
tracebacks and of the interpreter's *could not acquire lock for <stdin>*
error. Run with ``-s`` to see the measured times.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import termios
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from tests.support.examples import EXAMPLES
from tests.support.streams import StreamLog

pytestmark = pytest.mark.realtime

REPEAT = 10
AT_ONCE = 4  # processes starting at once (starting is what costs)
# Long enough that a graceful exit on a busy machine never needs to be forced.
GRACE = 30.0
# For scenarios that wait in a started shutdown while the others start and
# take their turn: the grace must not run out before the turn comes, however
# busy the machine is. A request that keeps the worker thread busy lasts as
# long.
LONG_GRACE = 600.0
# How soon a forced exit must come: far below LONG_GRACE, and generous.
FORCED_EXIT_BOUND = 10.0
UNWIND_BUDGET = 0.5
# A bound against hangs, not a measurement: on a busy machine, starting a
# process and its first answer can take seconds.
TIMEOUT = 60.0
EXAMPLE = EXAMPLES / "stdio_service.py"


class Service:
    """One stdio_service process: requests in, answers and stderr out."""

    def __init__(self, process: trio.Process, state: Path, tty: int | None) -> None:
        self.process = process
        self.state = state
        self.tty = tty  # the pty's master end when stdin is a terminal
        self._stdout = b""
        assert process.stderr is not None
        self._stderr = StreamLog(process.stderr)

    @classmethod
    async def start(
        cls,
        nursery: trio.Nursery,
        tmp: Path,
        *,
        stdin_tty: bool = False,
        grace: float = GRACE,
    ) -> Service:
        state = tmp / "state.json"
        master = slave = None
        if stdin_tty:
            master, slave = os.openpty()
        process = await trio.lowlevel.open_process(
            [
                sys.executable,
                str(EXAMPLE),
                "--state",
                str(state),
                "--grace",
                str(grace),
                "--unwind-budget",
                str(UNWIND_BUDGET),
                "--heartbeat",
                "0.05",
            ],
            stdin=slave if slave is not None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        if slave is not None:
            os.close(slave)  # the child has its own copy
        service = cls(process, state, master)
        nursery.start_soon(service._stderr.collect)
        return service

    @property
    def stderr(self) -> bytes:
        return self._stderr.data

    async def wait_stderr(self, text: str) -> None:
        await self._stderr.wait_for(text, timeout=TIMEOUT)

    async def send(self, request: dict[str, object]) -> None:
        line = json.dumps(request).encode() + b"\n"
        if self.tty is not None:
            os.write(self.tty, line)
        else:
            assert self.process.stdin is not None
            await self.process.stdin.send_all(line)

    async def answer(self) -> dict[str, object]:
        assert self.process.stdout is not None
        with trio.fail_after(TIMEOUT):
            while b"\n" not in self._stdout:
                data = await self.process.stdout.receive_some()
                assert data, f"stdout ended; stderr: {self.stderr.decode()}"
                self._stdout += data
        line, _, self._stdout = self._stdout.partition(b"\n")
        answer: dict[str, object] = json.loads(line)
        return answer

    async def ask(self, request: dict[str, object]) -> dict[str, object]:
        await self.send(request)
        return await self.answer()

    def kill(self, signum: int) -> None:
        self.process.send_signal(signum)

    async def kill_and_wait_taken(self, signum: int) -> None:
        """Send ``signum`` and wait until a thread of the process has taken it.

        Until then a second ``signum`` would merge with it in the kernel:
        a process has one pending bit per signal.
        """
        self.kill(signum)
        with trio.fail_after(TIMEOUT):
            # the kernel's pending set: no event to wait for
            while signal_pending(self.process.pid, signum):  # noqa: ASYNC110
                await trio.sleep(0.001)

    async def exit_status(self, *, since: float) -> tuple[int, float]:
        """Wait for the exit; return the status and the seconds since ``since``.

        ``since`` is a `trio.current_time` taken before what causes the exit,
        so that a slow machine can only make the interval longer. Also waits
        for the end of stderr, so that all of it can be checked.
        """
        with trio.fail_after(TIMEOUT):
            status = await self.process.wait()
        elapsed = trio.current_time() - since
        await self._stderr.wait_closed(timeout=TIMEOUT)
        return status, elapsed

    def saved_state(self) -> dict[str, int]:
        state: dict[str, int] = json.loads(self.state.read_text())
        return state

    def check_stderr_is_clean(self) -> str:
        text = self.stderr.decode()
        assert "Traceback" not in text, text
        assert "could not acquire lock" not in text, text
        assert "KeyboardInterrupt" not in text, text
        return text


Prepare = Callable[[Service], Awaitable[None]]
Finish = Callable[[Service], Awaitable[float]]


async def repeat(
    tmp_path: Path,
    prepare: Prepare,
    finish: Finish,
    *,
    times: int = REPEAT,
    stdin_tty: bool = False,
    grace: float = GRACE,
    finish_in_turn: bool = True,
) -> list[float]:
    """Run a scenario on ``times`` processes; return what ``finish`` measured.

    The processes are started and prepared concurrently (AT_ONCE at a time);
    then ``finish`` runs on each in turn, so that what it measures is not
    slowed down by other processes starting (or on all at once, when only a
    lower bound is checked).
    """
    limit = trio.CapacityLimiter(AT_ONCE)
    services: list[Service] = []

    async def start(i: int, nursery: trio.Nursery) -> None:
        async with limit:
            directory = tmp_path / str(i)
            directory.mkdir()
            service = await Service.start(
                nursery, directory, stdin_tty=stdin_tty, grace=grace
            )
            services.append(service)
            await prepare(service)

    timings: list[float] = []
    async with trio.open_nursery() as nursery:
        try:
            async with trio.open_nursery() as starting:
                for i in range(times):
                    starting.start_soon(start, i, nursery)
            if finish_in_turn:
                for service in services:
                    timings.append(await finish(service))
            else:
                async with trio.open_nursery() as finishing:
                    for service in services:

                        async def finish_one(service: Service = service) -> None:
                            timings.append(await finish(service))

                        finishing.start_soon(finish_one)
        finally:
            for service in services:
                if service.process.returncode is None:
                    service.process.kill()
                with trio.CancelScope(shield=True):
                    await service.process.wait()
                if service.tty is not None:
                    os.close(service.tty)
            nursery.cancel_scope.cancel()  # the stderr collectors
    print(
        f"\n{finish.__name__}: {times} runs, max {max(timings):.3f} s, "
        f"median {sorted(timings)[times // 2]:.3f} s"
    )
    return timings


async def serve_a_little(service: Service) -> None:
    assert await service.ask({"jsonrpc": "2.0", "id": 1, "method": "ping"}) == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": "pong",
    }
    answer = await service.ask({"id": 2, "method": "hash", "params": {"text": "x"}})
    assert answer["result"] == (
        "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
    )


# -- one signal: a graceful exit within the grace, state saved -----------------------


async def test_sigint_exits_gracefully_with_130(tmp_path):
    async def sigint(service: Service) -> float:
        start = trio.current_time()
        service.kill(signal.SIGINT)
        status, elapsed = await service.exit_status(since=start)
        assert status == 130
        assert service.saved_state()["requests"] == 2
        text = service.check_stderr_is_clean()
        assert "WARNING trio_graceful.runner: SIGINT: shutting down (grace 30 s)\n" in (
            text
        )
        assert "INFO stdio_service: STOP: no more requests\n" in text
        assert "forcing" not in text
        return elapsed

    await repeat(tmp_path, serve_a_little, sigint)


async def test_sigterm_exits_gracefully_with_0(tmp_path):
    async def sigterm(service: Service) -> float:
        start = trio.current_time()
        service.kill(signal.SIGTERM)
        status, elapsed = await service.exit_status(since=start)
        assert status == 0
        assert service.saved_state()["requests"] == 2
        text = service.check_stderr_is_clean()
        assert "SIGTERM: shutting down (grace 30 s)" in text
        assert "forcing" not in text
        return elapsed

    await repeat(tmp_path, serve_a_little, sigterm)


async def test_sigint_with_stdin_a_terminal(tmp_path):
    modes: dict[Service, list[object]] = {}

    async def prepare(service: Service) -> None:
        assert service.tty is not None
        modes[service] = termios.tcgetattr(service.tty)
        await serve_a_little(service)

    async def sigint_tty(service: Service) -> float:
        assert service.tty is not None
        start = trio.current_time()
        service.kill(signal.SIGINT)
        status, elapsed = await service.exit_status(since=start)
        assert status == 130
        assert service.saved_state()["requests"] == 2
        service.check_stderr_is_clean()
        # The service never changed the terminal's modes.
        assert termios.tcgetattr(service.tty) == modes[service]
        return elapsed

    await repeat(tmp_path, prepare, sigint_tty, stdin_tty=True)


async def test_end_of_input_exits_with_0(tmp_path):
    async def end_of_input(service: Service) -> float:
        assert service.process.stdin is not None
        start = trio.current_time()
        await service.process.stdin.aclose()
        status, elapsed = await service.exit_status(since=start)
        assert status == 0
        assert service.saved_state()["requests"] == 2
        assert "INFO stdio_service: end of input\n" in service.check_stderr_is_clean()
        return elapsed

    # Not about signals: a few runs are enough.
    await repeat(tmp_path, serve_a_little, end_of_input, times=5)


# -- two signals: forced, without waiting for the grace ------------------------------


async def test_second_sigint_forces_the_exit_without_waiting_for_the_grace(tmp_path):
    async def prepare(service: Service) -> None:
        await serve_a_little(service)
        # A request that keeps the worker thread busy for the whole grace:
        # the graceful shutdown waits for its answer.
        await service.send(
            {
                "id": 3,
                "method": "hash",
                "params": {"text": "y", "seconds": LONG_GRACE},
            }
        )
        service.kill(signal.SIGINT)
        await service.wait_stderr("SIGINT: shutting down (grace 600 s)")

    async def second_sigint(service: Service) -> float:
        assert service.process.returncode is None  # still shutting down
        start = trio.current_time()
        service.kill(signal.SIGINT)
        status, elapsed = await service.exit_status(since=start)
        assert status == 130
        # Far below the grace: the forced shutdown did not wait for the busy
        # worker. (How fast it exits is measured, not asserted.)
        assert elapsed < FORCED_EXIT_BOUND
        assert service.saved_state()["requests"] == 3
        text = service.check_stderr_is_clean()
        assert "WARNING trio_graceful.runner: forcing: SIGINT again\n" in text
        assert "emergency" not in text
        return elapsed

    await repeat(tmp_path, prepare, second_sigint, grace=LONG_GRACE)


# -- the emergency exit ---------------------------------------------------------------


async def test_task_stuck_in_a_shield_ends_in_an_emergency_exit(tmp_path):
    async def prepare(service: Service) -> None:
        await serve_a_little(service)
        assert (await service.ask({"id": 3, "method": "hang"}))["result"] == "hanging"
        service.kill(signal.SIGINT)
        await service.wait_stderr("SIGINT: shutting down")

    async def stuck_in_shield(service: Service) -> float:
        start = trio.current_time()  # the budget starts after the signal
        service.kill(signal.SIGINT)
        status, elapsed = await service.exit_status(since=start)
        assert status == 137
        # The watchdog waited for the unwind budget, no less.
        assert elapsed >= UNWIND_BUDGET
        text = service.check_stderr_is_clean()
        assert (
            "CRITICAL trio_graceful.runner: emergency exit: tasks did not unwind "
            "within 0.5 s of the hard cancel\n"
        ) in text
        # Which task was stuck, and where.
        lines = text.split("tasks still running:\n", 1)[1].splitlines()
        at = lines.index("    hang")
        assert lines[at + 2].endswith(f"{EXAMPLE}:{hang_line()} in hang")
        return elapsed

    await repeat(
        tmp_path, prepare, stuck_in_shield, grace=LONG_GRACE, finish_in_turn=False
    )


async def test_third_sigint_exits_even_when_trio_is_blocked(tmp_path):
    async def prepare(service: Service) -> None:
        await serve_a_little(service)
        request = {"id": 3, "method": "freeze", "params": {"seconds": 600}}
        assert (await service.ask(request))["result"] == "freezing"

    async def three_sigints(service: Service) -> float:
        # Trio cannot see these: its thread is stuck in time.sleep(). Each
        # is sent once the previous one was taken, so that none merge.
        for _ in range(2):
            await service.kill_and_wait_taken(signal.SIGINT)
        start = trio.current_time()
        service.kill(signal.SIGINT)
        status, elapsed = await service.exit_status(since=start)
        assert status == 137
        text = service.check_stderr_is_clean()
        assert (
            "CRITICAL trio_graceful.runner: emergency exit: SIGINT received a "
            "third time\n"
        ) in text
        # The stacks show where the Trio thread is stuck.
        assert f'File "{EXAMPLE}", line {freeze_line()} in dispatch' in text
        assert "    serve  (running now)\n" in text
        # Nothing could run, so the state was not saved.
        assert not service.state.exists()
        return elapsed

    await repeat(tmp_path, prepare, three_sigints)


def signal_pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` waits for a thread of process ``pid`` to take it.

    Linux shows the pending signals in /proc as hexadecimal bit masks: the
    process's shared ones (ShdPnd) and the main thread's own (SigPnd).
    """
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        field, _, mask = line.partition(":")
        if field in ("ShdPnd", "SigPnd") and int(mask, 16) >> (signum - 1) & 1:
            return True
    return False


def line_of(fragment: str) -> int:
    """The number of the example's only line that contains ``fragment``."""
    lines = EXAMPLE.read_text().splitlines()
    (number,) = [i + 1 for i, line in enumerate(lines) if fragment in line]
    return number


def hang_line() -> int:
    return line_of("await trio.sleep_forever()")


def freeze_line() -> int:
    return line_of("time.sleep(float(params")
