"""The message catalogue mined from the libraries' sources (catalogue/*.toml, made by
scripts/mine_catalogue.py): every relevant message, rendered as a log shows it, is
explained with its category first; the coverage command prints the figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpdoctor import rulebase
from mpdoctor.commands.rules import catalogue_dir, judge_message, load_catalogue, render_template
from mpdoctor.findings import CATEGORIES
from mpdoctor.logs.explain import explain_text

ROOT = Path(__file__).resolve().parent.parent
MESSAGES = load_catalogue(catalogue_dir())
RELEVANT = [m for m in MESSAGES if m["category"] != "not ours"]
GOAL = 0.95


@pytest.fixture(scope="module")
def rules():
    return rulebase.load(kind="log")


def test_the_catalogue_is_well_formed():
    libraries = {m["library"] for m in MESSAGES}
    assert {"torch", "accelerate", "transformers", "lightning"} <= libraries, libraries
    for m in MESSAGES:
        assert m["template"] and m["version"] and m["source"], m
        assert m["category"] == "not ours" or m["category"] in CATEGORIES, m
    # torch's C++ checks from the headers the wheel ships are there, with their file
    assert any(m["source"].startswith("torch/include/") for m in MESSAGES)
    assert len(RELEVANT) >= 300


def test_the_relevant_messages_are_recognised(rules):
    misses = [(m["library"], m["category"], top, m["template"][:120])
              for m in RELEVANT for ok, top in [judge_message(m, rules)] if not ok]
    recognised = len(RELEVANT) - len(misses)
    assert recognised / len(RELEVANT) >= GOAL, misses


def test_a_relevant_message_is_recognised_behind_rank_prefixes(rules):
    # the damaged form every multi-process paste has: each line behind "[rank1]: "
    misses = []
    for m in RELEVANT[::7]:
        text = "\n".join("[rank1]: " + line for line in render_template(m["template"], m["kind"]).splitlines())
        report = explain_text(text, rules)
        if not report.findings or report.findings[0].category != m["category"]:
            misses.append(m["template"][:100])
    assert len(misses) <= 0.05 * len(RELEVANT[::7]), misses


def test_the_coverage_command_prints_per_library_and_category():
    env = {**os.environ, "NO_COLOR": "1"}
    out = subprocess.run([sys.executable, "-m", "mpdoctor", "rules", "coverage", "--format", "json"],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["relevant"] == len(RELEVANT)
    assert data["recognised"] / data["relevant"] >= GOAL
    assert any(k.startswith("torch ") for k in data["libraries"])
    assert set(data["categories"]) <= set(CATEGORIES)
    text = subprocess.run([sys.executable, "-m", "mpdoctor", "rules", "coverage"],
                          capture_output=True, text=True, env=env, cwd=ROOT).stdout
    assert "per library" in text and "per category" in text and "relevant templates" in text


def test_a_missing_catalogue_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mpdoctor", "rules", "coverage", "--catalogue",
                          str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert out.returncode == 2 and "no catalogue folder" in out.stderr and "Traceback" not in out.stderr


def test_the_coverage_command_stays_off_explains_start_path():
    # explain's fast path must not import the coverage code's catalogue reading
    code = ("import sys, mpdoctor.cli as c; sys.argv=['mpdoctor','explain','-']; "
            "import io; sys.stdin=io.StringIO('hello'); "
            "\ntry:\n c.main()\nexcept SystemExit: pass\n"
            "print('tomllib' in sys.modules and 'mpdoctor.commands.rules' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip().endswith("False"), out.stdout + out.stderr
