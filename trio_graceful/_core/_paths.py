"""Where each bundle sits in a Trio run: the per-run map of open bundles, and paths.

Each Trio run keeps, in a `RunVar`, which nursery belongs to which open
bundle and which bundles each task runs the body of. That is enough to find
the bundle around any task (`enclosing_bundle`) by walking up Trio's task
tree, and it costs two dictionary updates per bundle, nothing per child. A
bundle is known here only as a `Place`: its path, the task that opened it,
and the names its children go by.

Paths (``root/conn-1/requests``) exist for traces, logs and reports. They are
worked out only when something asks for one, and cached on the bundle:

* a bundle opened in the body of bundle ``root`` is ``root/name``;
* one opened by a task that runs inside ``root`` is ``root/<task>/name``;
* any other bundle is just ``name``.

A task's path is ``<bundle path>/<task name>``. Children of one bundle that
share a name and are alive at the same time are told apart as ``handler``,
``handler#2``, ``handler#3``... in the order they started. A bundle names its
children only once something asks for a path there: it then names the
children already running, in the order Trio created them, and from then on
each child as it starts, so that a name never goes to two live children and
never changes. A name is held only while its child is alive, so that a
server's connection bundle does not grow with every connection it served; a
later child may take a name again once its last holder has ended.

When a trace hook is added to a run that had none, every open bundle starts
listening to its children (`on_first_hook`), so that the ends of children
started before the hook are traced too.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Protocol

import attrs
import trio

from ._trace import on_first_hook


class Place(Protocol):
    """What paths need of a bundle."""

    @property
    def path(self) -> str:
        """The bundle's own path."""
        ...

    @property
    def parent_task(self) -> trio.lowlevel.Task:
        """The task that opened the bundle."""
        ...

    # Hooks for this module only, underscored as trio underscores
    # ``Nursery._add_exc``: not part of a bundle's public surface.

    def _child_name(self, task: trio.lowlevel.Task) -> str:
        """Return the name ``task``, a task in the bundle, goes by in paths."""
        ...

    def _watch_children(self) -> object:
        """Listen to the children's starts and ends from now on."""
        ...


@attrs.define(eq=False, slots=True)
class _OpenBundles:
    """The open bundles of one Trio run."""

    # The children's nursery of each open bundle.
    by_nursery: dict[trio.Nursery, Place] = attrs.field(
        factory=dict["trio.Nursery", Place]
    )
    # The bundles whose body each task runs, innermost last.
    by_body: dict[trio.lowlevel.Task, list[Place]] = attrs.field(
        factory=dict["trio.lowlevel.Task", "list[Place]"]
    )
    # Paths handed out, so that a task keeps its path in every event.
    task_paths: weakref.WeakKeyDictionary[trio.lowlevel.Task, str] = attrs.field(
        factory=weakref.WeakKeyDictionary["trio.lowlevel.Task", str]
    )

    def watch_all(self) -> None:
        """Make every open bundle listen to its children (a hook was added)."""
        for bundle in self.by_nursery.values():
            bundle._watch_children()  # pyright: ignore[reportPrivateUsage]


_open_bundles: trio.lowlevel.RunVar[_OpenBundles] = trio.lowlevel.RunVar(
    "trio_graceful open bundles"
)


def _registry() -> _OpenBundles:
    try:
        return _open_bundles.get()
    except LookupError:
        registry = _OpenBundles()
        _open_bundles.set(registry)
        on_first_hook(registry.watch_all)
        return registry


def register(bundle: Place, body: trio.lowlevel.Task, nursery: trio.Nursery) -> None:
    """Record a bundle that has just opened."""
    registry = _registry()
    registry.by_nursery[nursery] = bundle
    registry.by_body.setdefault(body, []).append(bundle)


def unregister(bundle: Place, body: trio.lowlevel.Task, nursery: trio.Nursery) -> None:
    """Forget a bundle whose block has exited."""
    registry = _registry()
    del registry.by_nursery[nursery]
    bodies = registry.by_body[body]
    # bundles opened by one task exit in reverse order
    assert bodies[-1] is bundle
    bodies.pop()
    if not bodies:
        del registry.by_body[body]


def _parent_nursery(task: trio.lowlevel.Task) -> trio.Nursery | None:
    # A child still starting under start() runs in a temporary nursery of the
    # caller's; it belongs where it is going.
    return task.eventual_parent_nursery or task.parent_nursery


