"""The environment faces (`check`, `collect`, `explain --here`) against what breaks them:
a libnvidia-ml that segfaults, a torch whose import leaves helpers holding the output,
hostile accelerate configs (huge, billion laughs, deeply nested, invalid with a secret
in the bad line), snapshots of the wrong shape (a mutation test over every fixture
field), a core install without torch, and `--python` for the interpreter that trains.

Real processes and files throughout; the segfaulting NVML is a real shared library
built from a few lines of C (skipped where no C compiler exists)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest

from mpdoctor.cli import main
from mpdoctor.env.accel_config import MAX_DEPTH, MAX_YAML_BYTES, collect_accelerate_config

ROOT = Path(__file__).resolve().parent.parent
SNAPS = ROOT / "fixtures" / "snapshots"
MPDOCTOR = [sys.executable, "-m", "mpdoctor"]
FP16_CPU_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: 'NO'
mixed_precision: fp16
num_processes: 1
use_cpu: true
"""


def run(args, env=None, timeout=60, cwd=ROOT):
    full = dict(os.environ)
    full.update(env or {})
    t0 = time.monotonic()
    r = subprocess.run(MPDOCTOR + args, capture_output=True, text=True, env=full, timeout=timeout, cwd=cwd)
    r.seconds = time.monotonic() - t0  # type: ignore[attr-defined]
    return r


def fast_broken_torch(tmp_path: Path, body: str = "raise ImportError('fake torch for the test')\n") -> str:
    """A folder for PYTHONPATH whose `torch` answers at once (no 3 s real import)."""
    pkg = tmp_path / "faketorch" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    return str(tmp_path / "faketorch")


