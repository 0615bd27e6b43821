"""Which files make up a job, and whose each one is.

`explain` is given files, folders or globs. Each file found is one source: a rank's log
(a SLURM `%t` file, torchrun's `--log-dir` tree, a log merged with rank prefixes), an
`mpdoctor run` report (one per node), a Flight Recorder dump, a hang's stack dump, or a
job's recorded evidence. A source's rank and node come from where it lies and what it is
called; the lines' own prefixes (`[rank3]:`) are read later, with the text.
"""

from __future__ import annotations

import glob
import os
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable

# torchrun --log-dir DIR --redirects 3: DIR/<run id>/attempt_<n>/<local rank>/{stdout,stderr,error}.{log,json}
_TORCHRUN = re.compile(r"(?P<run>[^/]+)/attempt_(?P<attempt>\d+)/(?P<local>\d+)/(?P<stream>stdout|stderr|error)\.(?:log|json)$")
# a number in a file name, with the word before it when there is one: rank3.log, job.1234.3.out,
# worker-07.txt, task_3.err, train_rank_12.log
_NUMBERED = re.compile(r"(?i)(?:(?P<word>rank|task|proc|process|worker|node|host|gpu|pid)[-_.]?)?(?P<n>\d{1,7})"
                       r"(?P<tail>(?:\.[a-z]{1,8})*)$")
_NODE_WORD = re.compile(r"(?i)^(?:node|host|machine)[-_.]?(\w{1,64})$")
MAX_SOURCES = 100_000


class SourceError(Exception):
    """A path given that cannot be read as part of a job (says which and why)."""


class Source:
    """One file of a job. `kind`: log, report, flight, stack or job; `rank`/`node`/
    `local_rank` as far as its place and name say; `group`: the launcher's folder it
    belongs to (one torchrun agent's run), whose ranks are numbered together."""

    __slots__ = ("path", "kind", "rank", "node", "local_rank", "group", "size", "stream")

    def __init__(self, path: str, kind: str = "log", rank: int | None = None, node: str | None = None,
                 local_rank: int | None = None, group: str | None = None, size: int = 0, stream: str | None = None):
        self.path = path
        self.kind = kind
        self.rank = rank
        self.node = node
        self.local_rank = local_rank
        self.group = group
        self.size = size
        self.stream = stream

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) not in (None, "")}

    def __repr__(self) -> str:
        return f"Source({self.path!r}, {self.kind}, rank={self.rank}, node={self.node})"


def expand(paths: "Iterable[str]") -> list[str]:
    """Files named by `paths` (files, folders walked in name order, globs), each once."""
    out: list[str] = []
    seen: set[str] = set()

    def add(p: str) -> None:
        key = os.path.realpath(p)
        if key not in seen:
            seen.add(key)
            out.append(p)
            if len(out) > MAX_SOURCES:
                raise SourceError(f"more than {MAX_SOURCES:,} files: give the job's own folder")

    for given in paths:
        if os.path.isdir(given):
            for root, dirs, files in os.walk(given):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(files):
                    if not name.startswith("."):
                        full = os.path.join(root, name)
                        if os.path.isfile(full):
                            add(full)
        elif os.path.exists(given):
            if not os.path.isfile(given):
                raise SourceError(f"{given} is not a file or a folder")
            add(given)
        elif any(c in given for c in "*?["):
            hits = sorted(glob.glob(given, recursive=True))
            if not hits:
                raise SourceError(f"{given} matches no file")
            for h in hits:
                if os.path.isdir(h):
                    out_before = len(out)
                    for f in expand([h]):
                        add(f)
                    del out_before
                elif os.path.isfile(h):
                    add(h)
        else:
            raise SourceError(f"{given}: no such file or folder")
    return out


def sniff(path: str) -> tuple[str, int]:
    """(kind, size) from a file's first bytes: a pickle is a Flight Recorder dump, a JSON
    object is a report, a dump or a job's evidence (read later to tell), else a log."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(512)
    except OSError as exc:
        raise SourceError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if head[:1] == b"\x80" and len(head) > 2 and head[1] <= 5:
        return "flight", size
    stripped = head.lstrip()
    if stripped[:1] == b"{":
        if b'"entries"' in head or b'"pg_config"' in head or b'"pg_status"' in head:
            return "flight", size
        if b'"mpdoctor-job' in head:
            return "job", size
        return "json", size  # a report, or a log that happens to start with a brace: told on reading
    if head.startswith(b"# mpdoctor: rank ") or b"Stack (most recent call first)" in head or b"Current thread 0x" in head or b"Thread 0x" in head[:64]:
        return "stack", size
    if not head and os.path.basename(os.path.dirname(path)) == "stacks":
        return "stack", size  # a rank's stack file, armed and never written (it died in C++)
    return "log", size


def attribute(files: list[str], roots: "Iterable[str]" = ()) -> list[Source]:
    """A Source per file, with the rank/node its place and name say."""
    sources = []
    for path in files:
        kind, size = sniff(path)
        sources.append(Source(path, kind, size=size))
    _from_torchrun_layout(sources)
    _from_numbered_names(sources)
    _nodes_from_folders(sources, list(roots))
    return sources


def _from_torchrun_layout(sources: list[Source]) -> None:
    for s in sources:
        m = _TORCHRUN.search(s.path.replace(os.sep, "/"))
        if m:
            s.local_rank = int(m.group("local"))
            s.stream = m.group("stream")
            # one agent's run: its ranks are numbered from one base (read from a [rankN] prefix later)
            s.group = s.path[: m.start()] + f"{m.group('run')}/attempt_{m.group('attempt')}"


def _from_numbered_names(sources: list[Source]) -> None:
    """rank3.log names its rank; job.3.out does when its siblings are job.0.out, job.1.out..."""
    groups: dict[tuple[str, str], list[tuple[Source, int, str | None]]] = {}
    for s in sources:
        if s.local_rank is not None or s.kind not in ("log", "stack", "flight"):
            continue
        folder, name = os.path.split(s.path)
        m = _NUMBERED.search(name)
        if not m:
            continue
        word = (m.group("word") or "").lower()
        shape = name[: m.start("n")] + "#" + m.group("tail")
        groups.setdefault((folder, shape), []).append((s, int(m.group("n")), word or None))
    for members in groups.values():
        numbers = {n for _, n, _ in members}
        for s, n, word in members:
            if word == "pid":  # a process id names no rank
                continue
            if word in ("node", "host"):
                s.node = s.node or f"{word}{n}"
            elif word in ("rank", "gpu", "worker", "process", "proc") or (len(numbers) == len(members) > 1):
                s.rank = n


def _nodes_from_folders(sources: list[Source], roots: list[str]) -> None:
    """A folder named node0 / host-a / machine3 on the way to a file names its node; a
    torchrun agent's folder above its run names the node it ran on."""
    for s in sources:
        parts = s.path.replace(os.sep, "/").split("/")[:-1]
        for part in reversed(parts):
            m = _NODE_WORD.match(part)
            if m:
                s.node = s.node or part
                break
        if s.node is None and s.group is not None:
            above = os.path.dirname(os.path.dirname(s.group))
            name = os.path.basename(above)
            if name and not any(os.path.realpath(above) == os.path.realpath(r) for r in roots):
                s.node = name
