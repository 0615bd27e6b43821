"""The environment: collected as a snapshot, judged by environment rules.

Public API (what `check`, `collect`, `probe` and `explain --here` use):

    from mpdoctor.env import collect, load_snapshot, judge_snapshot

    snap = collect()                       # this machine, as a plain dict (schema 1)
    snap = collect(config_file="acc.yaml", # read this accelerate config instead of the default
                   anonymize=True,         # also hide the user name / home in paths
                   torch_timeout=60.0,     # seconds the torch child may take
                   python="/venv/bin/python")  # examine the interpreter that trains
    snap = load_snapshot("env.json")       # a recorded snapshot (raises SnapshotError)
    pending = start_collection(); ...; snap = pending.finish()   # overlap your own start-up

`collect()` never raises for a broken environment: torch and NVML are examined in
child processes with a timeout (their whole process group killed at the deadline), every collector is isolated, and a collector that fails leaves
`{"error": {"type": ..., "message": ...}}` in its section. Secrets are redacted before
the dict is returned. The dict is JSON-serialisable and documented in
docs/snapshot-schema.md; a live collection and a recorded file both pass through
`load_snapshot_data`, so they look the same to every rule.

Only the child scripts of this package (torch_child, nvml run as a script) touch torch
or pynvml: mpdoctor's own process loads neither.
"""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 1

__all__ = ["SCHEMA_VERSION", "SnapshotError", "collect", "start_collection", "load_snapshot",
           "load_snapshot_data", "judge_snapshot"]


class SnapshotError(ValueError):
    """A snapshot file that cannot be used (unreadable, not JSON, wrong schema)."""


def collect(*, config_file: str | None = None, anonymize: bool = False,
            torch_timeout: float | None = None, python: str | None = None) -> dict[str, Any]:
    """This machine's environment as a snapshot dict (schema 1), secrets redacted.
    `python`: the interpreter to examine torch and the libraries with (default: this one)."""
    from .collect import collect_snapshot

    return load_snapshot_data(collect_snapshot(config_file=config_file, anonymize=anonymize,
                                               torch_timeout=torch_timeout, python=python), live=True)


def start_collection(*, config_file: str | None = None, anonymize: bool = False,
                     torch_timeout: float | None = None, python: str | None = None) -> Any:
    """Begin collecting; `.finish()` returns what `collect()` would (do other start-up
    work in between, while torch imports in the child)."""
    from .collect import Collection

    return _Finishing(Collection(config_file=config_file, anonymize=anonymize, torch_timeout=torch_timeout,
                                 python=python).start())


class _Finishing:
    def __init__(self, collection: Any) -> None:
        self._c = collection

    def finish(self) -> dict[str, Any]:
        return load_snapshot_data(self._c.finish(), live=True)


def load_snapshot(path: str) -> dict[str, Any]:
    """Read a recorded snapshot (JSON file, or '-' for stdin). Raises SnapshotError."""
    from .snapshot import read_snapshot_file

    return read_snapshot_file(path)


def load_snapshot_data(data: Any, live: bool = False) -> dict[str, Any]:
    """Validate and normalise a snapshot dict: the one loader for files and live data.
    `live`: collected here just now, so an odd value from a library is nulled (and
    listed under "repaired_fields") rather than refusing the whole snapshot."""
    from .snapshot import normalise_snapshot

    return normalise_snapshot(data, repair=live)


def judge_snapshot(snapshot: dict[str, Any], **kwargs: Any) -> Any:
    """Apply the environment rules; returns a findings Report (see mpdoctor.env.judge)."""
    from .judge import judge

    return judge(snapshot, **kwargs)
