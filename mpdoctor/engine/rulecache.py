"""The compiled-rules cache: what parsing and checking each rule file found, kept
between runs so that `mpdoctor explain` starts like a small script.

Reading a hundred TOML files and checking every pattern (bounded? which literal does
it need?) costs a few hundred milliseconds; loading this cache costs about one. An
entry is used only while its file has the same path, size and content (a digest of its
bytes: a rule edited with the same size and modification time, as `cp -p` or `rsync -t`
leave it, is read again), an entry of the wrong shape is ignored, and the whole cache is dropped when mpdoctor, Python, or the engine code that derives
literals changes. It lives in the user's cache folder (MPDOCTOR_CACHE_DIR,
$XDG_CACHE_HOME/mpdoctor or ~/.cache/mpdoctor); MPDOCTOR_NO_CACHE=1 turns it off, and
a folder that cannot be written only means no cache.
"""

from __future__ import annotations

import marshal
import os
import sys
from typing import Any

_FORMAT = 13
# kept in a second file, read only when a finding or a rule page needs them
_DOC_KEYS = ("doc", "example", "near_miss", "explanation", "fixes", "references", "summary", "versions",
             "unrendered", "words", "each")


def digest(data: bytes) -> str:
    """The content digest of a rule file (blake2b from its C module: hashlib would load
    OpenSSL, ten milliseconds of `explain`'s start)."""
    try:
        from _blake2 import blake2b
    except ImportError:  # pragma: no cover - a Python built without it
        from hashlib import blake2b
    return blake2b(data, digest_size=16).hexdigest()


class _Dir(str):
    """A folder path as a str with the `/` of pathlib (pathlib costs a few ms to import)."""

    def __truediv__(self, name: str) -> "_Dir":
        return _Dir(os.path.join(self, name))

    @property
    def parent(self) -> "_Dir":
        return _Dir(os.path.dirname(self))

    @property
    def name(self) -> str:
        return os.path.basename(self)

    def with_name(self, name: str) -> "_Dir":
        return _Dir(os.path.join(os.path.dirname(self), name))

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        os.makedirs(self, exist_ok=exist_ok) if parents else os.mkdir(self)

    def read_bytes(self) -> bytes:
        with open(self, "rb") as fh:
            return fh.read()

    def write_bytes(self, data: bytes) -> None:
        with open(self, "wb") as fh:
            fh.write(data)


def cache_dir() -> _Dir:
    if os.environ.get("MPDOCTOR_CACHE_DIR"):
        return _Dir(os.path.expanduser(os.environ["MPDOCTOR_CACHE_DIR"]))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return _Dir(os.path.join(base, "mpdoctor"))


def _stamp() -> str:
    """What the cached literals depend on besides the rule files themselves."""
    from .. import __version__

    here = os.path.dirname(os.path.realpath(__file__))
    parts = [f"v{_FORMAT}", __version__, sys.version.split()[0]]
    for name in ("patterns.py", "loader.py", "rule.py", "facts.py"):
        try:
            st = os.stat(os.path.join(here, name))
            parts.append(f"{st.st_mtime_ns}:{st.st_size}")
        except OSError:
            parts.append("?")
    return "|".join(parts)


