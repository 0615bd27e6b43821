"""Words that frame a rule's words (rules/_frames.toml): a likely match, a machine's fact
under a log finding. Read once, from the built-in rules folder; no Python writes them.
"""

from __future__ import annotations

import os
import sys
from typing import Any

_FRAMES: dict[str, dict[str, Any]] | None = None
_FILE = "_frames.toml"


def _path() -> str:
    from .loader import builtin_rules_path

    return os.path.join(builtin_rules_path(), _FILE)


def frames() -> dict[str, dict[str, Any]]:
    global _FRAMES
    if _FRAMES is None:
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            import tomli as tomllib
        with open(_path(), "rb") as fh:
            data = tomllib.load(fh)
        _FRAMES = {k: dict(v) for k, v in data.items() if isinstance(v, dict)}
    return _FRAMES


def frame(name: str) -> dict[str, Any]:
    """One frame's templates ({"title": ..., "explanation": ...})."""
    return frames()[name]
