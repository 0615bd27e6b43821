"""Flight Recorder dumps (torch.distributed's record of every collective a rank ran),
as the job's `collectives`: one entry per rank per collective.

torch writes a dump per rank: a pickle (`_dump_fr_trace`, what NCCL's watchdog writes
to TORCH_FR_DUMP_TEMP_FILE<rank> on a timeout) or JSON (`_dump_fr_trace_json`). A pickle
is read with an Unpickler that builds plain containers and primitives only: a dump
naming any class or function is refused, never run.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from typing import Any

MAX_DUMP = 256 * 1024 * 1024
MAX_ENTRIES = 100_000
_LIBRARY = ("site-packages", "dist-packages", "/torch/", "/lib/python3")
_RANK_IN_NAME = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle))?$")


class DumpError(ValueError):
    pass


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # every global is refused
        raise DumpError(f"the dump names {module}.{name}: not a plain Flight Recorder dump, not read")


def load_dump(data: bytes) -> dict[str, Any]:
    """A dump's bytes (pickle or JSON) as a dict of plain values."""
    if data[:1] == b"\x80":
        try:
            out = _PlainUnpickler(io.BytesIO(data)).load()
        except DumpError:
            raise
        except Exception as exc:  # truncated, corrupt
            raise DumpError(f"not a readable pickle ({type(exc).__name__})") from None
    else:
        try:
            out = json.loads(data.decode("utf-8", "replace"))
        except ValueError as exc:
            raise DumpError(f"not JSON ({exc})") from None
    if not isinstance(out, dict) or not isinstance(out.get("entries", []), list):
        raise DumpError("not a Flight Recorder dump (no entries)")
    return out


def _site(frames: Any) -> str | None:
    """The user's frame a collective was called from: the first outside torch and the libraries."""
    if not isinstance(frames, list):
        return None
    for f in frames:
        if isinstance(f, dict) and not any(p in str(f.get("filename", "")) for p in _LIBRARY):
            return f"{str(f.get('filename', '?')).rsplit('/', 1)[-1]}:{f.get('line')}"
    return None


def _dtype(name: Any) -> str:
    return {"Float": "float32", "Half": "float16", "BFloat16": "bfloat16", "Double": "float64",
            "Long": "int64", "Int": "int32", "Byte": "uint8", "Bool": "bool", "Char": "int8",
            "Float8_e4m3fn": "float8_e4m3fn", "Float8_e5m2": "float8_e5m2"}.get(str(name), str(name))


def entries_of(dump: dict[str, Any], rank: int | None) -> list[dict[str, Any]]:
    """The dump's collectives as the job's entries (p2p and entries without a sequence left out)."""
    out = []
    for e in dump.get("entries", [])[:MAX_ENTRIES]:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        seq = e.get("collective_seq_id")
        if not isinstance(seq, int):
            continue
        name = str(e.get("profiling_name") or "")
        pg = e.get("process_group")
        state = "completed" if e.get("retired") or e.get("state") == "completed" else str(e.get("state") or "")
        out.append({k: v for k, v in {
            "rank": rank, "pg": str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(e.get("pg_id", "0")),
            "seq": seq, "op": name.split(":", 1)[-1] or None, "backend": name.split(":", 1)[0] if ":" in name else None,
            "input_dtypes": [_dtype(d) for d in e.get("input_dtypes") or []],
            "input_sizes": [list(s) for s in e.get("input_sizes") or [] if isinstance(s, (list, tuple))],
            "output_dtypes": [_dtype(d) for d in e.get("output_dtypes") or []],
            "state": state, "site": _site(e.get("frames")), "timeout_ms": e.get("timeout_ms"),
        }.items() if v not in (None, "", [])})
    return out


def read_dump(source: Any) -> list[dict[str, Any]]:
    """A dump file's entries, its rank from the source's name (torch names them <prefix><rank>)."""
    from .sources import SourceError

    try:
        with open(source.path, "rb") as fh:
            data = fh.read(MAX_DUMP)
        dump = load_dump(data)
    except OSError as exc:
        raise SourceError(f"{source.path}: cannot be read ({exc.strerror or exc})") from None
    except DumpError as exc:
        raise SourceError(f"{source.path}: {exc}") from None
    rank = source.rank
    if rank is None:
        m = _RANK_IN_NAME.search(source.path)
        rank = int(m.group(1)) if m else None
    return entries_of(dump, rank)
