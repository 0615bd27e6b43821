"""Explanations and fixes are templates over a finding's facts.

A rule's `explanation` and `fixes` are lists of sentences with `{fact}` placeholders.
A sentence whose facts are not all known is left out, so one rule can say more when
the log says more (an OOM with the free-memory figure gets the arithmetic, one
without it does not) and never prints a hole.
"""

from __future__ import annotations

import string
from typing import Any

_FORMATTER = string.Formatter()


def fields_of(template: str) -> list[str]:
    """The facts a template names (`{fact?}`, an optional fact, by its name)."""
    names = []
    for _lit, name, _spec, _conv in _FORMATTER.parse(template):
        if name:
            names.append(name.split(".")[0].split("[")[0].rstrip("?"))
    return names


def render(template: str, facts: dict[str, Any]) -> str | None:
    """The sentence with its facts filled in, or None when one is unknown. `{fact?}` is
    optional: an unknown one is said as nothing ("rank 1 failed{when?}")."""
    optional: dict[str, Any] | None = None
    for _lit, field, _spec, _conv in _FORMATTER.parse(template):
        if not field:
            continue
        name = field.split(".")[0].split("[")[0]
        if name.endswith("?"):
            value = facts.get(name[:-1])
            optional = optional if optional is not None else {}
            optional[name] = "" if value in (None, "") else value
        elif facts.get(name) in (None, ""):
            return None
    try:
        return _FORMATTER.vformat(template, (), facts if optional is None else {**facts, **optional})
    except (KeyError, IndexError, ValueError, TypeError, AttributeError):
        return None


def render_first(templates: "str | list[str]", facts: dict[str, Any]) -> str | None:
    """The first of `templates` (one, or a list: the fullest first) whose facts are known."""
    for t in [templates] if isinstance(templates, str) else templates:
        s = render(t, facts)
        if s is not None:
            return s
    return None


def render_all(templates: list[str], facts: dict[str, Any]) -> list[str]:
    out = []
    for t in templates:
        s = render(t, facts)
        if s is not None:
            out.append(s)
    return out


def render_paragraph(templates: list[str], facts: dict[str, Any]) -> str:
    return " ".join(render_all(templates, facts))
