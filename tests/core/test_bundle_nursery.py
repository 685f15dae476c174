"""A Bundle stands in for a trio.Nursery, including exception behaviour."""

from __future__ import annotations

import functools
import math
import sys

import pytest
import trio
import trio.testing
import trio_websocket

from tests.support.exception_shapes import capture, shape
from trio_graceful import Bundle, BundleStatistics, ChildOutcome, open_bundle

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

# -- the Nursery surface ------------------------------------------------------


async def test_nursery_attributes(autojump_clock):
    async with open_bundle(name="b") as bundle:
        assert bundle.name == "b"
        assert bundle.parent_task is trio.lowlevel.current_task()
        assert isinstance(bundle.cancel_scope, trio.CancelScope)
        assert bundle.child_tasks == frozenset()
        bundle.start_soon(trio.sleep, 1, name="one")
        bundle.start_soon(trio.sleep, 2, name="two")
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(t.name for t in bundle.child_tasks) == ["one", "two"]
        assert repr(bundle).startswith("<trio_graceful.Bundle 'b' open, 2 children")
    assert bundle.child_tasks == frozenset()


async def test_repr_counts_the_children_in_words(autojump_clock):
    async with open_bundle(name="b") as bundle:
        assert repr(bundle).startswith("<trio_graceful.Bundle 'b' open, 0 children at ")
        bundle.start_soon(trio.sleep, 1)
        assert repr(bundle).startswith("<trio_graceful.Bundle 'b' open, 1 child at ")
        await bundle.cancel(grace=0)
        assert repr(bundle).startswith("<trio_graceful.Bundle 'b' closed, 0 children")


async def test_default_name_and_task_names(autojump_clock):
    names: list[str] = []

    async def child():
        names.append(trio.lowlevel.current_task().name)

    async with open_bundle() as bundle:
        bundle.start_soon(child)
        bundle.start_soon(functools.partial(child))
        bundle.start_soon(child, name="explicit")
    me = trio.lowlevel.current_task().name
    assert bundle.name == f"bundle in {me}"
    qual = f"{__name__}.test_default_name_and_task_names.<locals>.child"
    assert sorted(names) == sorted([qual, qual, "explicit"])


async def test_start_returns_the_started_value(autojump_clock):
    async def server(port, *, task_status=trio.TASK_STATUS_IGNORED):
        await trio.sleep(1)
        task_status.started(port + 1)
        await trio.sleep_forever()

    async with open_bundle() as bundle:
        assert await bundle.start(server, 41) == 42
        assert len(bundle.child_tasks) == 1
        assert bundle.statistics().children_running == 1
        bundle.cancel_scope.cancel()


async def test_start_error_before_started_goes_to_caller(autojump_clock):
    async def broken(*, task_status=trio.TASK_STATUS_IGNORED):
        await trio.sleep(1)
        raise ValueError("no port")

    async def lazy(*, task_status=trio.TASK_STATUS_IGNORED):
        await trio.sleep(1)

    async with open_bundle() as bundle:
        bundle.start_soon(trio.sleep, 5)
        with pytest.raises(ValueError, match="no port"):
            await bundle.start(broken)
        with pytest.raises(RuntimeError, match=r"without calling task_status\.started"):
            await bundle.start(lazy)
        # the bundle and its other child are untouched
        assert bundle.statistics().children_running == 1
        assert not bundle.cancel_scope.cancel_called


async def test_start_cancelled_by_caller_cancels_the_child(autojump_clock):
    async def slow(*, task_status=trio.TASK_STATUS_IGNORED):
        await trio.sleep_forever()

    async with open_bundle() as bundle:
        with trio.move_on_after(2):
            await bundle.start(slow)
        assert bundle.statistics().children_running == 0


async def test_cancel_scope_cancels_body_and_children(autojump_clock):
    t0 = trio.current_time()
    cancelled: list[str] = []

    async def child():
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append("child")
            raise

    async with open_bundle() as bundle:
        bundle.start_soon(child)
        await trio.sleep(1)
        bundle.cancel_scope.cancel()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append("body")
            raise
    assert sorted(cancelled) == ["body", "child"]
    assert trio.current_time() - t0 == 1


