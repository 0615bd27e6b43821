"""The one-line protocol between a probe child and its parent (stdlib only, so the
parent can import it without importing the child)."""

from __future__ import annotations

import json
import sys
from typing import Any

# Lines the child writes to stdout that start with this are events; anything else a
# library prints there is ignored.
PREFIX = "@@probe "


def emit(event: str, **data: Any) -> None:
    sys.stdout.write(PREFIX + json.dumps({"event": event, **data}) + "\n")
    sys.stdout.flush()
