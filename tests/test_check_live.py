"""`mpdoctor check` and `collect` on this machine: real torch (CPU build), real
accelerate, real child processes. One live snapshot is shared by the tests that only
need to judge it; the tests about the child process run their own (with a fake torch,
which answers in milliseconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MPDOCTOR = [sys.executable, "-m", "mpdoctor"]

CONFIG = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: 'NO'
downcast_bf16: 'no'
machine_rank: 0
main_training_function: main
mixed_precision: {mp}
num_machines: 1
num_processes: 1
rdzv_backend: static
same_network: true
tpu_env: []
use_cpu: false
"""


def run(args, env=None, timeout=120, input=None):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(MPDOCTOR + args, capture_output=True, text=True, env=full_env, timeout=timeout,
                          cwd=ROOT, input=input)


def config(tmp_path: Path, mp: str) -> Path:
    p = tmp_path / f"accelerate-{mp}.yaml"
    p.write_text(CONFIG.format(mp=mp))
    return p


@pytest.fixture(scope="module")
def live_snapshot(tmp_path_factory) -> Path:
    """This machine, collected once through the CLI (torch in its child)."""
    out = tmp_path_factory.mktemp("live") / "live.json"
    r = run(["collect", "-o", str(out)])
    assert r.returncode == 0, r.stderr
    return out


def fake_torch(tmp_path: Path, body: str) -> dict[str, str]:
    """A `torch` package that PYTHONPATH puts in front of the real one."""
    pkg = tmp_path / "fake" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    return {"PYTHONPATH": str(tmp_path / "fake")}


def test_live_collect_reads_the_real_torch(live_snapshot):
    snap = json.loads(live_snapshot.read_text())
    import torch

    assert snap["schema"] == 1
    assert snap["torch"]["status"] == "ok"
    assert snap["torch"]["version"] == torch.__version__
    assert snap["torch"]["cuda_available"] is False
    assert snap["torch"]["cuda_build"] == torch.version.cuda
    assert snap["packages"]["versions"]["accelerate"] == __import__("accelerate").__version__
    # no GPU here: NVML says why instead of failing the collection
    assert snap["nvml"]["status"] == "unavailable" and snap["nvml"]["error"]["type"].startswith("NVMLError")


def test_live_check_with_fp16_config_reports_silent_fp32(tmp_path):
    r = run(["check", "--config-file", str(config(tmp_path, "fp16")), "--format", "json"])
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    top = report["findings"][0]
    assert top["rule"] == "fp16-silently-fp32-on-cpu"
    assert top["category"] == "fp16-unsupported-device"
    assert "no autocast" in top["explanation"] and "GradScaler" in top["explanation"]
    plan = report["precision_plan"]
    assert plan["requested"] == "fp16" and plan["effective"] == "fp32"


def test_live_checklist_shows_the_fp16_verdict_at_a_glance(live_snapshot, tmp_path):
    # the recorded live snapshot: the same judge as a live run, without a second torch import
    r = run(["check", "--snapshot", str(live_snapshot), "--config-file", str(config(tmp_path, "fp16"))])
    assert r.returncode == 1
    out = r.stdout
    assert "✗ Hardware precision" in out
    assert "fp16 asked for, but training will run on the CPU in plain fp32" in out
    assert "→ " in out  # the fix beneath the finding
    assert "runs as fp32" in out


@pytest.mark.parametrize("mp", ["bf16", "no"])
def test_live_bf16_and_no_are_not_errors(live_snapshot, tmp_path, mp):
    r = run(["check", "--snapshot", str(live_snapshot), "--config-file", str(config(tmp_path, mp)), "--format", "json"])
    assert r.returncode == 0, r.stdout
    report = json.loads(r.stdout)
    assert not [f for f in report["findings"] if f["severity"] == "error"]
    assert report["precision_plan"]["requested"] == mp