async def test_cancel_scope_deadline_applies_to_body_and_children(autojump_clock):
    t0 = trio.current_time()
    async with open_bundle() as bundle:
        bundle.cancel_scope.deadline = t0 + 3
        bundle.start_soon(trio.sleep_forever)
        await trio.sleep_forever()
    assert trio.current_time() - t0 == 3


async def test_block_exit_waits_for_children_like_a_nursery(autojump_clock):
    t0 = trio.current_time()
    async with open_bundle() as bundle:
        bundle.start_soon(trio.sleep, 4)
    assert trio.current_time() - t0 == 4


async def test_entering_is_not_a_cancel_point(autojump_clock):
    ran: list[str] = []
    with trio.CancelScope() as scope:
        scope.cancel()
        async with open_bundle() as bundle:
            ran.append("body")
            bundle.start_soon(trio.sleep_forever)
            await trio.sleep_forever()
    assert ran == ["body"]
    assert scope.cancelled_caught


async def test_sync_function_returning_coroutine_is_accepted(autojump_clock):
    done: list[int] = []

    async def work(x):
        done.append(x)

    def factory(x):
        return work(x)

    async with open_bundle() as bundle:
        bundle.start_soon(factory, 7)
        bundle.start_soon(functools.partial(work, 8))
    assert sorted(done) == [7, 8]


async def test_start_soon_rejects_what_is_not_async(autojump_clock):
    def sync():
        return 3

    async def coro_fn():
        pass

    async with open_bundle() as bundle:
        with pytest.raises(
            TypeError, match=r"returned 3 instead of a coroutine; is it missing 'async'"
        ):
            bundle.start_soon(sync)
        coro = coro_fn()
        with pytest.raises(TypeError, match=r"not the coroutine object"):
            bundle.start_soon(coro)  # type: ignore[arg-type]
        with pytest.raises(
            TypeError, match=r"^start_soon\(\): async_fn must be an async function"
        ):
            bundle.start_soon(42)  # type: ignore[arg-type]
        assert bundle.statistics().children_running == 0


async def test_statistics_follow_children_inboxes_and_the_deadline_through_a_cancel(
    autojump_clock,
):
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery, open_bundle() as bundle:
        assert bundle.statistics() == BundleStatistics(
            children_running=0,
            cancelling=False,
            closed=False,
            hard_deadline=math.inf,
            inboxes=0,
        )
        bundle.start_soon(trio.sleep, 2)
        bundle.start_soon(trio.sleep, 3)
        _, receiver = bundle.open_inbox()
        nursery.start_soon(bundle.cancel, 10)
        await trio.sleep(2.5)
        assert bundle.statistics() == BundleStatistics(
            children_running=1,
            cancelling=True,
            closed=False,
            hard_deadline=t0 + 10,
            inboxes=1,
        )
        await trio.sleep(1)
        receiver.close()
        # closed, so no longer cancelling, as the field's docstring says
        assert bundle.statistics() == BundleStatistics(
            children_running=0,
            cancelling=False,
            closed=True,
            hard_deadline=t0 + 10,
            inboxes=0,
        )


async def test_no_public_constructor():
    with pytest.raises(TypeError, match="no public constructor"):
        Bundle()  # type: ignore[call-arg]


# -- misuse -------------------------------------------------------------------


async def test_cancel_from_another_thread_is_refused():
    async with open_bundle(name="b") as bundle:
        bundle.start_soon(trio.sleep, 0.01)

        def in_thread():
            with pytest.raises(
                RuntimeError,
                match=r"^Bundle\.cancel\(\) must be called from the Trio run that "
                r"owns bundle 'b'; from another thread use "
                r"trio\.from_thread\.run\(bundle\.cancel, grace\)$",
            ):
                trio.run(bundle.cancel, 1)

        await trio.to_thread.run_sync(in_thread)
        assert not bundle.cancelling
        # and the right way works
        report = await trio.to_thread.run_sync(
            lambda: trio.from_thread.run(bundle.cancel, 1)
        )
        assert report.graceful


async def test_cancel_from_inside_the_bundle_is_refused(autojump_clock):
    errors: list[str] = []

    async def child():
        try:
            await bundle.shutdown(grace=1)
        except RuntimeError as exc:
            errors.append(str(exc))

    async def grandchild_parent():
        async with open_bundle(name="inner") as inner:
            inner.start_soon(child)

    async with open_bundle(name="b") as bundle:
        bundle.start_soon(child, name="direct")
        bundle.start_soon(grandchild_parent)
    assert len(errors) == 2
    assert all("runs inside bundle 'b' and would wait for itself" in e for e in errors)
    assert not bundle.cancelling


