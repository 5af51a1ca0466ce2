"""The fast guard of a replayed call: what a full guard walk (``recording.Watch``) read, checked
again in one pass over flat lists of objects and integer stamps.

A ``Watch`` walks everything a compiled function reaches on every call (its arguments, closure
and globals, the modules, optimizers, functions and containers among them; about 150 objects
for a GPT training step) and builds a key that is hashed and looked up.  Most of what it reads
cannot have changed since the previous call, and the eager core says so cheaply: the guard
epoch (``fusegrad.autograd.graph_base.epoch``) moves on every change to what the walk reads of
a module (attributes, ``training``, parameters, buffers, submodules) and of a tensor a guard
watches (its array, dtype, ``requires_grad``: a guard registers the tensors its walk read).
What moves no stamp is checked here directly, by identity:

* grad and inference mode, the autocast state, and the arguments: tensors by shape, dtype,
  array type and ``requires_grad``, Python scalars by type and value, containers item by item,
  any other object by identity (what the walk read of it is in the lists below);
* the closure cells and the globals the function's code names (and those of the functions it
  reaches), each holding the same object, or still absent; each function its code object;
* small containers reached from there: the same items (a larger one: still too large);
* each optimizer: the same parameter groups, each group's options part of the key (compared
  by value, as the walk keys them), its parameters, and per parameter the same state dict
  holding the same entries.

``FastGuard.check`` returns the call's tensor arguments when every check holds and the epoch
has not moved -- then the full walk would build the key this guard was made from, so the
entry it was made for is the one the key finds -- and None otherwise, when the caller walks
as before (and makes a new ``FastGuard`` if that walk finds a replayable entry).  A fast
guard is never more lenient than the walk: any difference it cannot rule out sends the call
to the walk.  See docs/ARCHITECTURE.md, "Whole steps: `compile(fn)`".
"""

from __future__ import annotations

import itertools
from operator import attrgetter, getitem, is_, ne
from typing import Any

from fusegrad.autograd import grad_mode
from fusegrad.autograd.graph_base import epoch as _epoch
from fusegrad.tensor import Tensor

from . import recording as _recording
from .recording import _SCALARS, MISSING, Watch, autocast_state, group_options

_contents = attrgetter("cell_contents")
_code = attrgetter("__code__")
_chain = itertools.chain.from_iterable
_ZEROS = itertools.repeat(0)  # (endless: ``map`` stops at the shorter input)


class _Other:
    """Stands for an argument that is neither a tensor, a Python scalar nor a container in a
    fast guard's argument key; the object itself is compared by identity."""

    __slots__ = ()


_OTHER = _Other()
_NO_KEYWORDS = (tuple, ())  # (``describe_arguments`` of no keyword arguments)


def describe_arguments(obj: Any, tensors: list, others: list) -> Any:
    """The arguments' part of the key as ``Watch.describe`` makes it, without walking the
    objects that are not tensors, scalars or containers (``others`` gets them, in order;
    ``tensors`` gets the tensor arguments, in order)."""
    if isinstance(obj, Tensor):
        arr = obj._data
        tensors.append(obj)
        return (
            "T",
            arr.shape,
            obj._dtype,
            type(arr),
            obj._requires_grad or obj.grad_fn is not None,
        )
    if isinstance(obj, _SCALARS):
        return (type(obj), obj)
    if isinstance(obj, (tuple, list)):
        return (type(obj), tuple([describe_arguments(o, tensors, others) for o in obj]))
    if isinstance(obj, dict):
        return (dict, tuple([(k, describe_arguments(v, tensors, others)) for k, v in obj.items()]))
    others.append(obj)
    return _OTHER