def test_live_no_precision_judges_every_mode(live_snapshot):
    r = run(["check", "--snapshot", str(live_snapshot), "--format", "json"])
    modes = {m["mode"]: m for m in json.loads(r.stdout)["modes"]}
    assert set(modes) == {"no", "fp16", "bf16", "fp8"}
    assert modes["no"]["status"] == "ok"
    assert modes["fp16"]["status"] == "error" and modes["fp16"]["runs_as"] == "fp32"
    assert modes["bf16"]["status"] in ("ok", "warning")  # CPU autocast bf16 works, maybe emulated
    assert modes["fp8"]["status"] == "error"


def test_bogus_env_precision_is_reported(live_snapshot):
    # ACCELERATE_MIXED_PRECISION=bogus is accepted by Accelerator() without an error (measured);
    # check must say so. Judged on the live snapshot with the variable added.
    snap = json.loads(live_snapshot.read_text())
    snap["env"]["ACCELERATE_MIXED_PRECISION"] = "bogus"
    p = live_snapshot.parent / "bogus.json"
    p.write_text(json.dumps(snap))
    r = run(["check", "--snapshot", str(p), "--format", "json"])
    assert r.returncode == 1
    f = next(f for f in json.loads(r.stdout)["findings"] if f["rule"] == "mixed-precision-unknown-value")
    assert f["facts"]["value"] == "bogus" and "fp32" in f["explanation"]


def test_torch_import_error_is_a_finding_not_a_crash(tmp_path):
    env = fake_torch(tmp_path, 'raise ImportError("libcudart.so.12: cannot open shared object file: No such file or directory")\n')
    r = run(["check", "--format", "json"], env=env)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    report = json.loads(r.stdout)
    top = report["findings"][0]
    assert top["rule"] == "torch-import-missing-library"
    assert top["facts"]["library"] == "libcudart.so.12"
    assert any(s["reason"].startswith("torch could not be examined") for s in report["skipped"])


def test_torch_import_error_terminal_output(tmp_path):
    env = fake_torch(tmp_path, 'raise ImportError("libcudart.so.12: cannot open shared object file: No such file or directory")\n')
    r = run(["check"], env=env)
    assert r.returncode == 1
    assert "✗ torch and CUDA runtime" in r.stdout and "libcudart.so.12" in r.stdout


def test_torch_that_hangs_is_killed_after_the_timeout(tmp_path):
    env = fake_torch(tmp_path, "import time\ntime.sleep(120)\n")
    env["MPDOCTOR_TORCH_TIMEOUT"] = "1.5"
    r = run(["collect"], env=env, timeout=60)
    assert r.returncode == 0
    t = json.loads(r.stdout)["torch"]
    assert t["status"] == "timeout" and t["error"]["type"] == "Timeout"