async def test_cancel_from_outside_the_children_is_allowed(autojump_clock):
    reports = []

    async def canceller(bundle, at):
        await trio.sleep(at)
        report = await bundle.cancel(grace=1)
        reports.append((trio.current_time(), report))

    async with trio.open_nursery() as outside, open_bundle(name="b") as bundle:
        bundle.start_soon(trio.sleep, 3)
        # a task outside the bundle, and a task of the body's own nursery
        outside.start_soon(canceller, bundle, 1.5)
        async with trio.open_nursery() as in_body:
            in_body.start_soon(canceller, bundle, 1)
    assert [(at, report.started_at, report.finished_at) for at, report in reports] == [
        (2, 1, 2),
        (2, 1, 2),
    ]


# -- exceptions: the same shape as a plain nursery ----------------------------


async def _scenario_child_raises(open_thing):
    async def boom():
        await trio.sleep(1)
        raise ValueError("boom")

    async with open_thing() as n:
        n.start_soon(boom)
        n.start_soon(trio.sleep_forever)
        await trio.sleep_forever()


async def _scenario_two_children_raise(open_thing):
    async def boom(exc, delay):
        await trio.sleep(delay)
        raise exc

    async with open_thing() as n:
        n.start_soon(boom, ValueError(), 1)
        n.start_soon(boom, KeyError(), 1.5)
        await trio.sleep_forever()


async def _scenario_body_raises(open_thing):
    async with open_thing() as n:
        n.start_soon(trio.sleep_forever)
        await trio.sleep(1)
        raise OSError("body")


async def _scenario_simultaneous_raises(open_thing):
    async def boom():
        await trio.sleep(1)
        raise ValueError

    async with open_thing() as n:
        for _ in range(3):
            n.start_soon(boom)


async def _scenario_nested(open_thing):
    async def inner():
        async with open_thing() as n:
            n.start_soon(_scenario_child_raises, open_thing)
            await trio.sleep_forever()

    async with open_thing() as n:
        n.start_soon(inner)
        n.start_soon(trio.sleep_forever)


async def _scenario_cleanup_raises(open_thing):
    async def bad_cleanup():
        try:
            await trio.sleep_forever()
        finally:
            raise RuntimeError("cleanup")

    async def boom():
        await trio.sleep(1)
        raise ValueError("boom")

    async with open_thing() as n:
        n.start_soon(bad_cleanup)
        n.start_soon(boom)


async def _scenario_keyboard_interrupt(open_thing):
    async def interrupt():
        await trio.sleep(1)
        raise KeyboardInterrupt

    async with open_thing() as n:
        n.start_soon(interrupt)
        await trio.sleep_forever()


@pytest.mark.parametrize(
    "scenario",
    [
        _scenario_child_raises,
        _scenario_two_children_raise,
        _scenario_simultaneous_raises,
        _scenario_body_raises,
        _scenario_nested,
        _scenario_cleanup_raises,
        _scenario_keyboard_interrupt,
    ],
)
async def test_exception_shape_matches_plain_nursery(autojump_clock, scenario):
    t0 = trio.current_time()
    expected = await capture(lambda: scenario(trio.open_nursery))
    t_nursery = trio.current_time() - t0
    t1 = trio.current_time()
    got = await capture(lambda: scenario(open_bundle))
    t_bundle = trio.current_time() - t1
    assert expected is not None
    assert shape(got) == shape(expected)
    assert t_bundle == t_nursery


async def test_failing_child_cancels_siblings_and_body_at_once(autojump_clock):
    t0 = trio.current_time()
    cancelled_at: dict[str, float] = {}

    async def victim(name):
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled_at[name] = trio.current_time() - t0
            raise

    async def boom():
        await trio.sleep(2)
        raise ValueError

    async def slow_victim():
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(5)

    async def scenario():
        async with open_bundle() as bundle:
            bundle.start_soon(victim, "sibling")
            bundle.start_soon(slow_victim)
            bundle.start_soon(boom)
            await victim("body")

    with pytest.raises(BaseExceptionGroup) as info:
        await scenario()
    assert cancelled_at == {"sibling": 2, "body": 2}
    assert shape(info.value) == (
        "ExceptionGroup",
        "Exceptions from Trio nursery",
        ["ValueError"],
    )


