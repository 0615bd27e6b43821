"""Pastes as people send them (issue 21): quoted, diff-prefixed and gutter-numbered lines,
ranks interleaved and glued mid-line, a paste cut right after the `raise` line, kernel and
container-runtime lines with no Python at all, bare numeric logs going non-finite, and a
condition the log shows was survived. Each log in fixtures/logs/forms/ was written for this
test (none comes from a blind set)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpdoctor import rulebase
from mpdoctor.logs.explain import explain_path, explain_text
from mpdoctor.logtext import normalise
from mpdoctor.logtext.normalise import unquote

FORMS = Path(__file__).resolve().parent.parent / "fixtures" / "logs" / "forms"

CASES = [
    # (file, top category, top rule or None)
    ("diff-plus-unscale.log", "fp16-gradient-unscale", None),
    ("quoted-oom.log", "out-of-memory", "cuda-oom"),
    ("gutter-dtype.log", "dtype-mismatch", None),
    ("glued-ranks-unscale.log", "fp16-gradient-unscale", None),
    ("cut-after-raise.log", "fp16-gradient-unscale", None),
    ("dmesg-amdgpu-gcvm.log", "cuda-kernel-fault", "amdgpu-gpu-page-fault"),
    ("dmesg-nvrm-xid.log", "cuda-kernel-fault", None),
    ("container-cuda-requirement.log", "driver-too-old", "container-cuda-requirement-unsatisfied"),
    ("loss-columns-nan.log", "non-finite-values", "loss-column-nonfinite"),
    ("loss-dicts-nan.log", "non-finite-values", None),
    ("comfyui-allocation-on-device.log", "out-of-memory", "comfyui-allocation-on-device"),
    ("deepspeed-batch-assert-rank-cjk.log", "accelerate-config", "deepspeed-batch-size-mismatch"),
    ("hccl-ei0006-cjk.log", "distributed-communication", None),
]
SURVIVED = {"skipped-step-grad-norm-nan.log"}  # must stay quiet: test_a_skipped_step_...


@pytest.fixture(scope="module")
def rules():
    return rulebase.load(kind="log")


@pytest.mark.parametrize("name, category, rule", CASES, ids=[c[0].removesuffix(".log") for c in CASES])
def test_a_paste_form_is_diagnosed(name, category, rule, rules):
    findings = explain_path(FORMS / name, rules).findings
    assert findings, "no finding"
    top = findings[0]
    assert (top.severity, top.category) == ("error", category), [(f.severity, f.category, f.rule) for f in findings[:3]]
    if rule:
        assert top.rule == rule


@pytest.mark.parametrize("prefix", ["+", "> ", "| ", "  12 | ", ">> "])
def test_a_quoted_or_prefixed_block_reads_as_the_plain_one(prefix, rules):
    plain = ("Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n    scaler.step(opt)\n"
             "ValueError: Attempting to unscale FP16 gradients.")
    text = "\n".join(prefix + line for line in plain.splitlines())
    top = explain_text(text, rules).findings[0]
    assert top.category == "fp16-gradient-unscale"


def test_the_numeric_finding_says_it_read_numbers_alone(rules):
    f = explain_path(FORMS / "loss-columns-nan.log", rules).findings[0]
    text = " ".join([f.title, *f.explanation])
    assert "numbers alone" in text and "nan" in text


def test_a_nan_row_that_recovers_is_no_finding(rules):
    text = "100 2.4531\n200 nan\n300 2.1187\n400 1.9822\n500 1.9001\n"
    assert not [f for f in explain_text(text, rules).findings if f.severity == "error"]


def test_a_skipped_step_under_a_dynamic_scaler_is_no_error(rules):
    # one window of grad_norm nan while the loss stays finite and training goes on
    [name] = SURVIVED
    findings = explain_path(FORMS / name, rules).findings
    assert not [f for f in findings if f.severity == "error"], [(f.severity, f.rule) for f in findings]


def test_kernel_and_runtime_lines_need_no_python(rules):
    for name in ("dmesg-amdgpu-gcvm.log", "container-cuda-requirement.log"):
        text = (FORMS / name).read_text(encoding="utf-8")
        assert "Traceback" not in text and "Error:" not in text.replace("requirement error:", "")
        assert explain_text(text, rules).findings[0].severity == "error"


LOSS_ROWS = "".join(f"{{'loss': {2.0 - i / 10:.4f}, 'grad_norm': 1.1, 'epoch': {i / 10}}}\n" for i in range(1, 6))
NAN_WINDOW = ("{'loss': 2.1, 'grad_norm': 1.3, 'epoch': 0.0}\n{'loss': nan, 'grad_norm': nan, 'epoch': 0.05}\n"
              "{'loss': nan, 'grad_norm': nan, 'epoch': 0.06}\n")


def test_a_condition_training_went_on_after_is_information(rules):
    # severity from context: the same non-finite window, then normal training
    findings = explain_text(NAN_WINDOW + LOSS_ROWS, rules).findings
    assert findings and not [f for f in findings if f.severity in ("error", "warning")], \
        [(f.severity, f.rule) for f in findings]
    nan = next(f for f in findings if f.category == "non-finite-values")
    assert nan.severity == "info" and "survived" in nan.explanation


def test_the_same_condition_with_nothing_after_stays_an_error(rules):
    findings = explain_text(NAN_WINDOW, rules).findings
    assert findings[0].severity == "error" and findings[0].category == "non-finite-values"


def test_a_condition_followed_by_a_traceback_is_not_survived(rules):
    tb = ('Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n    main()\n'
          "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    findings = explain_text(NAN_WINDOW + LOSS_ROWS + tb, rules).findings
    assert any(f.category == "non-finite-values" and f.severity == "error" for f in findings), \
        [(f.severity, f.rule) for f in findings]


WRAPPED = ['Traceback (most recent call last):', '  File "/app/train.py", line 9, in <module>', '    out = model(x)',
           'RuntimeError: expected scalar type', 'Float but found BFloat16']


@pytest.mark.parametrize("mark", ["> ", "> > ", "+", "| ", "gutter"])
def test_a_quoted_paste_is_unquoted_in_the_normalisers_view(mark, rules):
    # the message is hard-wrapped: it reads whole only once the marks are off every line
    lines = [(f"{i:>3} | " if mark == "gutter" else mark) + ln for i, ln in enumerate(WRAPPED, 1)]
    seen = [ln.text for ln in normalise("\n".join(lines))]
    assert seen[0] == "Traceback (most recent call last):", seen
    top = explain_text("\n".join(lines), rules).findings[0]
    assert (top.category, top.rule) == ("dtype-mismatch", "expected-scalar-type")


def test_a_quoted_paste_whose_last_line_lost_its_mark(rules):
    text = "\n".join("> " + ln for ln in WRAPPED[:-1]) + "\n" + WRAPPED[-1]
    assert explain_text(text, rules).findings[0].category == "dtype-mismatch"


def test_a_few_marked_lines_or_a_box_are_left_as_they_are():
    mixed = "step 1\nstep 2\nstep 3\n> a quoted remark\nstep 4\n"
    assert unquote(mixed) == mixed
    box = ("│ /home/u/train.py:12 in main                                  │\n"
           "│   11 │     loss = model(x)                                    │\n"
           "│ ❱ 12 │     loss.backward()                                    │\n")
    assert unquote(box) == box
    ascii_box = "+----------------------------+\n| Traceback (most recent call last) |\n| a.py:3 |\n| b.py:4 |\n"
    assert unquote(ascii_box) == ascii_box


def test_a_source_line_two_ranks_glued_is_split_at_the_frame_boundary():
    lines = [ln.text for ln in normalise((FORMS / "glued-ranks-unscale.log").read_text(encoding="utf-8"))]
    assert lines.count("    self.optimizer.step()") == 2 and lines.count("    main()") == 2, lines
    assert not any("step()self" in ln for ln in lines)
    # an ordinary source line is left whole
    assert [ln.text for ln in normalise("    return F.linear(input, self.weight, self.bias)")] == \
        ["    return F.linear(input, self.weight, self.bias)"]


def test_stacked_rank_prefixes_name_the_inner_rank():
    # the launcher's local index comes first, the process's own rank last
    for line in ("[default1]:[rank3]: RuntimeError: boom", "[1,0]<stderr>:[rank3]: RuntimeError: boom"):
        (ln,) = normalise(line)
        assert (ln.rank, ln.text) == (3, "RuntimeError: boom"), line
    (ln,) = normalise("[default2]: RuntimeError: boom")
    assert ln.rank == 2


def test_an_mpirun_tag_glued_mid_line_is_not_text(rules):
    text = ('[1,1]<stderr>:  File "/opt/conda/lib/python3.8/site-packages/torch/distributed/distributed_c10d.py", '
            'line 911, in irecv\n[1,1]<stderr>:RuntimeError[1,1]<stderr>:: Unconvertible NCCL type BFloat16\n')
    lines = [ln for ln in normalise(text) if ln.text]
    assert lines[-1].text == "RuntimeError: Unconvertible NCCL type BFloat16" and lines[-1].rank == 1
    top = explain_text(text, rules).findings[0]
    assert (top.category, top.rule) == ("distributed-communication", "nccl-unsupported-dtype")


def test_a_line_glued_after_a_progress_bar_is_a_line_of_its_own(rules):
    text = (" 1%|▏         | 23/1752 [01:05<1:23:14,  2.89s/it]\n"
            " 1%|▏         | 24/1752 [01:08<1:22:56,  2.88s/it][rank5]:[E602 11:17:52.185053341 "
            "ProcessGroupNCCL.cpp:632] [Rank 5] Watchdog caught collective operati\n")
    lines = [ln for ln in normalise(text) if ln.text]
    assert lines[-1].rank == 5 and lines[-1].text.startswith("[E602"), lines[-1]
    assert lines[-2].text.endswith("2.88s/it]")
    top = explain_text(text, rules).findings[0]
    assert (top.category, top.rule) == ("distributed-communication", "nccl-watchdog-timeout")


def test_a_bracketed_line_number_gutter_is_taken_off():
    body = ["Traceback (most recent call last):", '  File "/app/train.py", line 9, in <module>', "    out = model(x)",
            "RuntimeError: boom"]
    text = "\n".join(f"[{n}] {ln}" for n, ln in enumerate(body, 1741))
    assert [ln.text for ln in normalise(text)] == body
    # bracketed process tags that do not count the lines are left alone
    tags = "\n".join(f"[{n}] {ln}" for n, ln in zip((0, 2, 1, 3), body))
    assert unquote(tags) == tags


def test_a_paste_that_starts_inside_a_rich_box_is_read_as_the_box(rules):
    # the box's top border was not pasted: its rows are still unwrapped, the folded path rejoined
    text = ("│ /home/steve/.local/lib/python3.10/site-packages/accelerate/accel │\n"
            "│ erator.py:355 in __init__                                        │\n"
            "│                                                                  │\n"
            "│    354 │   │   │   if not torch.cuda.is_available() and not pars │\n"
            "│ ❱  355 │   │   │   │   raise ValueError(err.format(mod\n")
    lines = [ln.text for ln in normalise(text) if ln.text.strip()]
    assert lines[0] == "/home/steve/.local/lib/python3.10/site-packages/accelerate/accelerator.py:355 in __init__", lines
    assert not any("│ " in ln[:2] for ln in lines)
    top = explain_text(text, rules).findings[0]
    assert (top.category, top.rule) == ("fp16-unsupported-device", "accelerate-fp16-gpu-check-cut")
    # a rich table's rows (no path, no frame) are left as they are
    table = "│ 0 │ model │ GPT │ 124 M │\n│ 1 │ head  │ Linear │ 38 M │\n"
    assert [ln.text for ln in normalise(table) if ln.text] == table.splitlines()


def test_a_markdown_table_of_steps_going_nan_reads_as_columns(rules):
    rows = ["The loss went nan:", "", "| step | loss |", "|------|------|"]
    rows += [f"| {i * 100} | {2.5 - i / 10:.4f} |" for i in range(1, 6)] + [f"| {i * 100} | nan |" for i in range(6, 12)]
    lines = [ln.text for ln in normalise("\n".join(rows))]
    assert "100   2.4000" in lines and "600   nan" in lines, lines
    top = explain_text("\n".join(rows), rules).findings[0]
    assert (top.severity, top.category, top.rule) == ("error", "non-finite-values", "loss-column-nonfinite")
    # one nan row that recovers stays quiet here too
    recovers = ["| step | loss |", "| --- | --- |", "| 100 | 2.45 |", "| 200 | nan |", "| 300 | 2.11 |",
                "| 400 | 1.98 |", "| 500 | 1.90 |"]
    assert not [f for f in explain_text("\n".join(recovers), rules).findings if f.severity == "error"]


@pytest.mark.parametrize("progress", ["Epoch 0: 40%| | 40/100 [00:10<00:15, 4.0it/s, v_num=0, train_loss={v}]",
                                      "Epoch 1 | step {i} | Loss: {v}", "Epoch [1][{i}/900] lr: 2e-04, loss_cls: {v}"])
def test_training_going_on_is_read_in_the_usual_progress_forms(progress, rules):
    warning = ("/usr/lib/python3.9/site-packages/torch/nn/utils/clip_grad.py:55: FutureWarning: Non-finite norm "
               "encountered in torch.nn.utils.clip_grad_norm_; continuing anyway.\n")
    after = "".join(progress.format(i=i, v=f"{2.3 - i / 100:.3f}") + "\n" for i in range(1, 5))
    survived = next(f for f in explain_text(warning + after, rules).findings if f.category == "non-finite-values")
    assert survived.severity == "info", survived.severity
    # the loss scale is no loss: lines that only report it do not show training going on
    scale = "".join(f"[deepspeed] OVERFLOW! Skipping step. loss_scale: {2 ** (16 - i)}\n" for i in range(4))
    kept = next(f for f in explain_text(warning + scale, rules).findings if f.category == "non-finite-values")
    assert kept.severity == "error"
