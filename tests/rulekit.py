"""Tiny rule folders for engine tests: real TOML files in a tmp dir, loaded the normal way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mpdoctor import rulebase
from mpdoctor.engine import rulecache


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test gets its own rule cache and no user rules folder (import it to use it)."""
    monkeypatch.setenv("MPDOCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MPDOCTOR_NO_CACHE", raising=False)
    monkeypatch.delenv("MPDOCTOR_RULES_PATH", raising=False)
    rulecache.reset()
    yield
    rulecache.reset()


def rules_in(tmp_path: Path, *specs: tuple[str, dict]) -> list:
    """A tmp rules folder holding one file per (id, fields), loaded the normal way."""
    folder = tmp_path / "rules"
    for rid, fields in specs:
        write_rule(folder, rid, **fields)
    return rulebase.load_folder(folder)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        if "'''" in v:
            raise ValueError("no ''' in test strings")
        return "'''" + v + "'''"
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v))


def rule_toml(rid: str, **fields: Any) -> str:
    """A log rule's TOML; a plain, valid rule unless fields say otherwise."""
    data: dict[str, Any] = {
        "id": rid,
        "category": "cuda-kernel-fault",
        "severity": "error",
        "title": f"{rid} happened",
        "patterns": [f"{rid.upper()} FAILED"],
        "explanation": ["Because."],
        "fixes": ["Do the fix."],
    }
    examples = fields.pop("examples", [{"text": f"{rid.upper()} FAILED here"}])
    near = fields.pop("near_misses", [{"text": "all is well"}])
    doc = fields.pop("doc", None)
    for k, v in fields.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items()]
    if doc:
        lines.append("[doc]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in doc.items()]
    for ex in examples:
        lines.append("[[example]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in ex.items()]
    for ex in near:
        lines.append("[[near_miss]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in ex.items()]
    return "\n".join(lines) + "\n"


def write_rule(folder: Path, rid: str, **fields: Any) -> Path:
    path = folder / "log" / f"{rid}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(rule_toml(rid, **fields))
    return path
