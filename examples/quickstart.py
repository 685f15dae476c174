"""Quickstart: finish the queued work, stop at a safe point, bound the wait.

Two workers read jobs from their inboxes; a third task is stuck forever.
``bundle.shutdown(grace=2)`` puts STOP behind the queued jobs, so each worker
finishes its jobs, meets STOP at its idle point and cleans up, while the stuck
task is hard-cancelled when the 2 seconds are up.

Run it (takes about 2 seconds of real time)::

    python examples/quickstart.py

Try: a grace of 0.3 s, and watch the second jobs being cut off.
"""

import trio

import trio_graceful


async def worker(name: str, inbox: trio_graceful.InboxReceiver[float]) -> None:
    async for job in inbox:  # ends at STOP, after the jobs queued before it
        await trio.sleep(job)
        print(f"{name}: finished a {job} s job")
    print(f"{name}: got STOP, cleaning up")


async def main(grace: float = 2.0) -> trio_graceful.CancelReport:
    async with trio_graceful.open_bundle(name="workers") as bundle:
        for name in ("ann", "bob"):
            send: trio_graceful.InboxSender[float]
            inbox: trio_graceful.InboxReceiver[float]
            send, inbox = bundle.open_inbox(10)
            bundle.start_soon(worker, name, inbox, name=name)
            for job in (0.1, 0.2):
                send.send_nowait(job)
        bundle.start_soon(trio.sleep_forever, name="stuck")
        report = await bundle.shutdown(grace=grace)  # STOP, then up to grace seconds
    print(report.summary())
    return report


if __name__ == "__main__":
    trio.run(main)