def enclosing_bundle(task: trio.lowlevel.Task, *, bodies: bool = True) -> Place | None:
    """Return the innermost open bundle around ``task``, or None.

    That is the bundle whose body ``task`` runs, else the bundle whose child
    ``task`` is (or is about to be, under `Bundle.start`), else the same for
    the task that opened ``task``'s nursery, and so on up. With
    ``bodies=False`` the bundles whose body ``task`` itself runs are skipped:
    they are inside the task, not around it.
    """
    registry = _registry()
    while True:
        if bodies:
            opened = registry.by_body.get(task)
            if opened:
                return opened[-1]
        bodies = True  # every task further up: its bodies are around ``task``
        nursery = _parent_nursery(task)
        if nursery is None:
            return None
        bundle = registry.by_nursery.get(nursery)
        if bundle is not None:
            return bundle
        task = nursery.parent_task


def is_inside(task: trio.lowlevel.Task, nursery: trio.Nursery, stop: object) -> bool:
    """Tell whether ``task`` runs below ``nursery``, looking up as far as ``stop``."""
    while task is not stop:
        parent = _parent_nursery(task)
        if parent is None:
            return False
        if parent is nursery:
            return True
        task = parent.parent_task
    return False


def task_path(task: trio.lowlevel.Task, bundle: Place | None = None) -> str:
    """Return ``<bundle path>/<task name>`` for ``task``, the same every time.

    ``bundle`` is the bundle around ``task`` if the caller knows it.
    """
    registry = _registry()
    path = registry.task_paths.get(task)
    if path is not None:
        return path
    if bundle is None:
        bundle = enclosing_bundle(task, bodies=False)
    if bundle is None:
        return task.name
    name = bundle._child_name(task)  # pyright: ignore[reportPrivateUsage]
    path = registry.task_paths[task] = f"{bundle.path}/{name}"
    return path


def enclosing_bundle_path(task: trio.lowlevel.Task, *, bodies: bool = True) -> str:
    """Return the path of the innermost bundle around ``task``, or ``""``."""
    bundle = enclosing_bundle(task, bodies=bodies)
    return "" if bundle is None else bundle.path


def bundle_path(opener: trio.lowlevel.Task, name: str, parent: Place | None) -> str:
    """Return the path of a bundle called ``name`` that ``opener`` opened.

    ``parent`` is the bundle that was around ``opener`` (its own bodies
    included) when it opened the bundle.
    """
    if parent is None:
        return name
    if parent.parent_task is opener:  # nested directly in the parent's body
        return f"{parent.path}/{name}"
    return f"{task_path(opener)}/{name}"


def _creation_order(task: trio.lowlevel.Task) -> int:
    # Trio numbers its tasks as it creates them, and sorts by that number
    # itself; without it, namesakes are still told apart, in no set order.
    order: object = getattr(task, "_counter", 0)
    return order if isinstance(order, int) else 0


@attrs.define(eq=False, slots=True)
class TaskNames:
    """The names one bundle's live children go by in paths.

    ``_taken`` is ``{name: [highest number given, holders alive]}`` and
    ``_held`` the name of each live child that has one; both lose an entry as
    children end, so they are as large as the live children. Tasks further
    down (in a plain nursery below a child) are named here too, but hold no
    entry in ``_held``: their ends are not reported, so their names stay taken.
    """

    _taken: dict[str, list[int]] = attrs.field(factory=dict[str, "list[int]"])
    _held: dict[trio.lowlevel.Task, str] = attrs.field(
        factory=dict["trio.lowlevel.Task", str]
    )

    @classmethod
    def of_running(cls, children: Iterable[trio.lowlevel.Task]) -> TaskNames:
        """Name ``children``, already running, in the order they started."""
        names = cls()
        for child in sorted(children, key=_creation_order):
            names.name(child)
        return names

    def name(self, task: trio.lowlevel.Task, *, child: bool = True) -> str:
        """Return the name of ``task``, giving it one no live namesake has."""
        held = self._held.get(task)
        if held is not None:
            return held
        name = task.name
        entry = self._taken.get(name)
        if entry is None:
            self._taken[name] = [1, 1]
        else:
            entry[0] += 1
            entry[1] += 1
            name = f"{name}#{entry[0]}"
        if child:
            self._held[task] = name
        return name

    def release(self, task: trio.lowlevel.Task) -> None:
        """Give back the name of the child ``task``, which has ended."""
        if self._held.pop(task, None) is None:
            return
        entry = self._taken[task.name]
        entry[1] -= 1
        if entry[1] == 0:
            del self._taken[task.name]
