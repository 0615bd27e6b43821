"""mpdoctor: a doctor for mixed-precision deep-learning training."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "watch"]


def __getattr__(name: str) -> Any:
    # `mpdoctor.watch` needs torch; import it only when asked for, so that
    # `import mpdoctor` (and `mpdoctor explain`) never pulls torch in.
    if name == "watch":
        from .instrument import watch

        return watch
    raise AttributeError(f"module 'mpdoctor' has no attribute {name!r}")