def process_gone(pid: int) -> bool:
    """Dead or a zombie (a container's pid 1 may never reap the orphan we killed)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def wait_gone(pid: int, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process_gone(pid):
            return True
        time.sleep(0.05)
    return process_gone(pid)


def check_in_process(capsys, *args: str) -> tuple[int, str]:
    rc = main(["check", *args])
    out = capsys.readouterr()
    return rc, out.out + out.err


# --- 1. NVML in a child: a segfaulting libnvidia-ml is a fact ------------------------------------

@pytest.fixture(scope="module")
def segfaulting_nvml(tmp_path_factory) -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler to build a fake libnvidia-ml.so.1")
    d = tmp_path_factory.mktemp("nvml")
    (d / "fake.c").write_text("int nvmlInitWithFlags(unsigned int f) { volatile int *p = 0; *p = f; return 0; }\n"
                              "int nvmlInit_v2(void) { volatile int *p = 0; *p = 1; return 0; }\n")
    r = subprocess.run([cc, "-shared", "-fPIC", "-o", str(d / "libnvidia-ml.so.1"), str(d / "fake.c")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot build the fake library: {r.stderr[:200]}")
    return str(d)


@pytest.mark.slow
def test_segfaulting_nvml_is_reported_not_fatal(segfaulting_nvml, tmp_path, capsys):
    env = {"LD_LIBRARY_PATH": segfaulting_nvml, "PYTHONPATH": fast_broken_torch(tmp_path)}
    # the library really crashes whoever loads it
    crash = subprocess.run([sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"], env={**os.environ, **env},
                           capture_output=True)
    assert crash.returncode == -11
    r = run(["collect"], env)
    assert r.returncode == 0, r.stderr
    nvml = json.loads(r.stdout)["nvml"]
    assert nvml["status"] == "crashed"
    assert nvml["error"]["message"] == "NVML crashed: signal SIGSEGV"
    # check collects the same way (one live run is enough); what it prints of the crash:
    recorded = tmp_path / "snap.json"
    recorded.write_text(r.stdout)
    rc, out = check_in_process(capsys, "--snapshot", str(recorded))
    assert rc in (0, 1) and "GPU: none visible (NVML crashed: signal SIGSEGV)" in out
    log = tmp_path / "train.log"
    log.write_text("RuntimeError: CUDA error: no kernel image is available for execution on the device\n")
    r = run(["explain", str(log), "--here"], env)
    assert r.returncode in (0, 1), r.stderr
    assert "Traceback" not in r.stdout + r.stderr


@pytest.mark.slow
def test_hanging_nvml_costs_at_most_its_timeout(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build a fake libnvidia-ml.so.1")
    (tmp_path / "hang.c").write_text("#include <unistd.h>\n"
                                     "int nvmlInitWithFlags(unsigned int f) { sleep(60); return 0; }\n")
    r = subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libnvidia-ml.so.1"), str(tmp_path / "hang.c")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot build the fake library: {r.stderr[:200]}")
    r = run(["collect"], {"LD_LIBRARY_PATH": str(tmp_path), "MPDOCTOR_NVML_TIMEOUT": "1",
                          "PYTHONPATH": fast_broken_torch(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert r.seconds < 10
    nvml = json.loads(r.stdout)["nvml"]
    assert nvml["status"] == "timeout" and "did not answer within 1 s" in nvml["error"]["message"]


# --- 2. the torch child in its own process group -------------------------------------------------

HELPER_THEN = """\
import os, subprocess
helper = subprocess.Popen(["sleep", "60"])  # inherits stdout and stderr, as a compile worker would
open(os.environ["HELPER_PID_FILE"], "w").write(str(helper.pid))
{after}
"""


@pytest.mark.slow
@pytest.mark.parametrize("after, status", [
    ("import time; time.sleep(60)", "timeout"),              # the import hangs: killed at the deadline
    ("raise ImportError('helper started, then failed')", "import-error"),  # the import ends, the helper lives on
])
def test_a_helper_holding_the_pipes_cannot_hold_up_collect(tmp_path, after, status):
    pid_file = tmp_path / "helper.pid"
    path = fast_broken_torch(tmp_path, HELPER_THEN.format(after=after))
    r = run(["collect"], {"PYTHONPATH": path, "MPDOCTOR_TORCH_TIMEOUT": "2", "HELPER_PID_FILE": str(pid_file)})
    assert r.returncode == 0, r.stderr
    assert r.seconds < 15, f"collect took {r.seconds:.1f} s with MPDOCTOR_TORCH_TIMEOUT=2"
    assert json.loads(r.stdout)["torch"]["status"] == status
    helper = int(pid_file.read_text())
    assert wait_gone(helper), "the helper the torch import started was left running"


def test_torch_timeout_that_is_not_a_number_falls_back(monkeypatch):
    from mpdoctor.env.torch_collector import DEFAULT_TIMEOUT, timeout_from_env

    for bad in ("nan", "inf", "-3", "0", "soon"):
        monkeypatch.setenv("MPDOCTOR_TORCH_TIMEOUT", bad)
        assert timeout_from_env() == DEFAULT_TIMEOUT
    monkeypatch.setenv("MPDOCTOR_TORCH_TIMEOUT", "2.5")
    assert timeout_from_env() == 2.5


def test_child_runner_kills_the_whole_group_at_the_deadline(tmp_path):
    from mpdoctor.env import child

    script = tmp_path / "s.py"
    script.write_text("import subprocess, sys, time\n"
                      "p = subprocess.Popen(['sleep', '60'])\n"
                      "print(p.pid, flush=True)\n"
                      "time.sleep(60)\n")
    t0 = time.monotonic()
    o = child.start(sys.executable, str(script), [], timeout=1.0).finish()
    assert time.monotonic() - t0 < 5
    assert o.timed_out and o.death("the script").endswith("killed")
    assert wait_gone(int(o.stdout.split()[0]))


def test_child_runner_reports_a_crash_by_signal(tmp_path):
    from mpdoctor.env import child

    script = tmp_path / "s.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    o = child.start(sys.executable, str(script), [], timeout=20).finish()
    assert not o.timed_out and o.signal == "SIGSEGV"
    assert o.death("NVML") == "NVML crashed: signal SIGSEGV"
    missing = child.start(str(tmp_path / "no-python"), str(script), [], timeout=5).finish()
    assert missing.spawn_error and "no-python" in missing.spawn_error["message"]


# --- 3. accelerate and DeepSpeed configs: capped, bounded, no line quoted ---------------------------

def test_config_too_large_is_a_clear_finding(tmp_path, capsys):
    cfg = tmp_path / "big.yaml"
    cfg.write_text("mixed_precision: fp16\n" + "# padding\n" * (MAX_YAML_BYTES // 10 + 10))
    sec = collect_accelerate_config(str(cfg))
    assert sec["exists"] and "too large to read" in sec["error"]["message"]
    rc, out = check_in_process(capsys, "--snapshot", str(SNAPS / "dev-cpu-fp16.json"), "--config-file", str(cfg))
    assert rc == 1 and "too large to read" in out and "no accelerate config file" not in out


def test_billion_laughs_is_refused_quickly(tmp_path):
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 10) + "]")
    cfg = tmp_path / "lol.yaml"
    cfg.write_text("\n".join(lines) + "\nmixed_precision: fp16\n")
    t0 = time.monotonic()
    sec = collect_accelerate_config(str(cfg))
    assert time.monotonic() - t0 < 2
    assert "more than 100,000 values" in sec["error"]["message"]


@pytest.mark.parametrize("name, text", [
    ("deep.yaml", "mixed_precision: fp16\nx: " + "[" * 5000 + "]" * 5000 + "\n"),
    ("deep-block.yaml", "mixed_precision: fp16\n" + "".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "v: 1\n"),
    ("deep.json", '{"mixed_precision": "fp16", "x": ' + "[" * 100000 + "]" * 100000 + "}"),
])
def test_deeply_nested_config_is_unreadable_with_the_reason(tmp_path, capsys, name, text):
    cfg = tmp_path / name
    cfg.write_text(text)
    sec = collect_accelerate_config(str(cfg))
    assert sec["exists"] and f"nested more than {MAX_DEPTH} levels deep" in sec["error"]["message"]
    rc, out = check_in_process(capsys, "--snapshot", str(SNAPS / "dev-cpu-fp16.json"), "--config-file", str(cfg))
    assert rc == 1
    assert "nested more than" in out and "no accelerate config file" not in out


def test_deeply_nested_deepspeed_json_is_unreadable(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text('{"fp16": ' + "[" * 50000 + "]" * 50000 + "}")
    cfg = tmp_path / "acc.yaml"
    cfg.write_text(f"distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: {ds}\n")
    sec = collect_accelerate_config(str(cfg))
    assert "nested more than" in sec["deepspeed"]["error"]["message"]


SECRET = "wandb_5ecret_value_that_must_not_leak"


@pytest.mark.parametrize("text", [
    f"mixed_precision: fp16\nwandb_api_key: {SECRET}: oops\n",        # mapping values not allowed
    f"mixed_precision: fp16\n\tapi_key: '{SECRET}\n",                   # a tab
    f"mixed_precision: fp16\napi_key: \"{SECRET}\n",                    # unterminated quote
])
def test_invalid_yaml_never_quotes_the_offending_line(tmp_path, capsys, text):
    cfg = tmp_path / "acc.yaml"
    cfg.write_text(text)
    sec = collect_accelerate_config(str(cfg))
    assert "line " in sec["error"]["message"] and "column " in sec["error"]["message"]
    assert SECRET not in json.dumps(sec)
    for fmt in ("terminal", "json", "markdown"):
        rc, out = check_in_process(capsys, "--snapshot", str(SNAPS / "dev-cpu-fp16.json"), "--config-file",
                                   str(cfg), "--format", fmt)
        assert rc == 1, out
        assert SECRET not in out
        assert "not valid YAML" in out
    r = run(["collect", "--config-file", str(cfg)], {"PYTHONPATH": fast_broken_torch(tmp_path)})
    assert r.returncode == 0 and SECRET not in r.stdout + r.stderr


def test_invalid_json_config_names_the_position_only(tmp_path):
    cfg = tmp_path / "acc.json"
    cfg.write_text('{"mixed_precision": "fp16", "api_key": "' + SECRET + '" "x"}')
    sec = collect_accelerate_config(str(cfg))
    assert sec["error"]["message"].startswith("not valid JSON: Expecting")
    assert SECRET not in json.dumps(sec)


@pytest.mark.slow
def test_accelerates_own_default_config_is_read(tmp_path):
    """`accelerate config default` writes JSON into a .yaml file: it must be read."""
    cfg = tmp_path / "default_config.yaml"
    accelerate = Path(sysconfig.get_path("scripts")) / "accelerate"
    cmd = [str(accelerate)] if accelerate.exists() else [sys.executable, "-m", "accelerate.commands.accelerate_cli"]
    r = subprocess.run(cmd + ["config", "default", "--mixed_precision", "fp16", "--config_file", str(cfg)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert cfg.read_text().lstrip().startswith("{")  # JSON in a .yaml file
    sec = collect_accelerate_config(str(cfg))
    assert "error" not in sec
    assert sec["config"]["mixed_precision"] == "fp16"


# --- 4. every snapshot field validated on load -------------------------------------------------------

@pytest.mark.parametrize("section, key, value, words", [
    ("memory", "total_bytes", "x", '"memory.total_bytes" must be a whole number, not a string'),
    ("memory", "total_bytes", 10 ** 30, '"memory.total_bytes" must be a whole number below 2**63'),
    ("nvml", "driver_version", 550, '"nvml.driver_version" must be a string, not the number 550'),
    ("torch", "cuda_available", "yes", '"torch.cuda_available" must be true or false'),
    ("torch", "devices", [None], '"torch.devices[0]" must be an object, not null'),
    ("env", "CUDA_VISIBLE_DEVICES", {"a": 1}, '"env.CUDA_VISIBLE_DEVICES" must be a string, not an object'),
])
def test_a_wrong_field_is_exit_2_naming_it(tmp_path, capsys, section, key, value, words):
    snap = json.loads((SNAPS / "a100-bf16.json").read_text())
    snap[section][key] = value
    path = tmp_path / "s.json"
    path.write_text(json.dumps(snap))
    rc, out = check_in_process(capsys, "--snapshot", str(path))
    assert rc == 2
    assert words in out, out
    assert "Traceback" not in out and "internal error" not in out


def test_a_deeply_nested_snapshot_is_exit_2(tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_text('{"schema": 1, "env": {}, "extra": ' + "[" * 200000 + "]" * 200000 + "}")
    rc, out = check_in_process(capsys, "--snapshot", str(path))
    assert rc == 2 and "nested more than" in out and "internal error" not in out
    path.write_text('{"schema": 1, "extra": ' + '{"a": ' * 500 + "1" + "}" * 500 + "}")
    rc, out = check_in_process(capsys, "--snapshot", str(path))
    assert rc == 2 and '"extra" is nested more than 64 levels deep' in out


def _paths(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:2]):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


# free-form maps (environment variables, package versions): two of their keys stand for all
_MAPS = {("env",), ("packages", "versions"), ("packages", "nvidia_wheels"), ("packages", "requires"),
         ("timings",), ("cpu", "flags")}


def _mutation_cases():
    seen, cases = set(), []
    for snap in sorted(SNAPS.glob("*.json")):
        data = json.loads(snap.read_text())
        per_map: dict[tuple, int] = {}
        for path in _paths(data):
            shape = tuple("[]" if isinstance(k, int) else k for k in path)
            parent = shape[:-1]
            if parent in _MAPS:
                per_map[parent] = per_map.get(parent, 0) + 1
                if per_map[parent] > 2:
                    continue
                shape = parent + ("*",)
            if shape not in seen:
                seen.add(shape)
                cases.append((snap, path))
    return cases


MUTATIONS = {"wrong type": lambda old: 7 if isinstance(old, str) else "x", "null": lambda old: None,
             "huge number": lambda old: 10 ** 30, "nested dict": lambda old: {"a": {"b": {"c": [1, {"d": None}]}}}}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_every_mutated_fixture_field_gives_a_documented_exit(tmp_path, capsys, monkeypatch, mutation):
    """Each fixture snapshot's every field (one of each shape across the fixtures),
    replaced by a value of the wrong kind: `check --snapshot` exits 0, 1 or 2, never
    with a traceback or an internal error."""
    monkeypatch.setenv("MPDOCTOR_DEBUG", "1")  # an internal error would raise here, not be summarised
    make = MUTATIONS[mutation]
    path = tmp_path / "mutated.json"
    bad = []
    cases = _mutation_cases()
    assert len(cases) > 150
    for snap, field in cases:
        data = json.loads(snap.read_text())
        target = data
        for k in field[:-1]:
            target = target[k]
        old = target[field[-1]]
        if mutation == "huge number" and isinstance(old, (str, bool)):
            continue  # for a string or a flag any number is the wrong type: done above
        target[field[-1]] = make(old)
        path.write_text(json.dumps(data))
        try:
            rc = main(["check", "--snapshot", str(path), "--format", "json"])
        except Exception as exc:  # noqa: BLE001 - the point of the test
            bad.append(f"{snap.name} {'.'.join(map(str, field))}: {type(exc).__name__}: {exc}")
            continue
        out = capsys.readouterr()
        if rc not in (0, 1, 2) or "Traceback" in out.out + out.err:
            bad.append(f"{snap.name} {'.'.join(map(str, field))}: exit {rc}")
    assert not bad, "\n".join(bad[:20])


# --- 6. a core install: no torch where mpdoctor looks --------------------------------------------------

@pytest.fixture(scope="module")
def torchless_python(tmp_path_factory) -> str:
    """A fresh venv without torch (and without pip: fast), as a core install has."""
    d = tmp_path_factory.mktemp("venv") / "notorch"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d)], check=True, timeout=120)
    python = d / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    r = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('torch'))"],
                       capture_output=True, text=True)
    assert r.stdout.strip() == "None"
    return str(python)


@pytest.mark.slow
def test_core_install_check_says_torch_is_missing_and_judges_the_config(torchless_python, tmp_path):
    cfg = tmp_path / "acc.yaml"
    cfg.write_text(FP16_CPU_CONFIG)
    r = run(["check", "--python", torchless_python, "--config-file", str(cfg)])
    out = r.stdout
    assert r.returncode == 1, out + r.stderr  # fp16 with use_cpu: judged from the config, not exit 0
    assert "✓ torch and CUDA runtime" not in out
    assert "– torch and CUDA runtime" in out and "torch is not installed in" in out
    assert "fp16 asked for, but training will run on the CPU in plain fp32" in out
    assert "runs as fp32" in out
    r = run(["check", "--python", torchless_python, "--config-file", str(cfg), "--format", "json"])
    report = json.loads(r.stdout)
    assert [f["rule"] for f in report["findings"] if f["severity"] == "error"] == ["fp16-silently-fp32-on-cpu"]
    torch_area = next(a for a in report["checklist"]["areas"] if a["id"] == "torch")
    assert torch_area["status"] == "skipped" and "torch is not installed" in torch_area["summary"]


@pytest.mark.slow
def test_collect_reads_the_libraries_of_the_python_given(torchless_python):
    r = run(["collect", "--python", torchless_python])
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)
    assert snap["torch"]["status"] == "not-installed" and snap["torch"]["python"] == torchless_python
    assert snap["platform"]["executable"] == torchless_python
    # this venv has accelerate; the one given has nothing
    assert "accelerate" not in snap["packages"]["versions"]


@pytest.mark.slow
def test_python_with_torch_is_examined_there(tmp_path):
    """A venv that sees this environment's torch through a .pth file (mpdoctor itself is
    not needed there): torch examined with that interpreter."""
    d = tmp_path / "withtorch"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d)], check=True, timeout=120)
    py = d / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    import torch

    Path(site, "main-env.pth").write_text(str(Path(torch.__file__).parent.parent) + "\n")
    r = run(["collect", "--python", str(py)], timeout=120)
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)
    assert snap["torch"]["status"] == "ok" and snap["torch"]["version"] == torch.__version__
    assert snap["torch"]["python"] == str(py) and snap["platform"]["executable"] == str(py)
    assert snap["packages"]["versions"]["torch"] == torch.__version__


def test_python_option_errors_are_exit_2(tmp_path, capsys):
    rc, out = check_in_process(capsys, "--python", str(tmp_path / "nope"))
    assert rc == 2 and "no such file" in out
    rc, out = check_in_process(capsys, "--python", str(tmp_path))
    assert rc == 2 and "is a folder" in out
    rc, out = check_in_process(capsys, "--python", sys.executable, "--snapshot", str(SNAPS / "a100-bf16.json"))
    assert rc == 2 and "cannot be combined with --snapshot" in out


def test_current_python_given_is_the_default_path(tmp_path):
    r = run(["collect", "--python", sys.executable], {"PYTHONPATH": fast_broken_torch(tmp_path)})
    snap = json.loads(r.stdout)
    assert snap["torch"]["status"] == "import-error" and snap["torch"]["python"] == sys.executable
    assert snap["packages"]["versions"]["accelerate"]


def test_probe_says_torch_is_missing_and_what_to_do(torchless_python, capsys):
    rc = main(["probe", "--python", torchless_python, "--modes", "no"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "torch and accelerate are not installed" in err and torchless_python in err
    assert f"{torchless_python} -m pip install torch accelerate" in err


def test_a_live_collection_nulls_an_odd_value_instead_of_failing():
    """A file with a wrong field is refused (exit 2); a live collection in which a
    library answered something odd keeps going with that field null, and says so."""
    from mpdoctor.env import SnapshotError, load_snapshot_data

    odd = {"schema": 1, "torch": {"status": "ok", "cudnn": "9.1.0", "devices": [{"index": 0, "capability": [8, "x"]}]}}
    with pytest.raises(SnapshotError, match='"torch.cudnn" must be a whole number'):
        load_snapshot_data(copy.deepcopy(odd))
    snap = load_snapshot_data(copy.deepcopy(odd), live=True)
    assert snap["torch"]["cudnn"] is None
    assert snap["torch"]["devices"][0]["capability"] is None  # a list is nulled whole, never left with a hole
    assert snap["repaired_fields"] == ["torch.cudnn", "torch.devices[0].capability"]


def test_deepspeed_json_too_large_is_unreadable(tmp_path):
    from mpdoctor.env.accel_config import MAX_BYTES

    ds = tmp_path / "ds.json"
    ds.write_text('{"fp16": {"enabled": true}, "pad": "' + "x" * MAX_BYTES + '"}')
    cfg = tmp_path / "acc.yaml"
    cfg.write_text(f"distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: {ds}\n")
    assert "too large to read" in collect_accelerate_config(str(cfg))["deepspeed"]["error"]["message"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_config_is_never_opened(tmp_path, capsys, monkeypatch):
    hf = tmp_path / "hf"
    (hf / "accelerate").mkdir(parents=True)
    os.mkfifo(hf / "accelerate" / "default_config.yaml")
    monkeypatch.setenv("HF_HOME", str(hf))
    sec = collect_accelerate_config()
    assert sec["exists"] and sec["error"]["message"] == "not a regular file"
    rc, out = check_in_process(capsys, "--snapshot", str(SNAPS / "a100-bf16.json"), "--config-file",
                               str(hf / "accelerate" / "default_config.yaml"))
    assert rc == 2 and "not a regular file" in out


# --- a real core install: mpdoctor and its dependencies only, in a Python without torch ----------------

CORE_MODULES = ("rich", "markdown_it", "mdurl", "pygments", "psutil", "yaml", "_yaml", "pynvml", "packaging",
                "hyperscan", "tomli", "mpdoctor")


@pytest.fixture(scope="module")
def core_install(torchless_python, tmp_path_factory) -> dict[str, str]:
    """PYTHONPATH for the torch-less venv holding mpdoctor and its core dependencies
    (links to this environment's copies): what `pip install mpdoctor` gives, no torch."""
    import importlib.util

    d = tmp_path_factory.mktemp("core")
    for name in CORE_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin:
            continue
        origin = Path(spec.origin)
        src = origin.parent if origin.name == "__init__.py" else origin
        (d / src.name).symlink_to(src)
    return {"PYTHONPATH": str(d)}


def run_core(python: str, env: dict[str, str], args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "mpdoctor", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "300", **env}, cwd=cwd)


