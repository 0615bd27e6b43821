"""Bad input: a clear one-line message and the documented exit code, never a traceback
of mpdoctor itself; and nothing a log contains can make matching hang."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpdoctor import cli, rulebase
from mpdoctor.logs import explain_text

ROOT = Path(__file__).resolve().parent.parent
FORMS = ROOT / "fixtures" / "logs" / "forms"
RULES = rulebase.load()
OOM_TB = (FORMS / "slurm-srun-label.log").read_text()


def explain_file(path, capsys, *extra):
    code = cli.main(["explain", str(path), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def assert_clear_error(code, out, err, words):
    assert code == 2
    assert out == ""
    assert err.startswith("mpdoctor: ") and err.count("\n") == 1, err
    assert words in err
    assert "Traceback" not in err


def test_empty_file(tmp_path, capsys):
    (tmp_path / "empty.log").write_bytes(b"")
    assert_clear_error(*explain_file(tmp_path / "empty.log", capsys), "is empty")


def test_binary_file(tmp_path, capsys):
    data = bytes(range(256)) * 64 + b"\x00" * 4096
    (tmp_path / "model.bin").write_bytes(data)
    assert_clear_error(*explain_file(tmp_path / "model.bin", capsys), "looks like a binary file")


def test_a_real_binary_executable(capsys):
    assert_clear_error(*explain_file(sys.executable, capsys), "looks like a binary file")


def test_directory(tmp_path, capsys):
    # a folder is read as a job's logs (issue 20); one with nothing to read says so
    assert_clear_error(*explain_file(tmp_path, capsys), "no file to read in")


def test_missing_file(tmp_path, capsys):
    assert_clear_error(*explain_file(tmp_path / "nope.log", capsys), "no such file")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_by_mode(tmp_path, capsys):
    path = tmp_path / "secret.log"
    path.write_text("x\n")
    path.chmod(0)
    assert_clear_error(*explain_file(path, capsys), "permission denied")


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="Linux only")
def test_file_whose_read_fails(capsys):
    # /proc/self/mem opens but reading offset 0 fails with EIO: a real unreadable file
    assert_clear_error(*explain_file("/proc/self/mem", capsys), "cannot be read")


def test_empty_stdin():
    proc = subprocess.run([sys.executable, "-m", "mpdoctor", "explain", "-"], input=b"", capture_output=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == b""
    assert proc.stderr == b"mpdoctor: <stdin> is empty: there is nothing to explain\n"


def test_invalid_utf8_is_read_with_replacement(tmp_path, capsys):
    data = OOM_TB.encode().replace(b"gpu017", b"gpu\xff\xfe17").replace(b"loss 1.9012", b"loss \xc3\x28")
    (tmp_path / "bad-utf8.log").write_bytes(data)
    code, out, err = explain_file(tmp_path / "bad-utf8.log", capsys, "--format", "json")
    assert code == 1 and err == "" and '"rule": "cuda-oom"' in out


def test_20mb_single_line(tmp_path, capsys):
    line = ("CUDA out of memory. Tried to allocate " + "x" * 97 + " │ [rank0]: \\n File \"") * (20_000_000 // 150)
    (tmp_path / "oneline.log").write_text(line)
    t = time.monotonic()
    code, out, err = explain_file(tmp_path / "oneline.log", capsys, "--format", "json")
    assert time.monotonic() - t < 60  # a sanity bound only; timings live in bench/
    assert code in (0, 1) and err == ""


def test_3000_copies_of_one_traceback(tmp_path, capsys):
    (tmp_path / "many.log").write_text(OOM_TB * 3000)
    t = time.monotonic()
    code, out, err = explain_file(tmp_path / "many.log", capsys, "--format", "json")
    assert time.monotonic() - t < 60
    assert code == 1 and err == ""
    import json

    data = json.loads(out)
    assert [f["rule"] for f in data["findings"]].count("cuda-oom") == 1


# Lines built to make a regular expression backtrack: each pattern of the normaliser, the
# segmenter and the rules sees at most a bounded window, so each finishes in seconds.
ADVERSARIAL = {
    "box": "│" + " " * 2_000_000 + "x",
    "prefixes": "[rank0]: " * 200_000 + "x",
    "timestamps": "2024-01-01 12:00:00,123 - " * 80_000,
    "frames": 'File "' + "a" * 2_000_000,
    "escaped json": "Traceback (most recent call last)" + "\\n  File \\\"x\\\"" * 150_000,
    "flattened": "Traceback (most recent call last): " + 'File "a.py", line 1, in f ' * 80_000,
    "exception-like": "A." * 1_000_000 + "Error",
    "oom literal repeated": "CUDA out of memory. Tried to allocate 2.00 GiB. " * 60_000,
    "digits": "9" * 2_000_000,
    "spaces then literal": " " * 2_000_000 + "out of memory",
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_lines_finish(name):
    text = ADVERSARIAL[name]
    t = time.monotonic()
    report = explain_text(text + "\n" + text, RULES)
    assert time.monotonic() - t < 60, name  # sanity bound; the bench measures
    assert report is not None


# --- property-based: anything in, a documented exit code out ----------------------------

FRAGMENTS = st.sampled_from([
    "Traceback (most recent call last):\n", '  File "/a/train.py", line 3, in <module>\n', "    main()\n",
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n", "[rank1]: ", "[default0]:", "0: ",
    "\x1b[31m", "\x1b[0m", "\r", "\r\n", "╭─ Traceback (most recent call last) ─╮\n", "│ x │\n", "╰───╯\n",
    "The above exception was the direct cause of the following exception:\n", "\\n", '\\"', "：", "。",
    "(VllmWorker rank=1 pid=2) ", "2024-01-01 12:00:00,123 - root - ERROR - ", "---> 12 x()\n", "Cell In[3], line 2\n",
    "torch.OutOfMemoryError: ", "\n", " " * 40, "\ufffd", "\x00",
])
LOGLIKE = st.lists(st.one_of(FRAGMENTS, st.text(max_size=30)), max_size=60).map("".join)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=3000), LOGLIKE.map(lambda s: s.encode("utf-8", "surrogatepass"))))
def test_any_bytes_give_a_documented_exit_code(tmp_path, capsys, data):
    path = tmp_path / "fuzz.log"
    path.write_bytes(data)
    for fmt in ("json", "terminal"):
        code = cli.main(["explain", str(path), "--format", fmt])
        out, err = capsys.readouterr()
        assert code in (0, 1, 2)
        assert "Traceback (most recent call last)" not in err
        if code == 2:
            assert err.startswith("mpdoctor: ")
        else:
            assert err == ""


@settings(max_examples=120, deadline=None)
@given(text=LOGLIKE)
def test_any_text_explains_without_error(text):
    report = explain_text(text, RULES)
    for f in report.findings:
        assert f.evidence and all(e.line is None or e.line >= 1 for e in f.evidence)
    for u in report.unrecognised:
        assert u.line >= 1


@pytest.mark.parametrize("seed", [1, 2])
def test_random_bytes_through_the_real_command(tmp_path, seed):
    import random

    rng = random.Random(seed)
    data = bytes(rng.randrange(256) for _ in range(20000)) if seed == 1 else \
        "".join(rng.choice(["Traceback (most recent call last):\n", "[rank0]: ", "│", "\x1b[1m", "x", "\n", "é"])
                for _ in range(5000)).encode()
    path = tmp_path / "r.log"
    path.write_bytes(data)
    proc = subprocess.run([sys.executable, "-m", "mpdoctor", "explain", str(path)], capture_output=True, timeout=120)
    assert proc.returncode in (0, 1, 2)
    assert b"Traceback" not in proc.stderr
