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
    names = []
    for _lit, name, _spec, _conv in _FORMATTER.parse(template):
        if name:
            names.append(name.split(".")[0].split("[")[0])
    return names


def render(template: str, facts: dict[str, Any]) -> str | None:
    """The sentence with its facts filled in, or None when one is unknown."""
    for name in fields_of(template):
        if facts.get(name) in (None, ""):
            return None
    try:
        return _FORMATTER.vformat(template, (), facts)
    except (KeyError, IndexError, ValueError, TypeError, AttributeError):
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
