"""`mpdoctor explain PATH` is read without argparse (its import and parser cost a few ms
of explain's start): the fast path must give exactly what argparse gives, and leave
everything else to argparse."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpdoctor import cli

ROOT = Path(__file__).resolve().parent.parent

SAME = [
    ["explain", "train.log"],
    ["explain", "-"],
    ["explain", "explain"],
    ["explain", "a=b.log"],
    ["explain", "train.log", "--format", "json"],
    ["explain", "--format", "markdown", "train.log"],
    ["explain", "--format=oneline", "train.log"],
    ["explain", "train.log", "--anonymize", "-v"],
    ["explain", "-v", "--verbose", "train.log", "--here", "--format", "terminal", "--format", "json"],
]

ARGPARSE = [
    [], ["explain"], ["--help"], ["explain", "--help"], ["explain", "-h"], ["--version"],
    ["explain", "a.log", "b.log"], ["explain", "--format", "xml", "a.log"], ["explain", "--format"],
    ["explain", "--form", "json", "a.log"], ["explain", "--anon", "a.log"], ["explain", "a.log", "--rules", "d"],
    ["explain", "a.log", "--snapshot", "s.json"], ["explain", "--", "-odd.log"], ["explain", "-1"],
    ["explain", ""], ["explain", "a.log", "-vv"], ["explain", "a.log", "--anonymize=1"], ["check"],
    ["-v", "explain", "a.log"],
]


@pytest.mark.parametrize("argv", SAME, ids=" ".join)
def test_fast_path_reads_what_argparse_reads(argv):
    fast = cli.fast_explain_args(argv)
    assert fast is not None
    slow = cli.build_parser("explain").parse_args(argv)
    assert vars(fast) == vars(slow)


@pytest.mark.parametrize("argv", ARGPARSE, ids=lambda a: " ".join(a) or "nothing")
def test_everything_else_goes_to_argparse(argv):
    assert cli.fast_explain_args(argv) is None


def test_explain_imports_no_argparse_nor_shutil(tmp_path):
    log = tmp_path / "t.log"
    log.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                   "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    code = ("import sys, runpy; sys.argv = ['mpdoctor', 'explain', sys.argv[1], '--format', 'json']\n"
            "try:\n    runpy.run_module('mpdoctor', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write(' '.join(m for m in ('argparse', 'shutil', 'dataclasses') if m in sys.modules))\n")
    for _ in range(2):  # the first run may build the rule cache (a cold cache reads TOML and more)
        out = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "MPDOCTOR_CACHE_DIR": str(tmp_path / "c")})
    assert '"rule": "cuda-oom"' in out.stdout
    assert "argparse" not in out.stderr.split() and "shutil" not in out.stderr.split()