async def test_failing_child_during_graceful_cancel(autojump_clock):
    t0 = trio.current_time()
    seen: list[BaseException] = []

    async def fail_later():
        try:
            await trio.sleep_forever()
        finally:
            pass

    async def boom():
        await trio.sleep(3)
        raise ValueError("during grace")

    async def scenario():
        async with open_bundle() as bundle:
            bundle.start_soon(boom)
            bundle.start_soon(fail_later)
            try:
                await bundle.cancel(grace=10)
            except trio.Cancelled as exc:
                seen.append(exc)
                raise

    with pytest.raises(BaseExceptionGroup) as info:
        await scenario()
    assert trio.current_time() - t0 == 3
    assert len(seen) == 1
    assert shape(info.value) == (
        "ExceptionGroup",
        "Exceptions from Trio nursery",
        ["ValueError"],
    )


async def test_report_records_a_raising_child(autojump_clock):
    t0 = trio.current_time()
    reports = []

    async def run_bundle(*, task_status=trio.TASK_STATUS_IGNORED):
        async with open_bundle(name="jobs") as bundle:

            async def boom():
                await trio.sleep(3)
                raise ValueError("late")

            bundle.start_soon(boom, name="boom")
            bundle.start_soon(trio.sleep_forever, name="forever")
            bundle.start_soon(trio.sleep, 1, name="quick")
            task_status.started(bundle)
            await trio.sleep_forever()

    async def cancel_from_outside(bundle):
        reports.append(await bundle.cancel(grace=10))

    async def scenario():
        async with trio.open_nursery() as nursery:
            bundle = await nursery.start(run_bundle)
            nursery.start_soon(cancel_from_outside, bundle)

    with pytest.raises(BaseExceptionGroup) as info:
        await scenario()
    assert shape(info.value) == (
        "ExceptionGroup",
        "Exceptions from Trio nursery",
        [("ExceptionGroup", "Exceptions from Trio nursery", ["ValueError"])],
    )
    (report,) = reports
    assert [(c.name, c.outcome, c.elapsed, c.error) for c in report.children] == [
        ("quick", ChildOutcome.FINISHED, 1, None),
        ("boom", ChildOutcome.RAISED, 3, "ValueError('late')"),
        ("forever", ChildOutcome.CANCELLED, 3, None),
    ]
    assert report.hard_cancelled_at == t0 + 3


# -- real servers: a bundle as handler_nursery --------------------------------


async def test_as_nursery_is_the_bundle_itself(autojump_clock):
    # A typing view only: the same object, so the children it gets are the
    # bundle's and shutdown() reaches them.
    async with open_bundle(name="handlers") as bundle:
        nursery = bundle.as_nursery()
        assert nursery is bundle
        nursery.start_soon(trio.sleep_forever, name="conn")
        await trio.testing.wait_all_tasks_blocked()
        assert [c.name for c in (await bundle.cancel(grace=1)).children] == ["conn"]


async def test_serve_tcp_with_bundle_as_handler_nursery():
    handled: list[bytes] = []
    release = trio.Event()
    handling = trio.Event()

    async def handler(stream):
        handling.set()
        data = await stream.receive_some()
        await release.wait()
        await stream.send_all(data.upper())
        handled.append(data)

    async with open_bundle(name="handlers") as bundle:
        async with trio.open_nursery() as server_nursery:
            listeners = await server_nursery.start(
                functools.partial(
                    trio.serve_tcp,
                    handler,
                    0,
                    host="127.0.0.1",
                    handler_nursery=bundle.as_nursery(),
                )
            )
            port = listeners[0].socket.getsockname()[1]
            client = await trio.open_tcp_stream("127.0.0.1", port)
            await client.send_all(b"hello")
            await handling.wait()
            # stop accepting; the handler keeps running in the bundle
            server_nursery.cancel_scope.cancel()
        with pytest.raises(OSError, match="all attempts to connect"):
            await trio.open_tcp_stream("127.0.0.1", port)

        async def finish():
            await trio.sleep(0.05)
            release.set()

        bundle.start_soon(finish, name="finish")
        report = await bundle.cancel(grace=30)
        assert await client.receive_some() == b"HELLO"
        await client.aclose()
    assert handled == [b"hello"]
    assert report.graceful
    assert sorted(c.name for c in report.children) == [
        "finish",
        "trio._highlevel_serve_listeners._run_handler",
    ]


