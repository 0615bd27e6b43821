"""Derived facts: small pure functions a rule names with `derive = "NAME"`.

A rule's patterns read values out of the log (named groups); a deriver turns them into
what follows from them: bytes from "2.00 GiB", the memory other processes hold, the
CUDA version a driver number supports. Each module in this package registers its
functions with `@deriver("name")`; all of them are imported here, so a new module is
found without touching this file.

A deriver gets the first hit's facts and every hit's facts (in log order) and returns
new facts to merge, or None. It must not raise on odd input: return what it can.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

Deriver = Callable[[dict[str, Any], list[dict[str, Any]]], "dict[str, Any] | None"]


class _Registry(dict):
    """name -> deriver. The modules of this package are imported the first time the
    whole registry is looked at (a lookup that misses, `in`, iteration), not when the
    package is: `mpdoctor explain` imports only the module of the deriver a finding
    needs (the rule cache remembers which), which keeps it starting fast."""

    def __missing__(self, name: str) -> Deriver:
        load_all()
        if dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        if not dict.__contains__(self, name):
            load_all()
        return dict.__contains__(self, name)

    def __iter__(self):
        load_all()
        return dict.__iter__(self)

    def __len__(self) -> int:
        load_all()
        return dict.__len__(self)

    def keys(self):  # type: ignore[override]
        load_all()
        return dict.keys(self)

    def items(self):  # type: ignore[override]
        load_all()
        return dict.items(self)

    def values(self):  # type: ignore[override]
        load_all()
        return dict.values(self)


DERIVERS: dict[str, Deriver] = _Registry()
_LOADED = False


def deriver(name: str) -> Callable[[Deriver], Deriver]:
    def register(fn: Deriver) -> Deriver:
        if dict.__contains__(DERIVERS, name):
            raise ValueError(f"deriver {name!r} registered twice")
        dict.__setitem__(DERIVERS, name, fn)
        return fn

    return register


def load_all() -> None:
    """Import every module of this package (each registers its derivers)."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    import pkgutil

    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")


def module_of(name: str) -> str | None:
    """The module that defines deriver `name` (for the rule cache), or None."""
    fn = DERIVERS.get(name) if name in DERIVERS else None
    return getattr(fn, "__module__", None)


def run_deriver(name: str, facts: dict[str, Any], hits: list[dict[str, Any]],
                module: str | None = None) -> dict[str, Any]:
    """Run deriver `name`; `module`, when known, is imported instead of all of them."""
    try:
        if module and not dict.__contains__(DERIVERS, name):
            try:
                importlib.import_module(module)
            except ImportError:
                pass
        extra = DERIVERS[name](dict(facts), hits)
    except Exception as exc:  # a deriver bug must not take explain down
        return {"derive_error": f"{type(exc).__name__}: {exc}"}
    return extra or {}
