"""Group commits: the endings of jobs that end together, in one transaction.

A job's ending (with the claim of the jobs that take its slot) waits for
the store's turn, as every call does. Endings that arrive while a call is
in flight, most often the commit of the endings before them, join one
*group*, and the group is written in one transaction (`_holding.finish_group`)
as soon as the store is free: one commit, one flush to disk, for the whole
group. Once a worker of the store runs several jobs (`GroupCommits.gather`),
the ending that takes the store's turn lets the scheduler run while each
pass brings more endings (those of jobs that ended in the same instant),
then writes the group: no timer, and a lone ending waits one pass.

The first ending of a group takes the store's turn for the group; the
others wait for the group's commit. Each gets its own outcome, and only
once the transaction has committed (or failed): nothing is reported before
it is durable. An ending cancelled before its group begins is taken out of
it (and, if it was the one waiting for the turn, another takes its place);
once the group's transaction has begun, its members wait for its end,
as a call running in a thread is waited for.
"""

from __future__ import annotations

import functools

import attrs
import outcome
import trio

from . import _holding
from ._holding import GroupedEnding, Settled
from ._serial import SerialCalls
from ._sql import Database


@attrs.define(eq=False)
class _Group:
    members: list[GroupedEnding] = attrs.field(factory=list[GroupedEnding])
    leader: GroupedEnding | None = None
    """The member waiting for the store's turn for the group."""
    begun: bool = False
    results: list[outcome.Outcome[Settled]] = attrs.field(
        factory=list[outcome.Outcome[Settled]]
    )
    done: trio.Event = attrs.field(factory=trio.Event)
    _changed: trio.Event = attrs.field(factory=trio.Event)

    def position(self, member: GroupedEnding) -> int:
        return next(k for k, m in enumerate(self.members) if m is member)

    def leave(self, member: GroupedEnding) -> None:
        """Take ``member``, cancelled, out of the group, not begun yet."""
        del self.members[self.position(member)]
        if self.leader is member:
            self.leader = None
            self._wake()  # another member waits for the turn now

    def begin(self) -> None:
        self.begun = True
        self._wake()  # the others wait for the outcome now

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()


async def _gather(group: _Group) -> None:
    """Let the endings already on their way join ``group``: no timer, no wait.

    Jobs that end together (those one group claimed end within a few
    passes of the scheduler) join while each pass brings one more; a
    lone ending begins after one pass.
    """
    while True:
        size = len(group.members)
        await trio.lowlevel.cancel_shielded_checkpoint()
        if len(group.members) <= size:
            return


@attrs.frozen
class StoreStatistics:
    """How the endings of a store's jobs were committed: `JobStore.statistics`."""

    groups: int
    """Transactions that wrote endings."""
    endings: int
    """Endings written by them (refused ones included)."""
    largest_group: int
    """The most endings one transaction wrote."""


@attrs.define(eq=False)
class GroupCommits:
    """Gathers the endings of a store into groups, and writes each at once."""

    _db: Database
    _calls: SerialCalls
    _offload: bool
    gather: bool = attrs.field(default=False, init=False)
    """Whether a group waits for the endings on their way (`_gather`): only
    once a worker of the store runs several jobs, whose endings can join."""
    _open: _Group | None = attrs.field(default=None, init=False)
    _groups: int = attrs.field(default=0, init=False)
    _endings: int = attrs.field(default=0, init=False)
    _largest: int = attrs.field(default=0, init=False)

    @property
    def waiting(self) -> int:
        """Endings waiting for their group's transaction to begin. Not a checkpoint."""
        return 0 if self._open is None else len(self._open.members)

    def statistics(self) -> StoreStatistics:
        """A `StoreStatistics` snapshot. Not a checkpoint."""
        return StoreStatistics(
            groups=self._groups, endings=self._endings, largest_group=self._largest
        )

    async def write(self, member: GroupedEnding) -> Settled:
        """Write ``member`` with the group it joins; return its outcome's value.

        Cancellable until the group's transaction begins, and then not: its
        outcome is then what the transaction gives it. This is a checkpoint.
        """
        group = self._open
        if group is None:
            group = self._open = _Group()
        group.members.append(member)
        try:
            while not group.begun:
                if group.leader is None:
                    group.leader = member
                if group.leader is member:
                    await self._calls.acquire()
                    try:
                        if self.gather:
                            await _gather(group)
                        await self._run(group)
                    finally:
                        self._calls.release()
                else:
                    await group.wait_changed()
        except BaseException:
            if not group.begun:
                group.leave(member)
                raise
            # Cancelled as the group began: its outcome is already decided.
        with trio.CancelScope(shield=True):
            await group.done.wait()
        return group.results[group.position(member)].unwrap()

    async def _run(self, group: _Group) -> None:
        group.begin()
        if self._open is group:
            self._open = None  # endings from now on make the next group
        members = tuple(group.members)
        call = functools.partial(_holding.finish_group, self._db, members)
        try:
            # Begun: the group's outcome is its transaction's, cancelled or not.
            with trio.CancelScope(shield=True):
                group.results = await SerialCalls.run_held(call, offload=self._offload)
        except BaseException as exc:
            group.results = [outcome.Error(exc) for _ in members]
            raise
        finally:
            group.done.set()
        self._groups += 1
        self._endings += len(members)
        self._largest = max(self._largest, len(members))
