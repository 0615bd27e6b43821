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
from mpdoctor.commands.rules import FORMS, catalogue_dir, judge, judge_message, load_catalogue, render_template
from mpdoctor.findings import CATEGORIES

ROOT = Path(__file__).resolve().parent.parent
MESSAGES = load_catalogue(catalogue_dir())
RELEVANT = [m for m in MESSAGES if m["category"] != "not ours"]
GOAL = 0.95


@pytest.fixture(scope="module")
def rules():
    return rulebase.load(kind="log")


def test_the_catalogue_is_well_formed():
    libraries = {m["library"] for m in MESSAGES}
    assert {"torch", "accelerate", "transformers", "lightning", "deepspeed", "bitsandbytes", "peft", "diffusers",
            "xformers", "flash-attn", "torchao", "transformer-engine", "comfyui", "nccl", "cuda-runtime",
            "rocm-hip"} <= libraries, libraries
    for m in MESSAGES:
        assert m["template"] and m["version"] and m["source"], m
        assert m["category"] == "not ours" or m["category"] in CATEGORIES, m
    # torch's C++ checks from the headers the wheel ships are there, with their file
    assert any(m["source"].startswith("torch/include/") for m in MESSAGES)
    # C/C++ of the repositories too (flash-attn's csrc, Transformer Engine's NVTE_CHECK, NCCL's WARN)
    assert any(m["library"] == "flash-attn" and m["source"].startswith("csrc/") for m in MESSAGES)
    assert any(m["library"] == "nccl" and "NCCL WARN" in m["template"] for m in MESSAGES)
    # the runtimes' own tables: what torch prints after "CUDA error: " / "HIP error: "
    runtime = {m["template"]: m["category"] for m in MESSAGES if m["library"] in ("cuda-runtime", "rocm-hip")}
    assert runtime["CUDA error: out of memory"] == "out-of-memory"
    assert runtime["CUDA error: CUDA driver version is insufficient for CUDA runtime version"] == "driver-too-old"
    assert runtime["CUDA error: no kernel image is available for execution on the device"] == "no-kernel-image"
    assert runtime["CUDA error: an illegal memory access was encountered"] == "cuda-kernel-fault"
    assert runtime["HIP error: out of memory"] == "out-of-memory"
    assert len(RELEVANT) >= 1000


def test_the_relevant_messages_are_recognised(rules):
    misses = [(m["library"], m["category"], top, m["template"][:120])
              for m in RELEVANT for ok, top in [judge_message(m, rules)] if not ok]
    recognised = len(RELEVANT) - len(misses)
    assert recognised / len(RELEVANT) >= GOAL, misses


@pytest.mark.parametrize("form", [f for f in FORMS if f != "plain"])
def test_a_relevant_message_is_recognised_in_the_damaged_forms_of_pastes(rules, form):
    # each line behind "[rank1]: ", behind a logging timestamp, or hard-wrapped at 80 columns
    sample = RELEVANT[::7]
    misses = [(m["library"], m["template"][:100]) for m in sample if not judge(m, rules, form)[0]]
    assert len(misses) <= 0.05 * len(sample), misses


def test_the_damaged_forms_are_what_the_normaliser_knows():
    m = {"template": "CUDA error: an illegal memory access was encountered " + "x" * 90,
         "kind": "torch.AcceleratorError"}
    assert all(line.startswith("[rank1]: ") for line in render_template(m["template"], m["kind"], "rank").splitlines())
    assert render_template(m["template"], m["kind"], "timestamp").splitlines()[-1].startswith("2026-03-04 12:")
    wrapped = render_template(m["template"], m["kind"], "wrapped").splitlines()
    assert max(len(line) for line in wrapped) <= 80 and len(wrapped) > 4
    # a named placeholder the miner wrote is filled with its own kind of value
    warn = render_template("{host}:{pid}:{tid} [{dev}] NCCL WARN Call to connect failed", "log-error")
    assert warn == "gpu-node-3:48211:48377 [0] NCCL WARN Call to connect failed"


def test_a_runtime_error_family_is_recognised_by_a_hand_written_rule(rules):
    # the runtimes' tables and the libraries' families are recognised by hand-written rules
    # that read the family's words, not by a catch-all quoting each message
    for library in ("cuda-runtime", "nccl"):
        ms = [m for m in RELEVANT if m["library"] == library]
        by_hand = [m for m in ms for ok, _top, rule in [judge(m, rules)] if ok and not rule.startswith("catalogue-")]
        assert len(by_hand) >= 0.9 * len(ms), (library, len(by_hand), len(ms))


def test_the_coverage_command_prints_per_library_and_category():
    env = {**os.environ, "NO_COLOR": "1"}
    out = subprocess.run([sys.executable, "-m", "mpdoctor", "rules", "coverage", "--format", "json"],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["relevant"] == len(RELEVANT)
    assert data["recognised"] / data["relevant"] >= GOAL
    assert "torch" in data["libraries"] and "cuda-runtime" in data["libraries"]
    assert set(data["categories"]) <= set(CATEGORIES)
    text = subprocess.run([sys.executable, "-m", "mpdoctor", "rules", "coverage"],
                          capture_output=True, text=True, env=env, cwd=ROOT).stdout
    assert "per library" in text and "per category" in text and "relevant templates" in text
    assert "hand-written" in text and "catch-all" in text
    assert data["by_hand_written_rule"] + data["by_catch_all"] == data["recognised"]
    assert data["libraries"]["nccl"]["version"].startswith("2.")


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
