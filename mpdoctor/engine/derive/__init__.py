"""Derivers: small pure functions that compute facts from the facts a log rule read.

A deriver is marked with `@deriver("name", facts=(...))`, naming the facts it can
produce (the loader checks a rule's placeholders against them). The modules holding
derivers are listed in MODULES: nothing registers itself on import. A rule names its
deriver (`derive = "oom"`); the rule cache remembers the deriver's module, so that
`mpdoctor explain` imports only the module a finding needs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

Deriver = Callable[[dict[str, Any], list[dict[str, Any]]], "dict[str, Any] | None"]
MODULES = ("distributed", "fit", "hardware", "memory", "tensors", "versions")


@dataclass(frozen=True)
class DeriverInfo:
    name: str
    facts: tuple[str, ...]


def deriver(name: str, *, facts: tuple[str, ...] | list[str] = ()) -> Callable[[Deriver], Deriver]:
    def mark(fn: Deriver) -> Deriver:
        fn.__deriver__ = DeriverInfo(name, tuple(facts))  # type: ignore[attr-defined]
        return fn
    return mark


def _derivers_of(module: Any) -> dict[str, Deriver]:
    out = {}
    for value in vars(module).values():
        info = getattr(value, "__deriver__", None)
        if isinstance(info, DeriverInfo) and getattr(value, "__module__", None) == module.__name__:
            out[info.name] = value
    return out


_TABLE: dict[str, Deriver] | None = None


def table() -> dict[str, Deriver]:
    """name -> deriver, over every module in MODULES (imported on first use)."""
    global _TABLE
    if _TABLE is None:
        found: dict[str, Deriver] = {}
        for name in MODULES:
            for key, fn in _derivers_of(importlib.import_module(f"{__name__}.{name}")).items():
                if key in found:
                    raise ValueError(f"deriver {key!r} is defined twice")
                found[key] = fn
        _TABLE = found
    return _TABLE


def deriver_names() -> list[str]:
    return sorted(table())


def module_of(name: str) -> str | None:
    """The module that defines deriver `name` (for the rule cache), or None."""
    fn = table().get(name)
    return fn.__module__ if fn is not None else None


def facts_of(name: str) -> tuple[str, ...]:
    fn = table().get(name)
    return fn.__deriver__.facts if fn is not None else ()  # type: ignore[attr-defined]


def run_deriver(name: str, facts: dict[str, Any], hits: list[dict[str, Any]],
                module: str | None = None) -> dict[str, Any]:
    """Run deriver `name`; `module`, when known, is the only one imported."""
    try:
        fn = None
        if module:
            try:
                fn = _derivers_of(importlib.import_module(module)).get(name)
            except ImportError:
                fn = None
        if fn is None:
            fn = table()[name]
        extra = fn(dict(facts), hits)
    except Exception as exc:  # a deriver bug must not take explain down
        return {"derive_error": f"{type(exc).__name__}: {exc}"}
    return extra or {}
