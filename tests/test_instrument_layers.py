"""The instrumentation records and never judges: `mpdoctor/instrument/` imports no face
(env, run, probe, the log pipeline, engine, commands), only knowledge/ and itself; the
judging of what it records is `mpdoctor/api.py`'s (which calls the run face)."""

from __future__ import annotations

import ast
from pathlib import Path

INSTRUMENT = Path(__file__).resolve().parent.parent / "mpdoctor" / "instrument"
ALLOWED = ("mpdoctor.instrument", "mpdoctor.knowledge")


def _imports(path: Path) -> list[str]:
    """The mpdoctor modules a file imports (relative imports resolved), at any depth."""
    package = "mpdoctor.instrument"
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "mpdoctor"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            if name.split(".")[0] == "mpdoctor":
                out += [name] if node.module else [f"{name}.{a.name}" for a in node.names]
    return out


def test_instrument_imports_no_face() -> None:
    files = sorted(INSTRUMENT.glob("*.py"))
    assert len(files) >= 10
    wrong = {f"{p.name}: {m}" for p in files for m in _imports(p) if not m.startswith(ALLOWED)}
    assert not wrong, sorted(wrong)


def test_every_instrument_module_stays_under_400_lines() -> None:
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in INSTRUMENT.glob("*.py")}
    assert all(n < 400 for n in sizes.values()), sizes


def test_the_checker_sees_a_face_import() -> None:
    """Not blind: a relative import of the run face is caught."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        bad = Path(tmp) / "bad.py"
        bad.write_text("from ..run.diagnose import judge_run\nfrom . import records\n")
        assert _imports(bad) == ["mpdoctor.run.diagnose", "mpdoctor.instrument.records"]
