"""`Runner.status_detail`: what a program's part adds to its status and ``/statusz``.

In-process runs; ``/statusz`` is a real HTTP request over loopback.
"""

from __future__ import annotations

import pytest
import trio

import trio_graceful
from tests.support.workers import get_statusz
from trio_graceful import current_runner


def port() -> int:
    address = current_runner().health_address
    assert address is not None
    return address[1]


def test_a_detail_is_in_the_status_and_at_statusz_for_its_block_only():
    seen: list[object] = []

    async def main() -> None:
        runner = current_runner()
        count = [0]

        def describe() -> dict[str, int]:
            count[0] += 1
            return {"asked": count[0]}

        with runner.status_detail("pool", describe):
            assert runner.status().details == {"pool": {"asked": 1}}
            seen.append((await get_statusz(port()))["pool"])
            assert runner.status().as_dict()["pool"] == {"asked": 3}
        assert runner.status().details == {}
        seen.append("pool" in await get_statusz(port()))

    assert trio_graceful.run(main, health_port=0, health_host="127.0.0.1") == 0
    assert seen == [{"asked": 2}, False]


def test_a_detail_that_fails_is_logged_and_says_its_error(
    caplog: pytest.LogCaptureFixture,
):
    async def main() -> None:
        def broken() -> object:
            raise LookupError("no pool")

        with current_runner().status_detail("pool", broken):
            details = current_runner().status().details
        assert details == {"pool": {"error": "LookupError: no pool"}}

    assert trio_graceful.run(main) == 0
    [record] = [r for r in caplog.records if "status detail" in r.getMessage()]
    assert record.getMessage() == "the status detail 'pool' failed"
    assert record.exc_info is not None


NEW_KEY = "name must be a new key of /statusz"
TAKEN = r"^a status detail named 'taken' is given already$"


@pytest.mark.parametrize(
    ("name", "describe", "error", "message"),
    [
        ("", dict, ValueError, rf"^{NEW_KEY}, not ''$"),
        ("state", dict, ValueError, rf"^{NEW_KEY}, not 'state'$"),
        ("details", dict, ValueError, rf"^{NEW_KEY}, not 'details'$"),
        ("taken", dict, ValueError, TAKEN),
        (1, dict, TypeError, r"^name must be a string, not 1$"),
        ("x", 1, TypeError, r"^describe must be a callable, not 1$"),
    ],
)
def test_status_detail_refuses_what_cannot_be_a_key_of_its_own(
    name: object, describe: object, error: type[Exception], message: str
):
    async def main() -> None:
        runner = current_runner()
        with runner.status_detail("taken", dict):
            with (
                pytest.raises(error, match=message),
                runner.status_detail(name, describe),  # type: ignore[arg-type]
            ):
                pass  # pragma: no cover
            assert runner.status().details == {"taken": {}}

    assert trio_graceful.run(main) == 0


def test_status_detail_is_for_the_trio_thread():
    async def main() -> None:
        runner = current_runner()

        def elsewhere() -> None:
            with (
                pytest.raises(
                    RuntimeError, match=r"^Runner.status_detail\(\) must be called from"
                ),
                runner.status_detail("x", dict),
            ):
                pass  # pragma: no cover

        await trio.to_thread.run_sync(elsewhere)

    assert trio_graceful.run(main) == 0