class FastGuard:
    """A guard key's checks in one pass (see the module docstring), made from the ``Watch`` of
    a call whose key found ``entry`` (with ``sizes``: a step over symbols, replayed with that
    size vector) in tables at ``generation`` (their changes that could give the key another
    entry: the caller retires the guard when it moves)."""

    __slots__ = (
        "arguments",
        "autocast",
        "cells",
        "contents",
        "entry",
        "epoch",
        "function",
        "functions",
        "function_codes",
        "generation",
        "grad_mode",
        "large",
        "lengths",
        "name_dicts",
        "name_keys",
        "name_values",
        "optimizers",
        "other_arguments",
        "sequences",
        "sequence_items",
        "sizes",
        "mappings",
        "mapping_keys",
        "mapping_values",
    )

    def __init__(
        self,
        watch: Watch,
        args: tuple,
        kwargs: dict,
        entry: Any,
        generation: Any,
        sizes: tuple | None = None,
    ) -> None:
        # changes to the tensors the walk read move the epoch from now on (none can have
        # happened since the walk: no user code ran in between)
        _epoch.watch(watch.read_tensors)
        self.entry = entry
        self.generation = generation
        self.sizes = sizes  # (a step over symbols: the size vector of these arguments' shapes)
        self.function = watch.callee
        self.epoch = watch.epoch
        self.grad_mode = (watch.key_parts[0], watch.key_parts[1])
        self.autocast = watch.key_parts[-1][1]
        tensors: list = []
        others: list = []
        self.arguments = (
            describe_arguments(args, tensors, others),
            describe_arguments(tuple(sorted(kwargs.items())), tensors, others),
        )
        self.other_arguments = tuple(others)
        self.cells = tuple(cell for cell, _ in watch.cells)
        self.contents = tuple(content for _, content in watch.cells)
        self.functions = tuple(f for f, _ in watch.codes)
        self.function_codes = tuple(c for _, c in watch.codes)
        self.name_dicts = tuple(g for g, _, _ in watch.names)
        self.name_keys = tuple(n for _, n, _ in watch.names)
        self.name_values = tuple(v for _, _, v in watch.names)
        sequences, items, mappings, keys, values, large = [], [], [], [], [], []
        lengths: list = []
        for obj, snapshot in watch.containers:
            if snapshot is None:
                large.append(obj)
            elif type(obj) is dict:
                mappings.append(obj)
                keys.extend(snapshot[0])
                values.extend(snapshot[1])
            else:
                sequences.append(obj)
                items.extend(snapshot)
                lengths.append(len(snapshot))
        self.sequences = tuple(sequences)
        self.sequence_items = tuple(items)
        self.mappings = tuple(mappings)
        self.mapping_keys = tuple(keys)
        self.mapping_values = tuple(values)
        lengths.extend(
            len(snapshot[0])
            for obj, snapshot in watch.containers
            if type(obj) is dict and snapshot is not None
        )
        self.lengths = tuple(lengths)
        self.large = tuple(large)
        self.optimizers = tuple(_OptimizerCheck(opt) for opt in watch.optimizers)

    @staticmethod
    def supported(watch: Watch) -> bool:
        """Whether a fast guard can stand for ``watch``: every module it read keeps its
        parameters, buffers and submodules where changes move the epoch, its functions'
        globals are dicts, and every dict whose items it keyed is a plain one (a subclass's
        items are not what the snapshot holds)."""
        if watch.unstamped or any(type(g) is not dict for g, _, _ in watch.names):
            return False
        return all(
            type(obj) is dict or not isinstance(obj, dict)
            for obj, snapshot in watch.containers
            if snapshot is not None
        )

    def check(self, fn: Any, args: tuple, kwargs: dict) -> list | None:
        """The tensor arguments of the call ``fn(*args, **kwargs)`` when the full guard would
        find this guard's entry; None when that is not certain."""
        if _epoch.value != self.epoch or getattr(fn, "__func__", fn) is not self.function:
            return None
        state = grad_mode._state
        if (state.enabled, state.inference) != self.grad_mode:
            return None
        if autocast_state() != self.autocast:
            return None
        try:
            return self._check(args, kwargs)
        except Exception:  # noqa: BLE001 - whatever a check raises, the full walk decides
            return None

    def _check(self, args: tuple, kwargs: dict) -> list | None:
        tensors: list = []
        others: list = []
        described = (
            describe_arguments(args, tensors, others),
            describe_arguments(tuple(sorted(kwargs.items())), tensors, others)
            if kwargs
            else _NO_KEYWORDS,
        )
        if described != self.arguments or len(others) != len(self.other_arguments):
            return None
        if others and not all(map(is_, others, self.other_arguments)):
            return None
        if self.cells and not all(map(is_, map(_contents, self.cells), self.contents)):
            return None
        if not all(map(is_, map(_code, self.functions), self.function_codes)):
            return None
        got = map(dict.get, self.name_dicts, self.name_keys, itertools.repeat(MISSING))
        if not all(map(is_, got, self.name_values)):
            return None
        if self.lengths and tuple(map(len, (*self.sequences, *self.mappings))) != self.lengths:
            return None
        if self.sequences and not all(map(is_, _chain(self.sequences), self.sequence_items)):
            return None
        if self.mappings:
            if not all(map(is_, _chain(self.mappings), self.mapping_keys)):
                return None
            if not all(map(is_, _chain(map(dict.values, self.mappings)), self.mapping_values)):
                return None
        limit = _recording.CONTAINER_ITEMS
        for obj in self.large:
            if len(obj) <= limit:
                return None
        for opt in self.optimizers:
            if not opt.check():
                return None
        return tensors


