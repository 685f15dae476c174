"""Random trees of nested bundles against an exact model of their timing.

Every node is a child of some bundle. Leaves finish, loop forever, clean up
under a shield, or raise; inner nodes run a nested bundle of their own and
cancel it with their own grace. The root bundle is cancelled at a random time
with a random grace. An independent model (plain arithmetic over the rules in
the docs) predicts, for every node, when it ends and how; for every bundle
whose cancel() returned, its report; and the exception that leaves the root.
The run under the mock clock must match to the exact float.

Every time in a tree is an integer plus a fraction unique to the node that
owns it (node id / 1024), so two independent events never coincide: the
model need not guess how Trio orders simultaneous wakeups.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import attrs
import trio
import trio.testing
from hypothesis import event, given, settings, strategies as st

from tests.support.exception_shapes import shape
from trio_graceful import ChildOutcome, open_bundle

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

FRACTION = 1024
HANG = 10_000.0  # virtual seconds; no tree runs this long


class NodeError(Exception):
    pass


@attrs.frozen
class Finish:
    after: float


@attrs.frozen
class Forever:
    pass


@attrs.frozen
class Shielded:
    cleanup: float


@attrs.frozen
class Raise:
    after: float


@attrs.frozen
class Nested:
    children: tuple[Node, ...]
    cancel_at: float
    grace: float


Kind = Finish | Forever | Shielded | Raise | Nested


@attrs.frozen
class Node:
    id: int
    kind: Kind


# -- strategies ---------------------------------------------------------------


def _tree(draw: st.DrawFn, depth: int, ids: list[int]) -> Node:
    ids.append(len(ids) + 1)
    node_id = ids[-1]
    frac = node_id / FRACTION
    choices = ["finish", "forever", "shielded", "raise"]
    if depth < 4:
        choices += ["nested"] * (4 - depth)  # deep trees are the interesting ones
    kind_name = draw(st.sampled_from(choices))
    kind: Kind
    if kind_name == "finish":
        kind = Finish(draw(st.integers(0, 25)) + frac)
    elif kind_name == "forever":
        kind = Forever()
    elif kind_name == "shielded":
        kind = Shielded(float(draw(st.integers(1, 6))))
    elif kind_name == "raise":
        kind = Raise(draw(st.integers(0, 40)) + frac)
    else:
        n = draw(st.integers(0, 5))
        children = tuple(_tree(draw, depth + 1, ids) for _ in range(n))
        grace = draw(st.one_of(st.integers(0, 15).map(float), st.just(math.inf)))
        kind = Nested(children, draw(st.integers(0, 20)) + frac, grace)
    return Node(node_id, kind)


@st.composite
def trees(
    draw: st.DrawFn, *, allow_raise: bool
) -> tuple[tuple[Node, ...], float, float]:
    ids: list[int] = []
    n = draw(st.integers(1, 5))
    children = tuple(_tree(draw, 1, ids) for _ in range(n))
    if not allow_raise:
        children = tuple(_without_raise(c) for c in children)
    cancel_at = float(draw(st.integers(0, 20)))
    # A finite root grace: with math.inf, a child that loops forever would
    # (rightly) keep the root waiting forever.
    grace = float(draw(st.integers(0, 15)))
    return children, cancel_at, grace


def _without_raise(node: Node) -> Node:
    kind = node.kind
    if isinstance(kind, Raise):
        return Node(node.id, Finish(kind.after))
    if isinstance(kind, Nested):
        return Node(
            node.id,
            Nested(
                tuple(_without_raise(c) for c in kind.children),
                kind.cancel_at,
                kind.grace,
            ),
        )
    return node


# -- the model ----------------------------------------------------------------


@attrs.frozen
class Predicted:
    end: float  # when the node's task ends
    error: Any  # shape() of what it raises, None if nothing but Cancelled
    outcome: ChildOutcome  # as its bundle's report should say
    reports: dict[int, dict[str, tuple[ChildOutcome, float]]]  # nested bundles


def model_bundle(
    children: tuple[Node, ...],
    opened: float,
    cancel_at: float,
    grace: float,
    k_parent: float,
) -> tuple[float, list[Predicted], float, float | None]:
    """Predict a bundle opened at ``opened`` whose body cancels at ``cancel_at``.

    Returns (body_end, predictions per child, hard-cancel time K, cancel start
    or None if cancel() was never called).
    """
    called = cancel_at < k_parent
    deadline = cancel_at + grace if called else math.inf
    k = min(deadline, k_parent)
    preds = [model_child(c, opened, k) for c in children]
    errors = [p.end for p in preds if p.error is not None]
    if errors and min(errors) < k:
        k = min(errors)
        preds = [model_child(c, opened, k) for c in children]
    # the body: sleeps until cancel_at, then waits in cancel(); it is cancelled
    # at min(k_parent, first error)
    first_error = min((p.end for p in preds if p.error is not None), default=math.inf)
    body_cancelled = min(k_parent, first_error)
    if not called:
        body_end = body_cancelled
    else:
        done = max([cancel_at] + [p.end for p in preds])
        body_end = min(done, body_cancelled)
    return body_end, preds, k, cancel_at if called else None


def model_child(node: Node, start: float, k: float) -> Predicted:
    kind = node.kind
    if isinstance(kind, Finish):
        end = start + kind.after
        if end < k:
            return Predicted(end, None, ChildOutcome.FINISHED, {})
        return Predicted(k, None, ChildOutcome.CANCELLED, {})
    if isinstance(kind, Forever):
        return Predicted(k, None, ChildOutcome.CANCELLED, {})
    if isinstance(kind, Shielded):
        return Predicted(k + kind.cleanup, None, ChildOutcome.CANCELLED, {})
    if isinstance(kind, Raise):
        at = start + kind.after
        if at <= k:  # equality only when this very raise is what set k
            return Predicted(at, "NodeError", ChildOutcome.RAISED, {})
        return Predicted(k, None, ChildOutcome.CANCELLED, {})
    body_end, preds, _, cancel_start = model_bundle(
        kind.children, start, start + kind.cancel_at, kind.grace, k
    )
    end = max([body_end] + [p.end for p in preds])
    leaves = [p.error for p in preds if p.error is not None]
    reports = {}
    for p in preds:
        reports.update(p.reports)
    body_returned = cancel_start is not None and body_end < min(
        k, min((p.end for p in preds if p.error is not None), default=math.inf)
    )
    if body_returned:
        reports[node.id] = _report(kind.children, preds, cancel_start)
    if leaves:
        error = (
            "ExceptionGroup",
            "Exceptions from Trio nursery",
            sorted(leaves, key=repr),
        )
        return Predicted(end, error, ChildOutcome.RAISED, reports)
    outcome = ChildOutcome.FINISHED if body_returned else ChildOutcome.CANCELLED
    return Predicted(end, None, outcome, reports)


def _report(
    children: tuple[Node, ...], preds: list[Predicted], cancel_start: float | None
) -> dict[str, tuple[ChildOutcome, float]]:
    assert cancel_start is not None
    return {
        f"n{c.id}": (p.outcome, p.end)
        for c, p in zip(children, preds, strict=True)
        if p.end >= cancel_start
    }


# -- running a tree for real --------------------------------------------------


@attrs.define
class Recorder:
    ends: dict[int, float] = attrs.field(factory=dict[int, float])
    reports: dict[int, dict[str, tuple[ChildOutcome, float]]] = attrs.field(
        factory=dict
    )
    # nodes (without shields below them) that ran past a given deadline
    late: list[int] = attrs.field(factory=list[int])


async def run_node(node: Node, rec: Recorder) -> None:
    kind = node.kind
    try:
        if isinstance(kind, Finish):
            await trio.sleep(kind.after)
        elif isinstance(kind, Forever):
            await trio.sleep_forever()
        elif isinstance(kind, Shielded):
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await trio.sleep(kind.cleanup)
        elif isinstance(kind, Raise):
            await trio.sleep(kind.after)
            raise NodeError(node.id)
        else:
            async with open_bundle(name=f"b{node.id}") as bundle:
                for child in kind.children:
                    bundle.start_soon(run_node, child, rec, name=f"n{child.id}")
                await trio.sleep(kind.cancel_at)
                report = await bundle.cancel(grace=kind.grace)
                rec.reports[node.id] = {
                    c.name: (c.outcome, c.ended_at) for c in report.children
                }
                assert len(report.children) == len(rec.reports[node.id])
    finally:
        rec.ends[node.id] = trio.current_time()


def run_tree(
    children: tuple[Node, ...], cancel_at: float, grace: float
) -> tuple[
    Recorder, BaseException | None, float, dict[str, tuple[ChildOutcome, float]] | None
]:
    rec = Recorder()
    root_report: list[dict[str, tuple[ChildOutcome, float]]] = []

    async def main() -> None:
        # A broken bundle could hang forever; fail in virtual time instead.
        with trio.fail_after(HANG):
            await tree_body()

    async def tree_body() -> None:
        async with open_bundle(name="root") as root:
            for child in children:
                root.start_soon(run_node, child, rec, name=f"n{child.id}")
            await trio.sleep(cancel_at)
            report = await root.cancel(grace=grace)
            root_report.append(
                {c.name: (c.outcome, c.ended_at) for c in report.children}
            )
            assert len(report.children) == len(root_report[0])

    error: BaseException | None = None
    clock = trio.testing.MockClock(autojump_threshold=0)
    try:
        trio.run(main, clock=clock)
    except BaseExceptionGroup as exc:
        error = exc
    return rec, error, clock.current_time(), root_report[0] if root_report else None


def _collect_ends(
    node: Node, start: float, k: float, out: dict[int, float]
) -> Predicted:
    """Like model_child, but also fills ``out`` with every descendant's end."""
    pred = model_child(node, start, k)
    out[node.id] = pred.end
    kind = node.kind
    if isinstance(kind, Nested):
        _, _, inner_k, _ = model_bundle(
            kind.children, start, start + kind.cancel_at, kind.grace, k
        )
        for child in kind.children:
            _collect_ends(child, start, inner_k, out)
    return pred


