"""Signal numbers as people read them."""

from __future__ import annotations

import signal


def signal_name(number: int) -> str:
    """9 -> 'SIGKILL' (this platform's names); a number it has no name for -> 'signal 77'."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
