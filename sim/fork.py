"""Copying a simulated engine: an independent engine in the same state, its constants shared.

    clone = fork_engine(engine, shared=(models, *models.values()))

The copy is generic: it never names an engine field. It walks the engine's attributes (its
`__dict__` or `__slots__`) and copies every mutable value it reaches once, through a memo, so a
request that sits in several structures at once (the waiting heap, the finish heap, the decode
map, the current window's arrival list) stays one object in the copy, as it is one object in the
original. What is never written during an episode is shared by reference, not copied:

- immutable values (numbers, strings, None, tuples of those) and frozen dataclasses (the
  profile, its tiers and fits, `Arrival`, `ResourceSample`);
- the objects named in `shared` (the step-time models and the dict that caches them per profile);
- slots a class names in its `__fork_shared__` (values it never writes into once made, e.g. a
  request's last handed-out snapshot record; the slot itself may be rebound, the object is not
  changed).

numpy arrays (the compiled engine's state, sim/array_engine.py) are copied; numpy Generators are
copied with their bit generator's state, so the copy draws the numbers the
original would have drawn. Renaming or adding engine fields needs no change here; a field holding
a new mutable type (a deque, say) is refused with TypeError rather than shared by mistake.

Copies are built by per-class functions generated from the class's attribute names the first time
a class is met (a slotted request has ~20 attributes and a mid-episode engine holds ~100-300 of
them; a generic getattr/setattr loop was ~3x slower).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

_ATOMIC: frozenset[type] = frozenset({int, float, bool, str, bytes, type(None), complex, range})

_CopyFn = Callable[[Any, Callable[[Any], Any], dict[int, Any]], Any]
_CLASS_COPIERS: dict[type, _CopyFn] = {}


def _attribute_names(cls: type) -> tuple[list[str], bool]:
    """(attribute names declared in __slots__ along the MRO, whether instances also have a __dict__)."""
    names: list[str] = []
    has_dict = False
    for klass in cls.__mro__:
        if klass is object:
            continue
        slots = klass.__dict__.get("__slots__")
        if slots is None:
            has_dict = True
            continue
        for s in (slots,) if isinstance(slots, str) else slots:
            if s == "__dict__":
                has_dict = True
            elif s != "__weakref__" and s not in names:
                names.append(s)
    return names, has_dict


def _class_copier(cls: type) -> _CopyFn:
    """A function copying one instance of `cls`: each attribute as is when atomic, else through `copy`."""
    names, has_dict = _attribute_names(cls)
    direct = [n for n in names if n.isidentifier() and not n.startswith("__")]
    odd = [n for n in names if n not in direct]  # name-mangled slots: through getattr
    shared = _shared_names(cls)
    lines = ["def copy_instance(o, copy, memo, ATOMIC=ATOMIC, type=type, new=new, cls=cls):", "    n = new(cls)", "    memo[id(o)] = n", "    try:", "        pass"]
    for name in direct:
        if name in shared:
            lines.append(f"        n.{name} = o.{name}")
        else:
            lines.append(f"        v = o.{name}; n.{name} = v if type(v) in ATOMIC else copy(v)")
    lines += ["    except AttributeError:", "        slow(o, n, copy, DIRECT)"]
    if odd:
        lines.append("    slow(o, n, copy, ODD)")
    if has_dict:
        lines.append("    n.__dict__.update({k: v if type(v) in ATOMIC else copy(v) for k, v in o.__dict__.items()})")
    lines.append("    return n")
    # the constants are bound as defaults (locals) of the generated function: faster than globals
    env: dict[str, Any] = {"new": object.__new__, "cls": cls, "ATOMIC": _ATOMIC, "ODD": odd, "DIRECT": direct,
                           "slow": _copy_named}
    exec(compile("\n".join(lines), f"<fork copier for {cls.__qualname__}>", "exec"), env)  # noqa: S102
    return env["copy_instance"]


def _shared_names(cls: type) -> frozenset[str]:
    """Slots a class declares read-only once set (`__fork_shared__` along the MRO): referenced, not copied."""
    out: set[str] = set()
    for klass in cls.__mro__:
        out.update(klass.__dict__.get("__fork_shared__", ()))
    return frozenset(out)


def _copy_named(o: Any, n: Any, copy: Callable[[Any], Any], names: list[str]) -> None:
    for name in names:  # an unset slot stays unset
        v = getattr(o, name, _MISSING)
        if v is not _MISSING:
            object.__setattr__(n, name, v if type(v) in _ATOMIC else copy(v))


_MISSING = object()


def _frozen_dataclass(cls: type) -> bool:
    params = getattr(cls, "__dataclass_params__", None)
    return params is not None and params.frozen and dataclasses.is_dataclass(cls)


def _copier(memo: dict[int, Any]) -> Callable[[Any], Any]:
    """The copy function of one fork operation, over `memo` (id(original) -> copy)."""
    atomic = _ATOMIC
    memo_get = memo.get
    class_copiers = _CLASS_COPIERS
    missing = _MISSING

    def copy(v: Any) -> Any:
        found = memo_get(id(v), missing)
        if found is not missing:
            return found
        t = type(v)
        if t is tuple:
            for x in v:
                if type(x) not in atomic:
                    # tuples are not memoised: two references to one tuple get equal copies
                    return tuple([x if type(x) in atomic else copy(x) for x in v])
            return v  # a tuple of immutables is itself immutable: shared
        if t is list:
            new_list: list[Any] = []
            memo[id(v)] = new_list
            if v:
                new_list.extend([x if type(x) in atomic else copy(x) for x in v])
            return new_list
        if t is dict:
            new_dict: dict[Any, Any] = {}
            memo[id(v)] = new_dict
            for k, x in v.items():
                new_dict[k] = x if type(x) in atomic else copy(x)
            return new_dict
        fn = class_copiers.get(t)
        if fn is not None:
            return fn(v, copy, memo)
        if t in atomic:
            return v
        if t is set or t is frozenset:
            out_set = t(x if type(x) in atomic else copy(x) for x in v)
            memo[id(v)] = out_set
            return out_set
        if t is np.random.Generator:
            bits = type(v.bit_generator)()
            bits.state = v.bit_generator.state
            gen = np.random.Generator(bits)
            memo[id(v)] = gen
            return gen
        if _frozen_dataclass(t):
            memo[id(v)] = v
            return v
        if t is np.ndarray:  # the compiled engine's state (sim/array_engine.py): plain numeric arrays
            out_arr = v.copy()
            memo[id(v)] = out_arr
            return out_arr
        if t.__module__ == "builtins" or isinstance(v, np.ndarray):
            raise TypeError(f"fork: do not know how to copy a {t.__qualname__}; add it to sim/fork.py")
        fn = class_copiers[t] = _class_copier(t)
        return fn(v, copy, memo)

    return copy


def fork_engine(engine: Any, shared: Iterable[Any] = ()) -> Any:
    """An independent copy of `engine` (any object graph of plain Python objects, really): stepping
    either one never changes the other. `shared` objects are referenced, not copied."""
    keep = list(shared)  # alive while their ids are in the memo
    memo: dict[int, Any] = {id(o): o for o in keep}
    return _copier(memo)(engine)