def _has_shield(node: Node) -> bool:
    kind = node.kind
    if isinstance(kind, Shielded):
        return True
    if isinstance(kind, Nested):
        return any(_has_shield(c) for c in kind.children)
    return False


def _all_nodes(children: tuple[Node, ...]):
    for c in children:
        yield c
        if isinstance(c.kind, Nested):
            yield from _all_nodes(c.kind.children)


def check_tree(children: tuple[Node, ...], cancel_at: float, grace: float) -> None:
    body_end, preds, root_k, _ = model_bundle(children, 0.0, cancel_at, grace, math.inf)
    expected_ends: dict[int, float] = {}
    for child in children:
        _collect_ends(child, 0.0, root_k, expected_ends)
    expected_end = max([body_end] + [p.end for p in preds])
    leaves = [p.error for p in preds if p.error is not None]

    rec, error, finished, root_report = run_tree(children, cancel_at, grace)

    # every node ends exactly when the model says
    assert rec.ends == expected_ends
    assert finished == expected_end
    if leaves:
        assert error is not None
        got = shape(error)
        assert got[:2] == ("ExceptionGroup", "Exceptions from Trio nursery")
        assert sorted(got[2], key=repr) == sorted(leaves, key=repr)
        assert root_report is None
        return
    assert error is None
    # the root's cancel() returned at the last child's end, or at the
    # deadline plus shielded cleanup, and reported every child once
    assert root_report is not None
    assert finished == max([cancel_at] + [p.end for p in preds])
    assert root_report == _report(children, preds, cancel_at)
    # nested bundles whose cancel() returned reported every child correctly
    expected_reports: dict[int, Any] = {}
    for p in preds:
        expected_reports.update(p.reports)
    assert rec.reports == expected_reports
    # nothing outside shielded code outlives the root's hard deadline
    deadline = cancel_at + grace
    for node in _all_nodes(children):
        if not _has_shield(node):
            assert rec.ends[node.id] <= deadline


