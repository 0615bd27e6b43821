"""The tree is lint-clean: `ruff check` (pyflakes' F rules and import order, configured in
pyproject.toml) runs inside the README's test command. A name used and never imported
(F821) is a check that can only crash, and a crash in a check must never pass as
"nothing found"."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent))
    if exe:
        return [exe]
    try:
        import ruff  # noqa: F401
    except ImportError:
        pytest.fail("ruff is not installed: it is part of the dev extra (pip install -e '.[dev]')")
    return [sys.executable, "-m", "ruff"]


def test_ruff_check_is_clean():
    proc = subprocess.run(_ruff() + ["check", "--no-cache", "mpdoctor", "tests", "bench", "scripts"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