def test_torch_that_crashes_the_interpreter(tmp_path):
    env = fake_torch(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    r = run(["check", "--format", "json"], env=env)
    assert r.returncode == 1
    report = json.loads(r.stdout)
    assert report["findings"][0]["rule"] == "torch-import-fails"
    assert "SIGSEGV" in report["findings"][0]["explanation"]


def test_torch_printing_to_stdout_cannot_corrupt_the_answer(tmp_path):
    env = fake_torch(tmp_path, """
        print("{not json")
        import sys; sys.stdout.write("noise\\n")
        __version__ = "9.9.9"
        raise ImportError("stop here")
    """)
    r = run(["collect"], env=env)
    t = json.loads(r.stdout)["torch"]
    assert t["status"] == "import-error" and t["error"]["message"] == "stop here"


def test_collect_redacts_secrets_and_anonymizes(tmp_path):
    env = fake_torch(tmp_path, 'raise ImportError("no torch here")\n')
    env.update({"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz123456", "WANDB_API_KEY": "0123456789abcdef0123",
                "HF_ENDPOINT": "https://ana:s3cr3tpass@hub.example.com/api?token=deadbeef",
                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    r = run(["collect", "--anonymize"], env=env)
    assert r.returncode == 0
    for secret in ("hf_abcdefghijklmnopqrstuvwxyz123456", "s3cr3tpass", "deadbeef", "0123456789abcdef0123"):
        assert secret not in r.stdout
    snap = json.loads(r.stdout)
    assert snap["env"]["HF_TOKEN"] == "<redacted>"
    assert snap["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert snap["anonymized"] is True
    home = os.path.expanduser("~")
    if len(home) > 1:
        assert home + "/" not in r.stdout


def test_collect_writes_a_file_check_can_read(tmp_path, live_snapshot):
    r = run(["check", "--snapshot", str(live_snapshot), "--format", "markdown"])
    assert r.returncode == 0
    assert r.stdout.startswith("## mpdoctor check")
    assert "**Checklist**" in r.stdout


def test_check_snapshot_never_imports_torch(live_snapshot):
    code = (
        "import sys, io, contextlib\n"
        "from mpdoctor.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main(['check', '--snapshot', {str(live_snapshot)!r}, '--format', 'json'])\n"
        "bad = [m for m in ('torch', 'accelerate', 'pynvml', 'numpy') if m in sys.modules]\n"
        "print(rc, bad)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.stdout.strip() == "0 []", r.stdout + r.stderr


def test_explain_here_sharpens_with_this_machine(tmp_path):
    import torch

    log = tmp_path / "device.log"
    log.write_text("RuntimeError: Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) "
                   "should be the same\n")
    r = run(["explain", str(log), "--here", "--format", "json"])
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert report["input"]["snapshot"] == "live"
    top = report["findings"][0]
    assert top["category"] == "device-mismatch"
    assert f"This machine has no GPU torch can use (torch {torch.__version__} is a CPU-only build)." in top["explanation"]


# --- a report that stands alone in an issue (what collect_env / accelerate env show) ----------

def test_live_snapshot_has_what_collect_env_and_accelerate_env_show(live_snapshot):
    import numpy
    import torch

    snap = json.loads(live_snapshot.read_text())
    assert snap["platform"]["os"] and snap["platform"]["libc"].startswith("glibc")
    assert snap["packages"]["versions"]["numpy"] == numpy.__version__
    assert snap["torch"]["num_threads"] == torch.get_num_threads()
    assert isinstance(snap["threads"]["affinity_cores"], int)
    assert "cuda_home" in snap["cuda_toolkit"] and "nvcc" in snap["cuda_toolkit"]


def test_check_markdown_stands_alone(live_snapshot, tmp_path):
    import numpy

    from mpdoctor import __version__

    cfg = tmp_path / "cpu.yaml"
    cfg.write_text(CONFIG.format(mp="fp16").replace("use_cpu: false", "use_cpu: true"))
    r = run(["check", "--snapshot", str(live_snapshot), "--config-file", str(cfg), "--format", "markdown"],
            env={"OMP_NUM_THREADS": "3"})
    md = r.stdout
    snap = json.loads(live_snapshot.read_text())
    assert f"- mpdoctor {__version__}" in md
    assert f"- OS: {snap['platform']['os']} · {snap['platform']['libc']}" in md
    assert f"- numpy {numpy.__version__}" in md
    assert "- threads: " in md and "torch.get_num_threads()" in md
    assert "- CUDA toolkit: " in md
    # the whole config, not the summary that dropped use_cpu
    assert '"use_cpu": true' in md and '"machine_rank": 0' in md
    r = run(["check", "--snapshot", str(live_snapshot), "--config-file", str(cfg), "--format", "json"])
    env = json.loads(r.stdout)["environment"]
    assert env["accelerate_config"]["config"]["use_cpu"] is True
    assert env["numpy"] == numpy.__version__ and env["os"] == snap["platform"]["os"]
    r = run(["check", "--snapshot", str(live_snapshot), "--config-file", str(cfg)], env={"COLUMNS": "80"})
    assert "use_cpu: true" in r.stdout


def test_thread_settings_are_the_ones_set(tmp_path):
    r = run(["collect"], env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    snap = json.loads(r.stdout)
    assert snap["threads"]["env"] == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert snap["torch"]["num_threads"] == 1