class Guards:
    """The fast guards of one compiled function or module (``step``, ``module``): those of the
    ``LIMIT`` keys replayed latest (a last batch of another size, train and eval calls), latest
    first.  A guard stands while the tables it was made from (the front end's ``Recordings``
    and its steps over symbols, ``dynamics``) have not changed in a way that could give its
    key another entry."""

    LIMIT = 4

    __slots__ = ("kept",)

    def __init__(self) -> None:
        self.kept: list[FastGuard] = []

    def __len__(self) -> int:
        return len(self.kept)

    @staticmethod
    def generation(entries: Any, dynamics: list, dynamic: bool) -> Any:
        """For an entry found by its key: no entry replaced or dropped and no step over
        symbols merged since (a key merged into one replays it); for a step over symbols
        (found for sizes no key has, or serving a merged key): also no key recorded since."""
        if dynamic:
            return (entries.generation, entries.insertions, len(dynamics))
        return (entries.generation, len(dynamics))

    def find(
        self, fn: Any, args: tuple, kwargs: dict, entries: Any, dynamics: list
    ) -> tuple[FastGuard, list] | None:
        """The guard that passes for this call, and the call's tensor arguments."""
        for fast in self.kept:
            if fast.generation == self.generation(entries, dynamics, fast.sizes is not None):
                tensors = fast.check(fn, args, kwargs)
                if tensors is not None:
                    return fast, tensors
        return None

    def keep(
        self,
        watch: Watch,
        args: tuple,
        kwargs: dict,
        entry: Any,
        entries: Any,
        dynamics: list,
        sizes: tuple | None = None,
    ) -> None:
        """Keep a guard for ``entry``, which ``watch``'s key found (with ``sizes``: a step
        over symbols, for these sizes)."""
        if not FastGuard.supported(watch):
            return
        generation = self.generation(entries, dynamics, sizes is not None)
        fast = FastGuard(watch, args, kwargs, entry, generation, sizes)
        kept = [
            g
            for g in self.kept
            if g.generation == self.generation(entries, dynamics, g.sizes is not None)
            and (g.entry is not entry or g.sizes != sizes)
        ]
        self.kept = [fast, *kept[: self.LIMIT - 1]]