async def test_serve_websocket_with_bundle_as_handler_nursery():
    async def echo(request):
        ws = await request.accept()
        message = await ws.get_message()
        await ws.send_message(message)
        await ws.aclose(code=1000)

    async with open_bundle(name="ws") as bundle:
        async with trio.open_nursery() as server_nursery:
            server = await server_nursery.start(
                functools.partial(
                    trio_websocket.serve_websocket,
                    echo,
                    "127.0.0.1",
                    0,
                    ssl_context=None,
                    handler_nursery=bundle,
                )
            )
            async with trio_websocket.open_websocket(
                "127.0.0.1", server.port, "/", use_ssl=False
            ) as ws:
                await ws.send_message("ping")
                assert await ws.get_message() == "ping"
            server_nursery.cancel_scope.cancel()
        report = await bundle.cancel(grace=10)
        assert report.hard_cancelled_at is None


# -- on_stop and membership ---------------------------------------------------


async def test_on_stop_calls_back_when_shutdown_begins(autojump_clock):
    t0 = trio.current_time()
    calls: list[tuple[str, float]] = []

    async def foreign_work(name):
        with bundle.on_stop(lambda: calls.append((name, trio.current_time() - t0))):
            await trio.sleep(10)

    async def done_early():
        with bundle.on_stop(lambda: calls.append(("early", 0))):
            await trio.sleep(1)

    async with open_bundle() as bundle:
        bundle.start_soon(foreign_work, "a")
        bundle.start_soon(foreign_work, "b")
        bundle.start_soon(done_early)
        await trio.sleep(3)
        assert calls == []
        await bundle.shutdown(grace=20)
    assert sorted(calls) == [("a", 3), ("b", 3)]
    assert trio.current_time() - t0 == 10


async def test_on_stop_after_shutdown_began_calls_at_once(autojump_clock):
    calls: list[str] = []

    async def late():
        await trio.sleep(1)
        with bundle.on_stop(lambda: calls.append("late")):
            assert calls == ["late"]

    async with open_bundle() as bundle:
        bundle.start_soon(late)
        await bundle.shutdown(grace=5)
    assert calls == ["late"]


async def test_plain_cancel_does_not_call_on_stop(autojump_clock):
    calls: list[str] = []

    async def child():
        with bundle.on_stop(lambda: calls.append("stop")):
            await trio.sleep_forever()

    async with open_bundle() as bundle:
        bundle.start_soon(child)
        await bundle.cancel(grace=1)
    assert calls == []


async def test_failing_on_stop_callback_is_logged(autojump_clock, caplog):
    def bad():
        raise OSError("gone")

    async def child():
        with bundle.on_stop(bad):
            await trio.sleep(1)

    async with open_bundle(name="b") as bundle:
        bundle.start_soon(child)
        await trio.testing.wait_all_tasks_blocked()
        report = await bundle.shutdown(grace=5)
    assert report.graceful
    (record,) = [r for r in caplog.records if r.name == "trio_graceful"]
    assert record.getMessage().startswith("on_stop callback <function")
    assert record.getMessage().endswith("of bundle 'b' raised")


async def test_task_in_bundle(autojump_clock):
    seen: dict[str, bool] = {}

    async def grandchild():
        seen["grandchild"] = trio.lowlevel.current_task() in bundle

    async def child():
        seen["child"] = trio.lowlevel.current_task() in bundle
        async with trio.open_nursery() as nursery:
            nursery.start_soon(grandchild)

    async def starting(*, task_status=trio.TASK_STATUS_IGNORED):
        seen["starting"] = trio.lowlevel.current_task() in bundle
        task_status.started()

    async with open_bundle() as bundle:
        bundle.start_soon(child)
        await bundle.start(starting)
        seen["body"] = trio.lowlevel.current_task() in bundle
    assert seen == {"child": True, "grandchild": False, "starting": True, "body": False}
    assert "not a task" not in bundle
