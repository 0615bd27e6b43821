"""The one normaliser and the segmenter, on the forms real logs come in.

The fixtures under fixtures/logs/forms/ are real output (torchrun, rich, IPython, tqdm,
logging recorded on this machine) or real pastes from public issues with their paths
changed (see fixtures/logs/forms/README.md). Each is run through `explain_path` with the
real `cuda-oom` rule: the finding, the figures read out, the evidence line and the
user's frame must survive the damage.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mpdoctor import rulebase
from mpdoctor.logs import explain_path, explain_text
from mpdoctor.logtext import clean_physical_line, normalise, segment, split_overwrites, strip_prefixes

ROOT = Path(__file__).resolve().parent.parent
FORMS = ROOT / "fixtures" / "logs" / "forms"
RULES = rulebase.load()
OOM_ONLY = [r for r in RULES if r.id == "cuda-oom"]

# file -> (line of the OOM message, facts that must be read out, count, ranks)
FORM_CASES = {
    "accelerate-test-stderr.log": (7, {"requested": "20.00 MiB", "free": "11.75 MiB", "gpu": "1"}, 1, []),
    "colab-ipython-input.log": (25, {"requested": "96.00 MiB", "total": "14.76 GiB",
                                     "user_frame": "<ipython-input-12-3f2a9c1b7d4e>:10"}, 1, []),
    "deepspeed-pdsh-multinode.log": (11, {"requested": "3.82 GiB", "user_frame": "/home/ana/proj/train.py:131"}, 1, []),
    "docker-compose.log": (8, {"requested": "1.00 GiB", "free": "612.38 MiB", "user_frame": "/app/train.py:52"}, 1, []),
    "horovod-tag-output.log": (17, {"requested": "1.53 GiB", "reserved": "8.36 GiB",
                                    "user_frame": "/home/ana/proj/train.py:160"}, 1, [0]),
    "ipython-ansi-highlighted.log": (27, {"requested": "2.00 GiB", "fragmented": "3.25 GiB",
                                          "user_frame": "/home/ana/proj/train_plain.py:13"}, 1, []),
    "ipython-ansi-escape-lost.log": (27, {"requested": "2.00 GiB", "user_frame": "/home/ana/proj/train_plain.py:13"}, 1, []),
    "ipython8-file-tilde.log": (24, {"requested": "3.61 GiB", "free": "2.85 GiB", "user_frame": "In[14]:3"}, 1, []),
    "journald-unit.log": (7, {"requested": "1.00 GiB", "user_frame": "/srv/train/train.py:52"}, 1, []),
    "machine-translated-fullwidth.log": (7, {"requested": "20.00 MiB", "free": "3.44 MiB", "reserved": "22.98 GiB",
                                             "user_frame": "/home/ana/proj/train.py:88"}, 1, []),
    "many-ranks-interleaved.log": (None, {"requested": "7.83 GiB", "user_frame": "/home/ana/proj/pretrain.py:377"},
                                   8, [0, 1, 2, 3, 4, 5, 6, 7]),
    "oom-during-handling-old-wording.log": (8, {"requested": "1024.00 MiB", "user_frame": "memtestcase.py:78"}, 1, []),
    "python-logging-chained.log": (14, {"requested": "2.00 GiB", "user_frame": "/home/ana/proj/train_plain.py:13"}, 1, []),
    "ray-train-workers.log": (9, {"requested": "256.00 MiB", "user_frame": "/home/ray/proj/train_func.py:61"}, 2, []),
    "rich-box-windows.log": (22, {"requested": "20.00 MiB", "user_frame": "E:\\sd\\kohya_ss\\train_network.py:864"}, 1, []),
    "rich-traceback-60cols.log": (42, {"requested": "2.00 GiB", "free": "1.12 GiB", "fragmented": "3.25 GiB",
                                       "user_frame": "/home/ana/proj/train_plain.py:13"}, 1, []),
    "rich-traceback-ansi.log": (42, {"requested": "2.00 GiB", "free": "1.12 GiB", "fragmented": "3.25 GiB"}, 1, []),
    "rich-traceback-narrow-locals.log": (69, {"requested": "2.00 GiB", "fragmented": "3.25 GiB"}, 1, []),
    "slurm-srun-label.log": (11, {"requested": "512.00 MiB", "user_frame": "/scratch/ana/proj/train.py:244"}, 1, [1]),
    "torchelastic-error-file-json.log": (15, {"requested": "2.00 GiB", "free": "1.12 GiB",
                                              "user_frame": "/home/ana/proj/train.py:15"}, 1, []),
    "torchelastic-error-json-indented.log": (None, {"requested": "2.00 GiB", "user_frame": "/home/ana/proj/train.py:15"}, 1, []),
    "torchrun-childfailed.log": (20, {"requested": "2.00 GiB", "gpu": "1", "user_frame": "/home/ana/proj/train.py:15"}, 2, []),
    "torchrun-tee-default-prefix.log": (19, {"requested": "2.00 GiB", "user_frame": "/home/ana/proj/train.py:15"}, 2, [0, 1]),
    "tqdm-glued-traceback.log": (15, {"requested": "2.00 GiB", "user_frame": "/home/ana/proj/train.py:15"}, 1, []),
    "tqdm-progress-then-traceback.log": (12, {"requested": "2.00 GiB", "user_frame": "/home/ana/proj/train_plain.py:13"}, 1, []),
    "traceback-flattened-one-line.log": (2, {"requested": "2.00 GiB", "free": "1.12 GiB",
                                             "user_frame": "/home/ana/proj/train.py:15"}, 1, []),
    "vllm-worker-process.log": (14, {"requested": "1.88 GiB", "gpu": "3", "free": "1.29 GiB"}, 1, []),
}


def test_every_form_fixture_is_tested():
    # the paste forms of issue 21 (quoted, diff-prefixed, dmesg, container, numeric) are
    # tested in tests/test_paste_forms.py
    from test_paste_forms import CASES, SURVIVED

    assert {p.name for p in FORMS.glob("*.log")} == set(FORM_CASES) | {c[0] for c in CASES} | SURVIVED


@pytest.mark.parametrize("name", sorted(FORM_CASES))
def test_form_through_explain(name):
    line, facts, count, ranks = FORM_CASES[name]
    report = explain_path(FORMS / name, OOM_ONLY)
    assert report.findings, f"{name}: the OOM was not found"
    top = report.findings[0]
    assert top.rule == "cuda-oom"
    for key, value in facts.items():
        assert top.facts.get(key) == value, f"{name}: fact {key}={top.facts.get(key)!r}, expected {value!r}"
    if line is not None:
        assert top.evidence[0].line == line
        raw = (FORMS / name).read_bytes().decode("utf-8", "replace").split("\n")[line - 1]
        assert "memory" in raw.lower()
    assert top.count == count
    assert top.ranks == ranks


@pytest.mark.parametrize("name", ["torchrun-tee-default-prefix.log", "rich-traceback-60cols.log",
                                  "ipython-ansi-highlighted.log", "torchelastic-error-file-json.log"])
def test_form_with_the_whole_rule_base(name):
    """The whole rule base (everyone's rules) still puts the OOM first on these."""
    report = explain_path(FORMS / name, RULES)
    assert report.findings and report.findings[0].rule == "cuda-oom"


# --- the normaliser, piece by piece ---------------------------------------------------

def _texts(text: str) -> list[str]:
    return [ln.text for ln in normalise(text)]


def test_ansi_codes_of_every_kind_are_removed():
    line = ("\x1b[91mOutOfMemoryError\x1b[39m: \x1b[38;5;241mCUDA\x1b[0m out"
            " \x1b]8;;https://x\x07of\x1b]8;;\x07 [1;31mmemory[0m^[[32m.")
    assert clean_physical_line(line) == "OutOfMemoryError: CUDA out of memory."


def test_progress_bar_overwrites_are_dropped_but_text_between_bars_kept():
    line = "\r 10%|█ | 1/10 [00:01<00:09]\rWARNING: loss scale reduced\r 20%|██ | 2/10 [00:02<00:08]"
    assert split_overwrites(line) == ["WARNING: loss scale reduced", " 20%|██ | 2/10 [00:02<00:08]"]
    assert _texts("a\r\nb\r\n") == ["a", "b", ""]


def test_glued_traceback_starts_its_own_line_with_the_same_number():
    lines = normalise("x\n 37%|███▋ | 37/100 [00:00<00:00]Traceback (most recent call last):\n")
    assert [(ln.no, ln.text) for ln in lines][1:3] == [(2, " 37%|███▋ | 37/100 [00:00<00:00]"),
                                                       (2, "Traceback (most recent call last):")]


def test_right_padding_and_crlf_and_invalid_utf8():
    data = (b"Traceback (most recent call last):" + b" " * 180 + b"\r\n"
            b'  File "/home/ana/\xff\xfeproj/train.py", line 3, in <module>\r\n'
            b"    f()\r\n"
            b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"
            b" of 23.65 GiB of which 1.12 GiB is free. \xc3\r\n")
    report = explain_text(data.decode("utf-8", "replace"), OOM_ONLY)
    top = report.findings[0]
    assert top.facts["requested"] == "2.00 GiB" and top.facts["free"] == "1.12 GiB"
    assert top.evidence[0].line == 4
    assert top.facts["user_frame"] == "/home/ana/??proj/train.py:3"


@pytest.mark.parametrize("prefix, rank", [
    ("[rank3]: ", 3), ("[default3]:", 3), ("3: ", 3), ("[1,3]<stderr>:", 3), ("(VllmWorker rank=3 pid=77) ", 3),
    ("[Rank 3] ", None),  # not a prefix form we know: left alone
])
def test_rank_prefixes(prefix, rank):
    text, got = strip_prefixes(prefix + "RuntimeError: x")
    if rank is None:
        assert got is None
    else:
        assert (text, got) == ("RuntimeError: x", rank)


@pytest.mark.parametrize("prefix", [
    "2024-01-01 12:00:00,123 - root - ERROR - ",
    "2024-01-01 12:00:00,123 ERROR ",
    "12/02/2024 14:15:30 - ERROR - __main__ - ",
    "[2024-11-29 16:30:24,706] [ERROR] [launch.py:325:sigkill_handler] ",
    "2024-01-01T12:00:00.123456Z ",
    "2024-05-03 11:20:04.123 | ERROR    | train:main:42 - ",
    "E1202 14:15:30.118000 6647 torch/distributed/elastic/multiprocessing/api.py:1002] ",
    "ERROR 10-14 12:32:47 multiproc_worker_utils.py:233] ",
    "(VllmWorkerProcess pid=2421) ERROR 10-14 12:32:47 [multiproc_worker_utils.py:233] ",
    "[2025-12-13T19:54:35Z] (Worker_TP0 pid=9260) ERROR 12-13 11:54:35 [multiproc_executor.py:826] ",
    "Oct 04 15:02:41 gpu-node-3 trainer.sh[81234]: ",
    "trainer-1  | ",
    "gpu017: ",
    "ERROR:torch.distributed.elastic.multiprocessing.api:",
    "[INFO|trainer.py:2078] ",
    "(RayTrainWorker pid=4412, ip=10.0.0.5) ",
    "[03/17/23 20:03:12] ERROR    ",
    "stderr: ",
    "[rank0]: [2024-01-01 12:00:00,123] [ERROR] ",
])
def test_timestamp_level_and_host_prefixes(prefix):
    assert strip_prefixes(prefix + "torch.OutOfMemoryError: CUDA out of memory.")[0] == \
        "torch.OutOfMemoryError: CUDA out of memory."


def test_prefixes_keep_the_traceback_indentation():
    assert strip_prefixes('[rank0]:   File "a.py", line 1, in f')[0] == '  File "a.py", line 1, in f'
    assert strip_prefixes('ERROR 10-14 12:32:47 x.py:233]   File "a.py", line 1')[0] == '  File "a.py", line 1'


def test_full_width_punctuation_from_a_translated_page():
    assert clean_physical_line("RuntimeError：CUDA out of memory。Tried to allocate 20.00 MiB（GPU 0；15.78 GiB total）") \
        == "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total)"


def test_rich_box_rejoins_a_folded_path_and_the_wrapped_message():
    lines = _texts((FORMS / "rich-traceback-narrow-locals.log").read_text())
    assert ("/home/ana/experiments/a_very_long_directory_name_for_the_project/site-packages/"
            "transformers_like/trainer_module.py:21 in main") in lines
    message = [t for t in lines if t.startswith("OutOfMemoryError:")]
    assert len(message) == 1
    assert message[0].endswith("(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
    assert "2.00 GiB. GPU 0" in message[0] and "free. Including" in message[0]


def test_rich_code_lines_are_not_joined():
    lines = _texts((FORMS / "rich-traceback-60cols.log").read_text())
    assert "   7 m = importlib.util.module_from_spec(spec); spec.loa" in lines
    assert "   8 width = int(sys.argv[1]); color = sys.argv[2] == \"c" in lines


def test_escaped_json_traceback_is_unescaped_into_lines():
    tb = 'Traceback (most recent call last):\n  File "/x/train.py", line 9, in <module>\n    main()\nValueError: bad\n'
    blob = json.dumps(json.dumps({"message": {"message": "ValueError: bad", "extraInfo": {"py_callstack": tb}}}))
    lines = normalise(f"  msg: {blob}\nnext\n")
    texts = [ln.text for ln in lines]
    assert "Traceback (most recent call last):" in texts
    assert '  File "/x/train.py", line 9, in <module>' in texts
    assert {ln.no for ln in lines[:-2]} == {1} and [(ln.no, ln.text) for ln in lines[-2:]] == [(2, "next"), (3, "")]
    (t,) = segment(lines)
    assert (t.exc_type, t.exc_message, t.user_frame.location) == ("ValueError", "bad", "/x/train.py:9")


def test_flattened_traceback_is_split():
    flat = ('Traceback (most recent call last): File "/a/train.py", line 5, in <module> main() '
            'File "/a/train.py", line 3, in main step() torch.OutOfMemoryError: CUDA out of memory. x')
    (t,) = segment(normalise(flat))
    assert [f.location for f in t.frames] == ["/a/train.py:5", "/a/train.py:3"]
    assert t.exc_type == "torch.OutOfMemoryError" and t.exc_message == "CUDA out of memory. x"


# --- the segmenter ------------------------------------------------------------------------

def test_chained_exceptions_are_linked_and_the_cause_ranks_first():
    (FORMS / "python-logging-chained.log").read_text()
    tbs = segment(normalise((FORMS / "python-logging-chained.log").read_text()))
    assert [t.exc_type for t in tbs] == ["torch.OutOfMemoryError", "torch.OutOfMemoryError", "RuntimeError"]
    assert tbs[2].chained_from == 1 and tbs[2].chain_kind == "cause"
    tbs = segment(normalise((FORMS / "oom-during-handling-old-wording.log").read_text()))
    assert tbs[1].chained_from == 0 and tbs[1].chain_kind == "during"
    # the cleanup error that followed the OOM is explained by it, not "unrecognised"
    report = explain_path(FORMS / "oom-during-handling-old-wording.log", OOM_ONLY)
    assert [f.rule for f in report.findings] == ["cuda-oom"] and report.unrecognised == []


def test_code_lines_are_never_the_exception_line():
    text = ("Traceback (most recent call last):\n"
            '  File "t.py", line 3, in <module>\n'
            "    KeyboardInterrupt\n"
            "ValueError: the real one\n")
    (t,) = segment(normalise(text))
    assert (t.exc_type, t.exc_line) == ("ValueError", 4)


def test_jupyter_arrow_gives_the_frame_its_line():
    (t,) = segment(normalise((FORMS / "colab-ipython-input.log").read_text()))
    assert t.frames[0].location == "<ipython-input-12-3f2a9c1b7d4e>:10"
    assert t.frames[1].file.endswith("torch/nn/modules/module.py") and t.frames[1].line == 1051
    assert t.user_frame.location == "<ipython-input-12-3f2a9c1b7d4e>:10"


def test_interleaved_ranks_are_separate_tracebacks():
    tbs = segment(normalise((FORMS / "many-ranks-interleaved.log").read_text()))
    assert sorted(t.rank for t in tbs) == list(range(8))
    assert all(len(t.frames) == 3 and t.exc_type == "torch.OutOfMemoryError" for t in tbs)


def test_interleaved_processes_without_ranks_are_separated_by_pid():
    tbs = segment(normalise((FORMS / "ray-train-workers.log").read_text()))
    assert sorted(t.stream for t in tbs) == ["4412", "4413"]


def test_windows_stdlib_and_console_scripts_are_not_user_code():
    text = ("Traceback (most recent call last):\n"
            '  File "C:\\Users\\ana\\proj\\train.py", line 7, in <module>\n'
            "    main()\n"
            '  File "C:\\Python310\\lib\\runpy.py", line 86, in _run_code\n'
            "    exec(code, run_globals)\n"
            '  File "/opt/conda/bin/torchrun", line 8, in <module>\n'
            "    sys.exit(main())\n"
            "RuntimeError: x\n")
    (t,) = segment(normalise(text))
    assert t.user_frame.location == "C:\\Users\\ana\\proj\\train.py:7"


def test_line_numbers_are_kept_with_an_offset():
    lines = normalise("a\nb\n", first_line_no=41)
    assert [(ln.no, ln.text) for ln in lines] == [(41, "a"), (42, "b"), (43, "")]


# -- text as people have it (issue 13): encodings, NUL padding; binary only when binary ------

def _oom_log() -> str:
    from pathlib import Path

    return (Path(__file__).resolve().parent.parent / "fixtures" / "logs" / "forms"
            / "torchrun-tee-default-prefix.log").read_text()


def _evidence(report) -> list:
    return [(f.rule, [e.line for e in f.evidence]) for f in report.findings]


@pytest.mark.parametrize("name, encode, extra_lines", [
    ("utf-16 with BOM (PowerShell >)", lambda t: t.encode("utf-16"), 0),
    ("utf-16-le without BOM", lambda t: t.encode("utf-16-le"), 0),
    ("utf-16-be without BOM", lambda t: t.encode("utf-16-be"), 0),
    ("utf-32 with BOM", lambda t: t.encode("utf-32"), 0),
    ("utf-32-le without BOM", lambda t: t.encode("utf-32-le"), 0),
    ("utf-8 with BOM", lambda t: t.encode("utf-8-sig"), 0),
    ("NUL padding after a crash", lambda t: t.encode() + b"\0" * 200_000, 0),
    ("NUL run in the middle", lambda t: b"starting\n" + b"\0" * 70_000 + b"\n" + t.encode(), 2),
    ("GBK", lambda t: ("训练开始：第 1 步\n错误：显存不足，请减小批量\n" + t).encode("gbk"), 2),
    ("Shift-JIS", lambda t: ("トレーニングを開始します。\nエラーが発生しました\n" + t).encode("shift_jis"), 2),
    ("cp1252", lambda t: ("Démarrage de l'entraînement — étape 1\n" + t).encode("cp1252"), 1),
])
def test_a_log_in_any_encoding_is_read_as_a_log(tmp_path, name, encode, extra_lines):
    text = _oom_log()
    plain = tmp_path / "plain.log"
    plain.write_text(text)
    want = [(rule, [n + extra_lines for n in lines]) for rule, lines in _evidence(explain_path(plain, RULES))]
    assert want and want[0][0] == "cuda-oom"
    path = tmp_path / "encoded.log"
    path.write_bytes(encode(text))
    assert _evidence(explain_path(path, RULES)) == want  # same findings, evidence on the same lines


def test_a_big_utf16_log_is_scanned_in_regions_with_its_line_numbers(tmp_path, monkeypatch):
    from mpdoctor.logs import read
    from mpdoctor.logs import regions as log_regions

    monkeypatch.setattr(read, "WHOLE_LIMIT", 64 * 1024)
    monkeypatch.setattr(log_regions, "CHUNK", 64 * 1024)
    text = "".join(f"[rank0]: step {i} | loss 0.5\n" for i in range(5_000)) + _oom_log()
    (tmp_path / "plain.log").write_text(text)
    (tmp_path / "u16.log").write_bytes(text.encode("utf-16"))
    big = explain_path(tmp_path / "u16.log", RULES)
    assert big.input["scanned"] == "regions" and big.input["encoding"] == "utf-16"
    assert _evidence(big) == _evidence(explain_path(tmp_path / "plain.log", RULES))


@pytest.mark.parametrize("name, data", [
    ("PNG", lambda: b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + __import__("random").Random(1).randbytes(20_000)),
    ("random bytes", lambda: __import__("random").Random(2).randbytes(50_000)),
    ("ELF", lambda: open(__import__("sys").executable, "rb").read(65536)),
    ("gzip", lambda: __import__("gzip").compress(b"Traceback (most recent call last):\n" * 2000)),
])
def test_binary_is_still_binary(tmp_path, name, data):
    from mpdoctor.logs import InputError, read_log

    path = tmp_path / "x.log"
    path.write_bytes(data())
    with pytest.raises(InputError, match="binary"):
        read_log(str(path), [])