class RuleCache:
    def __init__(self, path: _Dir | None):
        self.path = path
        # path -> (digest, size, kw, pats, checked, stat key when hashed, when hashed)
        self.entries: dict[str, tuple] = {}
        self.dirty = False
        self.stamp = _stamp() if path is not None else ""
        self._docs: dict[str, dict[str, Any]] | None = None
        self._new_docs: dict[str, dict[str, Any]] = {}
        if path is not None:
            try:
                blob = marshal.loads(path.read_bytes())
                if isinstance(blob, dict) and blob.get("stamp") == self.stamp and isinstance(blob.get("entries"), dict):
                    self.entries = blob["entries"]
            except Exception:  # unreadable, truncated, another format: no cache
                self.entries = {}

    def _load_docs_file(self) -> dict[str, dict[str, Any]]:
        if self._docs is None:
            self._docs = {}
            if self.path is not None:
                try:
                    blob = marshal.loads(self.path.with_name("rules-docs.marshal").read_bytes())
                    if isinstance(blob, dict) and blob.get("stamp") == self.stamp and isinstance(blob.get("docs"), dict):
                        self._docs = blob["docs"]
                except Exception:
                    pass
        return self._docs

    def docs(self, file: str) -> dict[str, Any]:
        """The doc / examples / near misses of a cached rule file."""
        key = os.path.abspath(file)
        if key in self._new_docs:
            return self._new_docs[key]
        docs = self._load_docs_file()
        if not isinstance(docs.get(key), dict):  # the docs file is gone, stale or odd: read the rule again
            from .loader import _read_toml

            data = _read_toml(file)
            return {k: data[k] for k in _DOC_KEYS if k in data}
        return docs[key]

    def lookup(self, file: str, stat_key: str, size: int,
               checked: bool = False) -> tuple[dict[str, Any], dict[str, list]] | None:
        """The cached rule of `file` (see loader.cache_form), if made from the bytes the
        file holds now; with `checked`, only one whose placeholders were checked against
        the fact vocabulary when it was parsed. An entry of any other shape is no entry.

        The bytes are hashed again unless the file's stat key (inode, mtime, ctime) is
        the one seen when they were last hashed and that ctime was clearly before it (a
        write within the same clock tick could otherwise go unseen, as git's racy index)."""
        key = os.path.abspath(file)
        entry = self.entries.get(key)
        if (not isinstance(entry, tuple) or len(entry) != 7 or not isinstance(entry[2], dict)
                or not isinstance(entry[3], dict) or entry[1] != size or (checked and entry[4] is not True)):
            return None
        if entry[5] != stat_key or not self._settled(stat_key, entry[6]):
            try:
                with open(file, "rb") as fh:
                    content = digest(fh.read())
            except OSError:
                return None
            if content != entry[0]:
                return None
            import time

            self.entries[key] = entry[:5] + (stat_key, time.time_ns())
            self.dirty = True
        return entry[2], entry[3]

    @staticmethod
    def _settled(stat_key: str, hashed_at: object) -> bool:
        try:
            ctime_ns = int(stat_key.rsplit(":", 1)[1])
        except (ValueError, IndexError):
            return False
        return isinstance(hashed_at, int) and ctime_ns < hashed_at - 2_000_000_000

    def store(self, file: str, stat_key: str, size: int, data: dict[str, Any], kw: dict[str, Any],
              pats: dict[str, list], checked: bool = False) -> None:
        if self.path is None:
            return
        docs = {k: data[k] for k in _DOC_KEYS if k in data}
        try:
            marshal.dumps((kw, pats, docs))  # TOML dates and times cannot be cached: skip the file
        except ValueError:
            return
        key = os.path.abspath(file)
        try:
            with open(file, "rb") as fh:
                content = digest(fh.read())
        except OSError:
            return
        import time

        self.entries[key] = (content, size, kw, pats, checked, stat_key, time.time_ns())
        self._new_docs[key] = docs
        self.dirty = True

    def save(self) -> None:
        if self.path is None or not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            docs = {k: v for k, v in self._load_docs_file().items() if k in self.entries}
            docs.update(self._new_docs)
            # the docs first: an entries file never points at docs that are not written
            for name, blob in (("rules-docs.marshal", {"stamp": self.stamp, "docs": docs}),
                               (self.path.name, {"stamp": self.stamp, "entries": self.entries})):
                target = self.path.with_name(name)
                tmp = target.with_name(f"{name}.{os.getpid()}.tmp")
                tmp.write_bytes(marshal.dumps(blob))
                os.replace(tmp, target)
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
