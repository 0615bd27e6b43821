"""The one loader: a recorded snapshot file and a live collection both come through
`normalise_snapshot`, so every rule sees the same shape whichever it was.

Every field the rules read is declared here with its type (docs/snapshot-schema.md).
A snapshot is checked against it before any rule looks: a field of the wrong type, a
number too large to be a size or a count, or a document nested deeper than any
snapshot is, is refused with a SnapshotError naming the field (`check --snapshot`
exits 2), never a traceback from deep inside a rule. A missing section or field is
an absent one; unknown keys are ignored (later versions may add keys); null is
accepted wherever a collector may leave it (a query the GPU does not support).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from . import SCHEMA_VERSION, SnapshotError

MAX_DEPTH = 64                 # the schema nests 6 levels; a user config a few more
MAX_BYTES = 64 * 1024 * 1024   # a snapshot is ~20 KB
_INT_LIMIT = 2 ** 63

# --- the schema --------------------------------------------------------------------------------
# A type is "str", "int", "num", "bool", "any" (free-form: the user's own config), a
# dict (an object with these known keys), ("list", type) or ("map", type) (an object
# whose every value has that type).
_ERROR = {"type": "str", "message": "str", "frames": ("list", "str")}
_ERRORS = ("map", _ERROR)

SCHEMA: dict[str, Any] = {
    "schema": "int", "mpdoctor_version": "str", "collected_at": "str", "anonymized": "bool",
    "timings": ("map", "num"),
    "platform": {"system": "str", "release": "str", "machine": "str", "libc": "str", "mac_version": "str",
                 "python": "str", "python_implementation": "str", "executable": "str", "in_container": "bool",
                 "os": "str", "error": _ERROR},
    # added within schema 1 (absent from older snapshots, which load as they did)
    "threads": {"env": ("map", "str"), "affinity_cores": "int", "error": _ERROR},
    "cuda_toolkit": {"cuda_home": "str", "cuda_home_from": "str", "nvcc": "str", "nvcc_version": "str",
                     "error": _ERROR},
    "cpu": {"model": "str", "logical_cores": "int", "flags": ("map", "bool"), "error": _ERROR},
    "memory": {"total_bytes": "int", "available_bytes": "int", "swap_total_bytes": "int", "error": _ERROR},
    "packages": {"versions": ("map", "str"), "nvidia_wheels": ("map", "str"),
                 "requires": ("map", ("list", "str")), "error": _ERROR},
    "accelerate_config": {
        "path": "str", "source": "str", "exists": "bool", "config": "any", "error": _ERROR,
        "deepspeed": {"path": "str", "resolved_path": "str", "exists": "bool", "config": "any", "error": _ERROR},
    },
    "env": ("map", "str"),
    "nvml": {
        "status": "str", "error": _ERROR, "errors": _ERRORS, "exit_status": "int", "stderr_tail": ("list", "str"),
        "driver_version": "str", "cuda_driver_version": "int", "nvml_version": "str",
        "gpus": ("list", {
            "index": "int", "name": "str", "uuid": "str", "pci_bus_id": "str", "capability": ("list", "int"),
            "memory": {"total_bytes": "int", "used_bytes": "int", "free_bytes": "int"},
            "processes": ("list", {"pid": "int", "used_memory_bytes": "int", "kind": "str", "name": "str",
                                   "mpdoctor": "bool"}),
            "mig_mode": "str", "persistence_mode": "bool", "ecc_mode": "bool",
            "ecc_uncorrected_volatile": "int", "ecc_uncorrected_aggregate": "int",
            "error": _ERROR, "errors": _ERRORS,
        }),
    },
    "torch": {
        "status": "str", "python": "str", "seconds": "num", "import_seconds": "num", "exit_status": "int",
        "error": _ERROR, "errors": _ERRORS, "stderr_tail": ("list", "str"),
        "version": "str", "path": "str", "cuda_build": "str", "hip_build": "str", "debug_build": "bool",
        "num_threads": "int", "num_interop_threads": "int",
        "arch_list": ("list", "str"), "cuda_available": "bool", "device_count": "int", "cudnn": "int",
        "nccl": "str", "bf16_has_including_emulation": "bool", "devices_unread": "str",
        "devices": ("list", {
            "index": "int", "name": "str", "capability": ("list", "int"), "total_memory_bytes": "int",
            "multi_processor_count": "int", "gcn_arch": "str", "uuid": "str", "bf16_supported": "bool",
            "bf16_native": "bool", "error": _ERROR, "errors": _ERRORS,
        }),
        "warnings": ("list", "str"),
        "tf32": {"matmul_allow_tf32": "bool", "cudnn_allow_tf32": "bool", "float32_matmul_precision": "str",
                 "matmul_fp32_precision": "str", "errors": _ERRORS},
        "mps": {"built": "bool", "available": "bool", "macos_14_or_newer": "bool", "errors": _ERRORS},
        "cpu": {"capability": "str", "avx512_bf16": "bool", "amx_tile": "bool", "amx_fp16": "bool",
                "mkldnn_bf16": "bool", "errors": _ERRORS},
    },
}

# Section -> default when absent. A missing section is an empty one (an older or
# hand-trimmed snapshot).
_SECTIONS: dict[str, Any] = {
    "platform": {}, "cpu": {}, "memory": {}, "packages": {}, "accelerate_config": {}, "env": {},
    "nvml": {"status": "unknown"}, "torch": {"status": "unknown"},
}
_LISTS = (("torch", "devices"), ("torch", "arch_list"), ("torch", "warnings"), ("nvml", "gpus"))
_KIND_WORDS = {"str": "a string", "int": "a whole number", "num": "a number", "bool": "true or false"}


def _what(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}" if len(repr(value)) <= 24 else "a number of " + str(len(repr(value))) + " digits"
    if isinstance(value, str):
        return "a string"
    return {"dict": "an object", "list": "a list"}.get(type(value).__name__, type(value).__name__)


def _field(path: str, value: Any, want: str) -> SnapshotError:
    return SnapshotError(f"\"{path}\" must be {want}, not {_what(value)}")


def _check(value: Any, kind: Any, path: str, repaired: list[str] | None = None) -> None:
    """Raise SnapshotError at the first field of `value` that is not of `kind`; with
    `repaired` (a live collection: a library answered something odd), set such a field
    to null instead, note its path there, and go on."""
    if value is None or kind == "any":
        return  # absent, a query that did not answer, or free-form
    if isinstance(kind, str):
        problem = _scalar_problem(value, kind)
        if problem:
            raise _field(path, value, problem)
        return
    if isinstance(kind, dict):
        if not isinstance(value, dict):
            raise _field(path, value, "an object")
        items = [(key, value[key], sub, f"{path}.{key}" if path else key) for key, sub in kind.items() if key in value]
    elif kind[0] == "list":
        if not isinstance(value, list):
            raise _field(path, value, "a list")
        items = [(i, item, kind[1], f"{path}[{i}]") for i, item in enumerate(value)]
    else:  # ("map", type)
        if not isinstance(value, dict):
            raise _field(path, value, "an object")
        items = [(key, item, kind[1], f"{path}.{key}") for key, item in value.items()]
    for key, item, sub, where in items:
        try:
            if item is None and isinstance(value, list):  # a list holds values; null is no value
                raise _field(where, item, "an object" if isinstance(sub, dict) else _KIND_WORDS.get(sub, "a value"))
            _check(item, sub, where, repaired)
        except SnapshotError:
            if repaired is None or isinstance(value, list):
                raise  # a list with a bad item is nulled whole, by its parent: no holes in lists
            repaired.append(where)
            value[key] = None


def _scalar_problem(value: Any, kind: str) -> str | None:
    """What `value` must be instead, or None when it is a `kind`."""
    if kind == "str":
        return None if isinstance(value, str) else "a string"
    if kind == "bool":
        return None if isinstance(value, bool) else "true or false"
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return "a whole number"
        return None if abs(value) < _INT_LIMIT else "a whole number below 2**63"
    if kind == "num":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "a number"
        return None if math.isfinite(float(value)) and abs(value) < _INT_LIMIT else "a finite number below 2**63"
    return None


def _check_depth(data: Any) -> None:
    """Refuse a document nested deeper than MAX_DEPTH, without recursion."""
    stack: list[tuple[Any, int, str]] = [(data, 0, "")]
    while stack:
        obj, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            raise SnapshotError(f"\"{path.split('.')[0] or 'the snapshot'}\" is nested more than {MAX_DEPTH} levels deep")
        if isinstance(obj, dict):
            stack.extend((v, depth + 1, f"{path}.{k}" if path else str(k)) for k, v in obj.items())
        elif isinstance(obj, list):
            stack.extend((v, depth + 1, path) for v in obj)


def normalise_snapshot(data: Any, repair: bool = False) -> dict[str, Any]:
    """Validate a snapshot (schema 1) and fill absent sections. Raises SnapshotError.
    `repair` (a live collection, not a file): a field of the wrong type becomes null and
    its path is listed under "repaired_fields", instead of refusing the snapshot."""
    if isinstance(data, dict):
        _check_depth(data)
    try:
        data = json.loads(json.dumps(data, default=str))  # plain JSON types, as from a file
    except (TypeError, ValueError) as exc:
        raise SnapshotError(f"the snapshot is not JSON data: {exc}") from None
    except RecursionError:
        raise SnapshotError(f"the snapshot is nested more than {MAX_DEPTH} levels deep") from None
    if not isinstance(data, dict):
        raise SnapshotError("a snapshot is a JSON object; this is " + _what(data))
    schema = data.get("schema")
    if schema is None:
        raise SnapshotError("not an mpdoctor snapshot (no \"schema\" key); make one with `mpdoctor collect -o FILE`")
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        raise SnapshotError(f"\"schema\" must be a positive integer, not {_what(schema)}")
    if schema > SCHEMA_VERSION:
        raise SnapshotError(f"the snapshot has schema {schema}, newer than this mpdoctor reads "
                            f"({SCHEMA_VERSION}); upgrade mpdoctor")
    for name, default in _SECTIONS.items():
        value = data.get(name)
        if value is None:
            data[name] = json.loads(json.dumps(default))
        elif not isinstance(value, dict):
            raise SnapshotError(f"\"{name}\" must be a JSON object, not {_what(value)}")
    repaired: list[str] | None = [] if repair else None
    _check(data, SCHEMA, "", repaired)
    if repaired:
        data["repaired_fields"] = repaired
    for section, key in _LISTS:
        if data[section].get(key) is None:
            data[section][key] = []
    for gpu in data["nvml"]["gpus"]:  # a list the rules iterate: null is an empty one
        if isinstance(gpu, dict) and gpu.get("processes") is None and "processes" in gpu:
            gpu["processes"] = []
    for section in ("nvml", "torch"):
        if not isinstance(data[section].get("status"), str):
            data[section]["status"] = "unknown"
    pk = data["packages"]
    for key in ("versions", "nvidia_wheels", "requires"):
        if not isinstance(pk.get(key), dict):
            pk[key] = {}
    return data


def read_snapshot_file(path: str) -> dict[str, Any]:
    try:
        if path == "-":
            text = sys.stdin.read(MAX_BYTES + 1)
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise SnapshotError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SnapshotError(f"{path}: is a folder, not a snapshot file") from None
    except UnicodeDecodeError as exc:
        raise SnapshotError(f"{path}: not a snapshot (not UTF-8 text at byte {exc.start})") from None
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(text) > MAX_BYTES:
        raise SnapshotError(f"{path}: too large for a snapshot (more than {MAX_BYTES // (1024 * 1024)} MB)")
    try:
        data = json.loads(text)
    except RecursionError:
        raise SnapshotError(f"{path}: nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:
        raise SnapshotError(f"{path}: not valid JSON ({str(exc).splitlines()[0][:200]})") from None
    try:
        return normalise_snapshot(data)
    except SnapshotError as exc:
        raise SnapshotError(f"{path}: {exc}") from None