class _OptimizerCheck:
    """What the walk read of one optimizer (``Watch.root``): its parameter groups (each by
    identity and its options part of the key), their parameters by identity, and per
    parameter its state dict and the entries in it by identity (an entry that is a Python
    number replaced by an equal one fails the check: the walk then decides).

    Below the groups, every identity is one *probe* -- a container, a key (an index for a
    list) and the object found there -- checked in one pass, in an order where a probe only
    reads a container an earlier probe (or the groups' check) found unchanged; the sizes of
    those containers, the state dicts found for the parameters and the order of their
    entries are checked after."""

    __slots__ = (
        "groups",
        "live",
        "options",
        "optimizer",
        "params",
        "probe_containers",
        "probe_expected",
        "probe_keys",
        "sized",
        "sizes",
        "state_keys",
        "states",
    )

    def __init__(self, opt: Any) -> None:
        self.optimizer = opt
        self.groups = tuple(opt.param_groups)
        self.options = tuple(_GroupOptions(g) for g in self.groups)
        param_lists = [g["params"] for g in self.groups]
        self.params = tuple(_chain(param_lists))
        get = opt.state.get
        self.states = tuple(get(p) for p in self.params)
        self.live = tuple(s for s in self.states if s)
        containers: list = []
        keys: list = []
        expected: list = []
        for group, params in zip(self.groups, param_lists):
            containers.append(group)
            keys.append("params")
            expected.append(params)
            containers.extend(itertools.repeat(params, len(params)))
            keys.extend(range(len(params)))
            expected.extend(params)
        for state in self.live:
            containers.extend(itertools.repeat(state, len(state)))
            keys.extend(state)
            expected.extend(state.values())
        self.probe_containers = tuple(containers)
        self.probe_keys = tuple(keys)
        self.probe_expected = tuple(expected)
        self.sized = (*param_lists, *self.live)
        self.sizes = tuple(map(len, self.sized))
        self.state_keys = tuple(_chain(self.live))

    def check(self) -> bool:
        opt = self.optimizer
        groups = opt.param_groups
        if len(groups) != len(self.groups) or not all(map(is_, groups, self.groups)):
            return False
        for group, options in zip(groups, self.options):
            if not options.check(group):
                return False
        found = map(getitem, self.probe_containers, self.probe_keys)
        if not all(map(is_, found, self.probe_expected)):
            return False
        if tuple(map(len, self.sized)) != self.sizes:
            return False
        if not all(map(is_, map(opt.state.get, self.params), self.states)):
            return False
        # (names: compared by value; none to compare where no parameter has state yet)
        return not self.live or tuple(_chain(self.live)) == self.state_keys


class _GroupOptions:
    """A parameter group's options part of the key (``recording.group_options``), checked
    without rebuilding it: the same option names, and every option but the runtime ones
    (``recording._RUNTIME_OPTIONS``: not keyed) the same object -- or, when one was assigned
    again, of the same type and equal where keyed (those keyed by "is it zero" only in
    that)."""

    __slots__ = (
        "keyed",
        "keyed_values",
        "keys",
        "static",
        "static_values",
        "types",
        "zero",
        "zero_values",
    )

    def __init__(self, group: dict) -> None:
        part = dict(group_options(group))
        self.keys = tuple(group)
        self.static = tuple(k for k in group if k not in _recording._RUNTIME_OPTIONS)
        self.static_values = tuple(map(group.__getitem__, self.static))
        self.types = tuple(map(type, group.values()))
        self.zero = tuple(k for k in part if k in _recording._ZERO_OR_NOT)
        self.zero_values = tuple(part[k] for k in self.zero)
        self.keyed = tuple(k for k in part if k not in _recording._ZERO_OR_NOT)
        self.keyed_values = tuple(part[k] for k in self.keyed)

    def check(self, group: dict) -> bool:
        if tuple(group) != self.keys:
            return False
        if all(map(is_, map(group.__getitem__, self.static), self.static_values)):
            return True
        if tuple(map(type, group.values())) != self.types:
            return False
        if tuple(map(group.__getitem__, self.keyed)) != self.keyed_values:
            return False
        zero = self.zero
        return not zero or tuple(map(ne, map(group.__getitem__, zero), _ZEROS)) == self.zero_values
