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
import pkgutil
from typing import Any, Callable

Deriver = Callable[[dict[str, Any], list[dict[str, Any]]], "dict[str, Any] | None"]
DERIVERS: dict[str, Deriver] = {}


def deriver(name: str) -> Callable[[Deriver], Deriver]:
    def register(fn: Deriver) -> Deriver:
        if name in DERIVERS:
            raise ValueError(f"deriver {name!r} registered twice")
        DERIVERS[name] = fn
        return fn

    return register


def run_deriver(name: str, facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    try:
        extra = DERIVERS[name](dict(facts), hits)
    except Exception as exc:  # a deriver bug must not take explain down
        return {"derive_error": f"{type(exc).__name__}: {exc}"}
    return extra or {}


for _mod in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_mod.name}")
