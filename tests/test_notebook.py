"""`%load_ext mpdoctor` in a real Jupyter kernel (ipykernel, run through nbclient), on
real torch errors on the CPU: the diagnosis follows the cell's error as markdown, made
from the cell's own traceback and what it printed; an error no rule knows adds nothing;
`%mpdoctor check / last / explain` and a watch() handle render in the notebook; an error
inside mpdoctor leaves one line and the kernel going. One kernel for the whole module.

And the other side: the command line never imports IPython (nor this extension)."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

HALF_MATMUL = "torch.ones(2, 3, dtype=torch.float16) @ torch.ones(3, 2)"
BF16_LINEAR = "torch.nn.Linear(3, 2)(torch.ones(2, 3, dtype=torch.bfloat16))"
SCALAR_TYPE = "torch.bmm(torch.ones(1, 2, 3, dtype=torch.half), torch.ones(1, 3, 2))"

CELLS = {
    "load": "%load_ext mpdoctor\nimport torch, mpdoctor",
    "half_matmul": HALF_MATMUL,
    "bf16_linear": "print('step 1 loss 0.25')\n" + BF16_LINEAR,
    "scalar_type": SCALAR_TYPE,
    # the warning torch prints here is the cell's output: the diagnosis reads it too
    "autocast_cpu": f'with torch.autocast("cuda", dtype=torch.float16):\n    {HALF_MATMUL}',
    "key_error": "{'lr': 1e-4}['learning_rate']",
    "last": "%mpdoctor last",
    "explain_file": "%mpdoctor explain {log}",
    "explain_cell": "%%mpdoctor explain\n{log_text}",
    "explain_missing": "%mpdoctor explain no-such-dir/train.log",
    "check": "%mpdoctor check",
    # a float16 layer whose output overflows: watch() names it, and the handle shows its report
    "watch": ("m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)).half()\n"
              "with torch.no_grad():\n    m[0].weight.fill_(300.0)\n"
              "h = mpdoctor.watch(m)\nm(torch.full((2, 4), 100.0, dtype=torch.half)).float().sum().backward()\nh"),
    # mpdoctor's own state broken on purpose: the next error must still reach the user
    "break_own_state": "import mpdoctor.notebook as nb\nnb._ACTIVE.rules = 'not a rule list'\n" + HALF_MATMUL,
    "still_alive": "nb._ACTIVE.rules = None\nprint('kernel alive')",
    "usage": "%mpdoctor",
    "reload": "%reload_ext mpdoctor\n" + SCALAR_TYPE,  # the hooks once, not twice
    "unload": "%unload_ext mpdoctor\n" + SCALAR_TYPE,
    "magic_gone": "%mpdoctor last",
}


def _expected(expr: str) -> tuple[list[str], str]:
    """The finding titles `mpdoctor explain` gives for this expression's error in this
    process, and the traceback text."""
    import torch  # noqa: F401  (the expression needs it)

    from mpdoctor import rulebase
    from mpdoctor.logs import explain_text

    try:
        eval(expr)
    except Exception:
        text = traceback.format_exc()
    else:  # pragma: no cover
        raise AssertionError(f"{expr} did not raise")
    return [f.title for f in explain_text(text, rulebase.load()).findings], text


@pytest.fixture(scope="module")
def notebook(tmp_path_factory):
    pytest.importorskip("IPython")
    pytest.importorskip("ipykernel")
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("torch")
    work = tmp_path_factory.mktemp("nb")
    _, half_text = _expected(HALF_MATMUL)
    log = work / "crash.log"
    log.write_text("epoch 0\n" + half_text)
    nb = nbformat.v4.new_notebook()
    names = list(CELLS)
    nb.cells = [nbformat.v4.new_code_cell(CELLS[n].replace("{log}", str(log)).replace("{log_text}", half_text))
                for n in names]
    with pytest.MonkeyPatch.context() as mp:
        # the kernel imports this checkout's mpdoctor, whatever is installed
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        mp.setenv("COLUMNS", "80")
        client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                                         resources={"metadata": {"path": str(work)}})
        client.execute()
    return {n: cell.outputs for n, cell in zip(names, nb.cells, strict=True)}


def _markdown(outputs) -> list[str]:
    return [o["data"]["text/markdown"] for o in outputs
            if o["output_type"] == "display_data" and "text/markdown" in o.get("data", {})]


def _stream(outputs, name: str) -> str:
    return "".join(o["text"] for o in outputs if o["output_type"] == "stream" and o["name"] == name)


def _error(outputs) -> dict:
    errors = [o for o in outputs if o["output_type"] == "error"]
    assert len(errors) == 1, outputs
    return errors[0]


@pytest.mark.slow
def test_load_ext_is_quiet(notebook):
    assert notebook["load"] == []


@pytest.mark.slow
@pytest.mark.parametrize("cell, expr, rule", [
    ("half_matmul", HALF_MATMUL, "matmul-operands-dtype"),
    ("bf16_linear", BF16_LINEAR, "matmul-operands-dtype"),
    ("scalar_type", SCALAR_TYPE, "expected-scalar-type"),
])
def test_a_precision_error_is_followed_by_its_diagnosis(notebook, cell, expr, rule):
    outputs = notebook[cell]
    error = _error(outputs)
    assert error["ename"] == "RuntimeError"
    (markdown,) = _markdown(outputs)
    # after the cell's own error, which is left as IPython showed it
    assert [o["output_type"] for o in outputs][-2:] == ["error", "display_data"]
    titles, _ = _expected(expr)
    assert titles
    for title in titles:
        assert title in markdown
    assert f"rule `{rule}`" in markdown
    assert markdown.startswith(f"## mpdoctor explain Cell In[{CELLS_INDEX[cell]}]")
    # the cell is named as IPython names it, not by the kernel's temporary file
    assert "ipykernel_" not in markdown
    plain = next(o["data"]["text/plain"] for o in outputs if o["output_type"] == "display_data")
    assert titles[0] in plain


CELLS_INDEX = {name: i + 1 for i, name in enumerate(CELLS)}  # execution counts: one per cell


@pytest.mark.slow
def test_the_cell_output_is_context(notebook):
    # the printed line passes through untouched
    assert "step 1 loss 0.25" in _stream(notebook["bf16_linear"], "stdout")
    # torch's warning on stderr (autocast asked for CUDA on a CPU machine) is read with the traceback
    outputs = notebook["autocast_cpu"]
    assert "CUDA is not available" in _stream(outputs, "stderr")
    (markdown,) = _markdown(outputs)
    assert "rule `matmul-operands-dtype`" in markdown
    assert "rule `autocast-disabled-no-cuda`" in markdown


@pytest.mark.slow
def test_an_error_no_rule_knows_adds_nothing(notebook):
    outputs = notebook["key_error"]
    assert _error(outputs)["ename"] == "KeyError"
    assert [o["output_type"] for o in outputs] == ["error"]


@pytest.mark.slow
def test_mpdoctor_last_explains_the_last_exception(notebook):
    (markdown,) = _markdown(notebook["last"])
    assert "Not recognised" in markdown and "KeyError" in markdown
    assert "learning_rate" in markdown


@pytest.mark.slow
def test_mpdoctor_explain_a_file_and_a_cell(notebook):
    titles, _ = _expected(HALF_MATMUL)
    for cell in ("explain_file", "explain_cell"):
        (markdown,) = _markdown(notebook[cell])
        assert titles[0] in markdown, cell
        assert "rule `matmul-operands-dtype`" in markdown


@pytest.mark.slow
def test_mpdoctor_explain_a_missing_file_says_so(notebook):
    outputs = notebook["explain_missing"]
    assert _stream(outputs, "stderr") == "mpdoctor: no-such-dir/train.log: no such file\n"
    assert _markdown(outputs) == []


@pytest.mark.slow
def test_mpdoctor_check_renders(notebook):
    (markdown,) = _markdown(notebook["check"])
    assert markdown.startswith("## mpdoctor check (this machine)")
    assert "**Checklist**" in markdown
    assert "torch" in markdown


@pytest.mark.slow
def test_a_watch_handle_renders_as_its_report(notebook):
    outputs = notebook["watch"]
    results = [o for o in outputs if o["output_type"] == "execute_result"]
    assert len(results) == 1, outputs
    assert _stream(outputs, "stderr") == ""
    markdown = results[0]["data"].get("text/markdown", "")
    assert markdown.startswith("## mpdoctor watch"), outputs
    assert "rule `nonfinite-made-in-forward`" in markdown and "`0` (Linear)" in markdown


@pytest.mark.slow
def test_an_error_inside_mpdoctor_leaves_one_line_and_the_kernel(notebook):
    outputs = notebook["break_own_state"]
    assert _error(outputs)["ename"] == "RuntimeError"  # the user's error, as IPython showed it
    assert _markdown(outputs) == []
    note = _stream(outputs, "stderr").strip().splitlines()
    assert len(note) == 1 and note[0].startswith("mpdoctor: no diagnosis for this cell"), note
    assert "Traceback" not in _stream(outputs, "stderr")
    assert _stream(notebook["still_alive"], "stdout") == "kernel alive\n"


@pytest.mark.slow
def test_the_magic_without_a_command_says_how(notebook):
    assert _stream(notebook["usage"], "stderr").startswith("usage: %mpdoctor check")


@pytest.mark.slow
def test_a_terminal_ipython_gets_plain_text(tmp_path):
    pytest.importorskip("IPython")
    pytest.importorskip("torch")
    cells = ["%load_ext mpdoctor", "import torch", HALF_MATMUL, "{}['x']", "print('alive')", "exit"]
    env = {**os.environ, "COLUMNS": "80",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "IPython", "--simple-prompt", "--no-banner", "--colors=nocolor",
                           "--no-confirm-exit"], input="\n".join(cells) + "\n", capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)
    out = proc.stdout
    titles, _ = _expected(HALF_MATMUL)
    error_at = out.index("RuntimeError: expected m1 and m2")
    diagnosis = out[error_at:out.index("In [4]")]
    assert f"✗ error · dtype-mismatch · matmul-operands-dtype\n  {titles[0]}" in diagnosis, out
    assert "##" not in diagnosis and "`dtype-mismatch`" not in diagnosis  # text, not markdown
    # at 80 columns, but for a single unbreakable item (a URL)
    assert all(len(line) <= 80 or " " not in line.strip() for line in diagnosis.splitlines()[1:]), diagnosis
    key_error = out[out.index("In [4]"):out.index("In [5]")]
    assert "KeyError" in key_error and "mpdoctor" not in key_error
    assert "alive" in out
    assert "mpdoctor:" not in proc.stderr + out, proc.stderr


@pytest.mark.slow
def test_reload_and_unload(notebook):
    assert len(_markdown(notebook["reload"])) == 1
    assert _error(notebook["unload"])["ename"] == "RuntimeError"
    assert [o["output_type"] for o in notebook["unload"]] == ["error"]
    assert "Line magic function `%mpdoctor` not found" in _stream(notebook["magic_gone"], "stderr")


def test_the_command_line_never_imports_ipython(tmp_path):
    log = tmp_path / "crash.log"
    log.write_text("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
                   "RuntimeError: expected scalar type Half but found Float\n")
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "mpdoctor", "explain", str(log)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "expected-scalar-type" in proc.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "mpdoctor.logs" in imported  # the measure works
    top = {name.split(".")[0] for name in imported}
    assert not top & {"IPython", "ipykernel", "jupyter_client", "torch"}, top & {"IPython", "ipykernel", "torch"}
    assert "mpdoctor.notebook" not in imported


def test_the_output_kept_as_context_is_bounded_and_passes_through():
    import io

    from mpdoctor.notebook import _OUTPUT_KEPT, _Kept, _Tee

    stream, kept = io.StringIO(), _Kept()
    tee = _Tee(stream, kept)
    assert tee.install()
    chunk = "loss 0.5 " * 1000 + "\n"
    for _ in range(200):
        print(chunk, end="", file=stream)
    print("the last line", file=stream)
    tee.uninstall()
    assert stream.getvalue() == chunk * 200 + "the last line\n"  # every byte, as written
    assert "write" not in vars(stream)  # the stream's own write again
    assert kept.text() == (chunk * 200 + "the last line\n")[-_OUTPUT_KEPT:]
    assert sum(map(len, kept.parts)) <= 2 * _OUTPUT_KEPT
