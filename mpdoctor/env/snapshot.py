"""The one loader: a recorded snapshot file and a live collection both come through
`normalise_snapshot`, so every rule sees the same shape whichever it was."""

from __future__ import annotations

import json
import sys
from typing import Any

from . import SCHEMA_VERSION, SnapshotError

# Section -> (expected type, default). A missing section is an empty one (an older or
# hand-trimmed snapshot); a section of the wrong type is an error naming the field.
_SECTIONS: dict[str, tuple[type, Any]] = {
    "platform": (dict, {}),
    "cpu": (dict, {}),
    "memory": (dict, {}),
    "packages": (dict, {}),
    "accelerate_config": (dict, {}),
    "env": (dict, {}),
    "nvml": (dict, {"status": "unknown"}),
    "torch": (dict, {"status": "unknown"}),
}
_LISTS = (("torch", "devices"), ("torch", "arch_list"), ("torch", "warnings"), ("nvml", "gpus"))


def normalise_snapshot(data: Any) -> dict[str, Any]:
    """Validate a snapshot (schema 1) and fill absent sections. Raises SnapshotError."""
    try:
        data = json.loads(json.dumps(data, default=str))  # plain JSON types, as from a file
    except (TypeError, ValueError) as exc:
        raise SnapshotError(f"the snapshot is not JSON data: {exc}") from None
    if not isinstance(data, dict):
        raise SnapshotError("a snapshot is a JSON object; this is a " + type(data).__name__)
    schema = data.get("schema")
    if schema is None:
        raise SnapshotError("not an mpdoctor snapshot (no \"schema\" key); make one with `mpdoctor collect -o FILE`")
    if not isinstance(schema, int) or schema < 1:
        raise SnapshotError(f"\"schema\" must be a positive integer, not {schema!r}")
    if schema > SCHEMA_VERSION:
        raise SnapshotError(f"the snapshot has schema {schema}, newer than this mpdoctor reads "
                            f"({SCHEMA_VERSION}); upgrade mpdoctor")
    for name, (kind, default) in _SECTIONS.items():
        value = data.get(name)
        if value is None:
            data[name] = json.loads(json.dumps(default))
        elif not isinstance(value, kind):
            raise SnapshotError(f"\"{name}\" must be a JSON object, not {type(value).__name__}")
    for section, key in _LISTS:
        value = data[section].get(key)
        if value is None:
            data[section][key] = []
        elif not isinstance(value, list):
            raise SnapshotError(f"\"{section}.{key}\" must be a list, not {type(value).__name__}")
    for i, dev in enumerate(data["torch"]["devices"]):
        if not isinstance(dev, dict):
            raise SnapshotError(f"\"torch.devices[{i}]\" must be an object")
    for i, gpu in enumerate(data["nvml"]["gpus"]):
        if not isinstance(gpu, dict):
            raise SnapshotError(f"\"nvml.gpus[{i}]\" must be an object")
    pk = data["packages"]
    for key in ("versions", "nvidia_wheels", "requires"):
        if not isinstance(pk.get(key), dict):
            pk[key] = {}
    return data


def read_snapshot_file(path: str) -> dict[str, Any]:
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
    except FileNotFoundError:
        raise SnapshotError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SnapshotError(f"{path}: is a folder, not a snapshot file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"{path}: cannot be read ({exc})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SnapshotError(f"{path}: not valid JSON ({exc})") from None
    try:
        return normalise_snapshot(data)
    except SnapshotError as exc:
        raise SnapshotError(f"{path}: {exc}") from None
