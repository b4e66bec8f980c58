"""Check a plain dict against a TypedDict contract at run time (mypy checks the code; this checks
what the code, or a hand-made test fixture, actually holds).

``conforms(value, Summary)`` returns the mismatches as ``path: what`` lines (empty when it
conforms): unknown keys, missing required keys (unless ``partial``), and values of the wrong
type, walking nested TypedDicts, lists, dicts, unions and Literals. A float field takes an int
(JSON writes 2.0 as 2); an int field does not take a bool.
"""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict


def conforms(value: Any, tp: Any, *, partial: bool = False, path: str = "") -> list[str]:
    """Mismatches between ``value`` and the type ``tp`` (see module doc)."""
    here = path or "<root>"
    if tp is Any or tp is object:
        return []
    if is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{here}: {type(value).__name__}, not a {tp.__name__}"]
        hints = get_type_hints(tp)
        out = [f"{path}.{k}: not a key of {tp.__name__}" for k in value if k not in hints]
        if not partial:
            out += [f"{path}.{k}: missing from {tp.__name__}" for k in tp.__required_keys__
                    if k not in value]
        for k, v in value.items():
            if k in hints:
                out += conforms(v, hints[k], partial=partial, path=f"{path}.{k}")
        return out
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [conforms(value, t, partial=partial, path=path) for t in get_args(tp)]
        return [] if any(not o for o in options) else min(options, key=len)
    if origin is Literal:
        return [] if value in get_args(tp) else [f"{here}: {value!r} not one of {get_args(tp)}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{here}: {type(value).__name__}, not a list"]
        (item,) = get_args(tp)
        return [m for i, v in enumerate(value)
                for m in conforms(v, item, partial=partial, path=f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{here}: {type(value).__name__}, not a dict"]
        kt, vt = get_args(tp)
        return [m for k, v in value.items()
                for m in (conforms(k, kt, partial=partial, path=f"{path}<key>")
                          + conforms(v, vt, partial=partial, path=f"{path}[{k!r}]"))]
    if tp is type(None):
        return [] if value is None else [f"{here}: {value!r}, not None"]
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return [] if ok else [f"{here}: {value!r}, not a float"]
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{here}: {value!r}, not an int"]
    if isinstance(tp, type):
        return [] if isinstance(value, tp) else [f"{here}: {value!r}, not a {tp.__name__}"]
    raise TypeError(f"{here}: cannot check {tp!r}")


def assert_conforms(value: Any, tp: Any, *, partial: bool = False) -> None:
    found = conforms(value, tp, partial=partial)
    assert not found, "\n".join(found[:20])


__all__ = ["assert_conforms", "conforms"]