def _describe(tree: tuple[tuple[Node, ...], float, float]) -> None:
    nodes = list(_all_nodes(tree[0]))
    event(f"nodes: {min(len(nodes) // 10 * 10, 50)}+")
    depth = max((_depth(n) for n in nodes), default=0)
    event(f"depth: {depth}")


def _depth(node: Node) -> int:
    kind = node.kind
    if isinstance(kind, Nested):
        return 1 + max((_depth(c) for c in kind.children), default=0)
    return 0


@settings(max_examples=400)
@given(trees(allow_raise=False))
def test_random_trees_without_errors(tree):
    _describe(tree)
    check_tree(*tree)


@settings(max_examples=400)
@given(trees(allow_raise=True))
def test_random_trees_with_errors(tree):
    _describe(tree)
    check_tree(*tree)


def test_model_example_nested_outer_deadline_wins():
    # the essay's nested example: outer grace 10, inner grace 20
    worker = Node(
        1, Nested((Node(2, Forever()), Node(3, Shielded(0.0))), 1 + 1 / FRACTION, 20.0)
    )
    children = (worker,)
    _, preds, k, _ = model_bundle(children, 0.0, 0.0, 10.0, math.inf)
    assert k == 10
    assert preds[0].end == 10
    check_tree(children, 0.0, 10.0)