@pytest.mark.slow
def test_core_install_without_torch_answers_correctly(torchless_python, core_install, tmp_path):
    cfg = tmp_path / "acc.yaml"
    cfg.write_text(FP16_CPU_CONFIG)
    r = run_core(torchless_python, core_install, ["check", "--config-file", str(cfg)], tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert f"torch: not installed in {torchless_python}" in r.stdout
    assert "– torch and CUDA runtime" in r.stdout and "✓ torch and CUDA runtime" not in r.stdout
    assert "fp16 asked for, but training will run on the CPU in plain fp32" in r.stdout
    # installed with pipx beside the training environment, run without --python: no green
    # ✓ over what was not judged, the summary says so and what to do, exit 2 (README)
    r = run_core(torchless_python, {**core_install, "COLUMNS": "80"}, ["check"], tmp_path)
    out = r.stdout
    assert r.returncode == 2, out + r.stderr
    assert "– Hardware precision" in out and "✓ Hardware precision" not in out  # no device known
    assert "✓ Library versions" not in out and "– Library versions — not judged: torch is not installed here" in out
    summary = out[out.index("\nnot judged: "):]
    assert "torch is not installed here" in summary
    assert "\n`--python /path/to/train/python`\n" in summary  # a command is never cut
    assert "0 error(s), 0 warning(s), 0 note(s) in what could be judged" in summary.replace("\n", " ")
    r = run_core(torchless_python, core_install, ["check", "--format", "json"], tmp_path)
    assert r.returncode == 2 and "`--python /path/to/train/python`" in json.loads(r.stdout)["not_judged"]
    r = run_core(torchless_python, core_install, ["check", "--format", "markdown"], tmp_path)
    assert r.returncode == 2 and "> **Not judged:** torch is not installed here" in r.stdout
    # pointed at the interpreter that trains, it judges and exits as usual
    r = run_core(torchless_python, core_install, ["check", "--python", sys.executable], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "\nnot judged:" not in r.stdout and "✓ torch and CUDA runtime" in r.stdout
    r = run_core(torchless_python, core_install, ["probe", "--modes", "no"], tmp_path)
    assert r.returncode == 2  # the README's exit codes: torch missing is not "no mode trained"
    assert "not installed in mpdoctor's own environment" in r.stderr
    assert "mpdoctor probe --python" in r.stderr
    log = tmp_path / "train.log"
    log.write_text("RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'\n")
    r = run_core(torchless_python, core_install, ["explain", str(log)], tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr


@pytest.mark.slow
def test_the_pythons_libraries_survive_a_torch_that_crashes_it(torchless_python, tmp_path):
    """With --python, the interpreter's platform and libraries are sent before torch is
    imported: a torch that kills the interpreter leaves them in the snapshot."""
    path = fast_broken_torch(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    r = run(["collect", "--python", torchless_python], {"PYTHONPATH": path})
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)
    assert snap["torch"]["status"] == "crashed"
    assert snap["torch"]["error"]["message"] == "the Python process examining torch was killed by SIGSEGV"
    assert snap["platform"]["executable"] == torchless_python
    assert snap["packages"]["versions"] == {}


def test_sigterm_to_collect_leaves_no_torch_child_behind(tmp_path):
    """The torch child runs in a session of its own; a SIGTERM to mpdoctor must not
    orphan it (nor what it started), and mpdoctor still dies of the signal."""
    pid_file = tmp_path / "helper.pid"
    path = fast_broken_torch(tmp_path, HELPER_THEN.format(after="import time; time.sleep(60)"))
    env = dict(os.environ, PYTHONPATH=path, MPDOCTOR_TORCH_TIMEOUT="60", HELPER_PID_FILE=str(pid_file))
    proc = subprocess.Popen(MPDOCTOR + ["collect"], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the fake torch never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=20)
    assert proc.returncode == -signal.SIGTERM
    assert wait_gone(int(pid_file.read_text())), "SIGTERM to collect left the torch child's helper running"
