"""The compiled-rules cache: what parsing and checking each rule file found, kept
between runs so that `mpdoctor explain` starts like a small script.

Reading a hundred TOML files and checking every pattern (bounded? which literal does
it need?) costs a few hundred milliseconds; loading this cache costs about one. An
entry is used only while its file has the same path, size and modification time,
and the whole cache is dropped when mpdoctor, Python, or the engine code that derives
literals changes. It lives in the user's cache folder (MPDOCTOR_CACHE_DIR,
$XDG_CACHE_HOME/mpdoctor or ~/.cache/mpdoctor); MPDOCTOR_NO_CACHE=1 turns it off, and
a folder that cannot be written only means no cache.
"""

from __future__ import annotations

import marshal
import os
import sys
from pathlib import Path
from typing import Any

_FORMAT = 4


def cache_dir() -> Path:
    if os.environ.get("MPDOCTOR_CACHE_DIR"):
        return Path(os.environ["MPDOCTOR_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mpdoctor"


def _stamp() -> str:
    """What the cached literals depend on besides the rule files themselves."""
    from .. import __version__

    here = Path(__file__).resolve().parent
    parts = [f"v{_FORMAT}", __version__, sys.version.split()[0]]
    for name in ("patterns.py", "rules.py"):
        try:
            st = (here / name).stat()
            parts.append(f"{st.st_mtime_ns}:{st.st_size}")
        except OSError:
            parts.append("?")
    return "|".join(parts)


class RuleCache:
    def __init__(self, path: Path | None):
        self.path = path
        self.entries: dict[str, tuple[int, int, dict[str, Any], list[str], dict[str, Any]]] = {}
        self.dirty = False
        self.stamp = _stamp() if path is not None else ""
        if path is not None:
            try:
                blob = marshal.loads(path.read_bytes())
                if isinstance(blob, dict) and blob.get("stamp") == self.stamp:
                    self.entries = blob["entries"]
            except (OSError, ValueError, EOFError, TypeError, KeyError):
                self.entries = {}

    def lookup(self, file: str, mtime_ns: int, size: int) -> tuple[dict[str, Any], list[str], dict[str, Any]] | None:
        """The cached parse of `file`, if it was made from a file of this mtime and size."""
        entry = self.entries.get(os.path.abspath(file))
        if entry is None or (mtime_ns, size) != (entry[0], entry[1]):
            return None
        return entry[2], entry[3], entry[4]

    def store(self, file: str, mtime_ns: int, size: int, data: dict[str, Any], literals: list[str],
              extra: dict[str, Any]) -> None:
        if self.path is None:
            return
        try:
            marshal.dumps((data, extra))  # TOML dates and times cannot be cached: skip the file
        except ValueError:
            return
        self.entries[os.path.abspath(file)] = (mtime_ns, size, data, list(literals), dict(extra))
        self.dirty = True

    def save(self) -> None:
        if self.path is None or not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(marshal.dumps({"stamp": self.stamp, "entries": self.entries}))
            os.replace(tmp, self.path)
            self.dirty = False
        except OSError:
            pass


_INSTANCE: RuleCache | None = None


def get() -> RuleCache:
    global _INSTANCE
    if _INSTANCE is None:
        if os.environ.get("MPDOCTOR_NO_CACHE") == "1":
            _INSTANCE = RuleCache(None)
        else:
            _INSTANCE = RuleCache(cache_dir() / "rules.marshal")
    return _INSTANCE


def reset() -> None:
    """Forget the in-process cache object (tests that change the environment)."""
    global _INSTANCE
    _INSTANCE = None
