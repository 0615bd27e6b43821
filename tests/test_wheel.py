"""The built wheel carries the rules and fixtures and works installed elsewhere.

Built with `python -m build --wheel --no-isolation` (hatchling from the dev extra, so no
network), installed with --no-deps into a plain venv (no system or dev site-packages),
whose only third-party packages are the core dependencies (rich and its own, psutil,
nvidia-ml-py, packaging, PyYAML), copied from the dev venv; then `mpdoctor explain` and `mpdoctor rules test` run from another folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_DEPS = ("rich", "pygments", "markdown_it", "mdurl", "psutil", "pynvml", "packaging", "yaml")  # the core dependencies


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    pytest.importorskip("hatchling")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    # build from a copy of the tracked tree, as a clean clone would
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, files):
        rel = Path(name.decode())
        if not (ROOT / rel).is_file():
            continue
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    dist = tmp / "dist"
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = dist.glob("mpdoctor-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                           "--quiet", str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # rich and its dependencies only, linked from the dev venv (no network, no torch)
    deps = tmp / "deps"
    deps.mkdir()
    for name in RUNTIME_DEPS:
        mod = __import__(name)
        path = Path(mod.__file__)
        if path.name == "__init__.py":
            shutil.copytree(path.parent, deps / name)
        else:  # a one-file module (pynvml)
            shutil.copy2(path, deps / path.name)
    (site / "mpdoctor-test-deps.pth").write_text(str(deps) + "\n")
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return wheel, venv, elsewhere


def run(venv, elsewhere, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MPDOCTOR_RULES_PATH", "VIRTUAL_ENV")}
    env["MPDOCTOR_CACHE_DIR"] = str(elsewhere / "cache")
    return subprocess.run([str(venv / "bin" / "mpdoctor"), *args], cwd=elsewhere, capture_output=True, text=True,
                          env=env, timeout=300)


def test_wheel_carries_rules_and_fixtures(installed):
    wheel, _, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert "mpdoctor/builtin_rules/log/out-of-memory/cuda-oom.toml" in names
    assert "mpdoctor/fixtures/logs/forms/torchrun-tee-default-prefix.log" in names
    assert len([n for n in names if n.startswith("mpdoctor/builtin_rules/") and n.endswith(".toml")]) == \
        len(list((ROOT / "rules").rglob("*.toml")))


def test_installed_explain_runs_from_another_folder(installed):
    _, venv, elsewhere = installed
    log = elsewhere / "crash.log"
    shutil.copy(ROOT / "fixtures" / "logs" / "forms" / "slurm-srun-label.log", log)
    proc = run(venv, elsewhere, "explain", "crash.log", "--format", "json")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["findings"][0]["rule"] == "cuda-oom"
    proc = run(venv, elsewhere, "explain", "crash.log")  # the rich terminal output
    assert proc.returncode == 1 and "The GPU ran out of memory" in proc.stdout
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import mpdoctor, importlib.util as u; print(mpdoctor.__file__); "
                            "print(u.find_spec('torch') is None)"],
                           cwd=elsewhere, capture_output=True, text=True, check=True).stdout.split()
    assert not where[0].startswith(str(ROOT)) and "site-packages" in where[0]
    assert where[1] == "True"  # the fresh venv has no torch: explain never needed it


def test_installed_rules_test_finds_the_shipped_examples(installed):
    _, venv, elsewhere = installed
    proc = run(venv, elsewhere, "rules", "test", "--format", "json")
    data = json.loads(proc.stdout)
    assert data["rules"] >= 1 and data["cases"] >= 2
    # examples that point at fixtures/ are found inside the wheel: no "cannot read example file"
    assert not [f for f in data["failed"] if "cannot read" in f["message"] or "no such file" in f["message"]]
    oom = [f for f in data["failed"] if f["rule"] == "cuda-oom"]
    assert oom == []


def test_installed_core_answers_check_and_probe_without_torch(installed):
    """The core install (no torch) judges what it can and says what it cannot."""
    _, venv, elsewhere = installed
    proc = run(venv, elsewhere, "check", "--format", "json")
    assert proc.returncode == 2, proc.stderr  # torch could not be judged here: not a green exit (README)
    assert "Traceback" not in proc.stderr
    data = json.loads(proc.stdout)
    assert data["schema"].startswith("mpdoctor.check/")
    assert any("torch is not installed" in s["reason"] for s in data["skipped"]), data["skipped"]
    proc = run(venv, elsewhere, "check")
    assert "torch is not installed" in proc.stdout
    proc = run(venv, elsewhere, "probe", "--help")
    assert proc.returncode == 0 and "--modes" in proc.stdout
    proc = run(venv, elsewhere, "probe")
    assert proc.returncode == 2 and "torch" in proc.stderr + proc.stdout and "Traceback" not in proc.stderr
