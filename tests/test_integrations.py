"""The integrations (a transformers TrainerCallback, a Lightning Callback) on real
trainers on the CPU, and the public API of `import mpdoctor`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import mpdoctor


def test_import_mpdoctor_shows_its_api_and_imports_no_framework() -> None:
    code = ("import sys, mpdoctor, mpdoctor.integrations\n"
            "print(sorted(n for n in dir(mpdoctor) if not n.startswith('_')))\n"
            "print([m for m in ('torch', 'transformers', 'lightning', 'rich', 'accelerate') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    public, loaded = out.stdout.splitlines()
    assert public == str(["Finding", "Report", "Watcher", "print_findings", "render_findings", "watch"])
    assert loaded == "[]"
    assert set(mpdoctor.__all__) >= {"watch", "render_findings", "print_findings", "Finding", "Report"}


def test_findings_from_the_api_render_in_every_format(capsys: pytest.CaptureFixture) -> None:
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    with mpdoctor.watch(net) as h:
        for step in range(2):
            if step == 1:
                with torch.no_grad():
                    net[1].bias.fill_(float("nan"))
            net(torch.randn(2, 4)).sum().backward()
    md = mpdoctor.render_findings(h, "markdown")
    assert "non-finite-values" in md and "`1`" in md
    data = json.loads(mpdoctor.render_findings(h.findings(), "json"))
    assert data["findings"][0]["facts"]["module"] == "1"
    assert "1" in mpdoctor.render_findings(h.report(), "terminal", width=100)
    assert mpdoctor.render_findings(h, "oneline").count("\n") >= 1
    mpdoctor.print_findings(h, "terminal")
    assert "non-finite-values" in capsys.readouterr().out
    with pytest.raises(ValueError, match="format must be"):
        mpdoctor.render_findings([], "html")


def test_a_missing_framework_says_what_to_install() -> None:
    from mpdoctor.integrations import first_available, require

    with pytest.raises(ImportError, match=r"pip install 'nosuchframework>=1'"):
        require("nosuchframework", "mpdoctor.integrations.x", "nosuchframework>=1")
    with pytest.raises(ImportError, match="needs one of nosuch_a, nosuch_b"):
        first_available([("nosuch_a", "C"), ("nosuch_b", "C")], "x", "y")


# ---- transformers ------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """The Trainer initialises accelerate's process-wide state: leave none behind for the
    tests that make their own Accelerator."""
    yield
    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(True)


def _tiny_trainer(tmp_path, callback, hook=None):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    if hook is not None:
        hook(model)
    ids = torch.randint(0, 64, (8, 8))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2,
                                          use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                                          disable_tqdm=True, learning_rate=1e-3, dataloader_num_workers=0)
    return transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])


def _nan_on_third_call(module) -> None:
    calls = {"n": 0}

    def hook(m, args, out):
        calls["n"] += 1
        return out * float("nan") if calls["n"] == 3 else out
    module.register_forward_hook(hook)


@pytest.mark.slow
def test_transformers_callback_reports_a_nan_made_in_a_layer(tmp_path, capsys: pytest.CaptureFixture) -> None:
    from mpdoctor.integrations.transformers import MpdoctorCallback

    cb = MpdoctorCallback()
    trainer = _tiny_trainer(tmp_path, cb, hook=lambda m: _nan_on_third_call(m.transformer.h[1].mlp))
    trainer.train()
    top = cb.findings[0]
    assert top.category == "non-finite-values"
    assert (top.facts["module"], top.facts["step"]) == ("transformer.h.1.mlp", 2)
    assert cb.handle.step == 3 and not cb.handle.internal_errors
    assert not cb.handle._hooks and not cb.handle._module_hooks  # the hooks are gone after the training
    err = capsys.readouterr().err
    assert "mpdoctor: findings of this training" in err and "transformer.h.1.mlp" in err


@pytest.mark.slow
def test_transformers_callback_sees_the_precision_the_trainer_asked_for(tmp_path, capsys, monkeypatch) -> None:
    # issue 19: Trainer(fp16=True, use_cpu=True) trains in plain fp32; the callback says
    # so as `mpdoctor run` does (the script: fixtures/scripts/scenarios/trainer_fp16_cpu_callback.py),
    # run here as __main__: the callback lives in the training's own process anyway
    import runpy
    from pathlib import Path

    pytest.importorskip("transformers")
    script = Path(__file__).resolve().parent.parent / "fixtures" / "scripts" / "scenarios" / "trainer_fp16_cpu_callback.py"
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    out, err = capsys.readouterr()
    assert "callback plan requested='fp16', first matmul float32" in out
    assert ("mpdoctor: error [fp16-silently-fp32-on-cpu] fp16-unsupported-device: fp16 asked for, but the run "
            "trained on the CPU in plain fp32") in err


@pytest.mark.slow
def test_transformers_callback_reports_a_training_that_raises(tmp_path, capsys: pytest.CaptureFixture) -> None:
    from mpdoctor.integrations.transformers import MpdoctorCallback

    def to_double_on_step_1(model) -> None:
        calls = {"n": 0}

        def pre(m, args):
            calls["n"] += 1
            return (args[0].double(),) if calls["n"] == 2 else None
        model.transformer.h[0].mlp.c_fc.register_forward_pre_hook(pre)

    cb = MpdoctorCallback(report="oneline")
    trainer = _tiny_trainer(tmp_path, cb, hook=to_double_on_step_1)
    with pytest.raises(RuntimeError):
        try:
            trainer.train()
        finally:
            cb.finish()
    top = cb.findings[0]
    assert top.severity == "error" and top.facts["module"] == "transformer.h.0.mlp.c_fc"
    assert top.facts["step"] == 1
    assert "error [matmul-operands-dtype] dtype-mismatch" in capsys.readouterr().err  # one line a finding


# ---- Lightning ---------------------------------------------------------------------------

def _lightning_module(fail_at: int | None = None, nan_at: int | None = None, accumulate: int = 1,
                      samples: int = 16, max_steps: int = 4):
    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning.pytorch")

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
            self.head = torch.nn.Linear(16, 1)

        def training_step(self, batch, batch_idx):  # calls its submodules, never self(...)
            if batch_idx == fail_at:
                raise ValueError("the data loader handed over a broken batch")
            h = self.body(batch[0])
            if batch_idx == nan_at:
                h = h * float("nan")
            return self.head(h).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(samples, 8)), batch_size=4)
    trainer = L.Trainer(accelerator="cpu", max_steps=max_steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=accumulate)
    return Net(), data, trainer


@pytest.mark.slow
def test_lightning_callback_reports_a_nan_between_modules(capsys: pytest.CaptureFixture) -> None:
    from mpdoctor.integrations.lightning import MpdoctorCallback

    net, data, trainer = _lightning_module(nan_at=2)
    cb = MpdoctorCallback(every=2)  # sampled: steps 0 and 2 watched, as Lightning counts them
    trainer.callbacks.append(cb)
    trainer.fit(net, data)
    assert cb.handle.every == 2 and cb.handle.step == 3
    nf = cb.handle.first_nonfinite
    # the NaN was made by code between body and head: it entered head, at Lightning's step 2
    assert (nf.module, nf.step, nf.origin) == ("head", 2, "input")
    assert cb.findings[0].category == "non-finite-values"
    assert "head" in capsys.readouterr().err


@pytest.mark.slow
def test_lightning_callback_reports_a_fit_that_raises(capsys: pytest.CaptureFixture) -> None:
    from mpdoctor.integrations.lightning import MpdoctorCallback

    net, data, trainer = _lightning_module(fail_at=1)
    cb = MpdoctorCallback(report="json")
    trainer.callbacks.append(cb)
    with pytest.raises(ValueError):
        trainer.fit(net, data)
    assert cb.session.failure is not None and cb.handle.step == 1
    errs = [e for e in cb.handle.errors if "broken batch" in e.exception]
    assert errs and errs[0].step == 1
    printed = capsys.readouterr().err
    assert "broken batch" in printed


@pytest.mark.slow
def test_lightning_callback_counts_optimizer_steps_under_gradient_accumulation() -> None:
    from mpdoctor.integrations.lightning import MpdoctorCallback

    # 3 optimizer steps of 2 batches each; the NaN is in batch 5: step 2, its second micro-batch
    net, data, trainer = _lightning_module(nan_at=5, accumulate=2, samples=32, max_steps=3)
    cb = MpdoctorCallback(report=None)
    trainer.callbacks.append(cb)
    trainer.fit(net, data)
    assert trainer.global_step == 3 and cb.handle.step == 2
    nf = cb.handle.first_nonfinite
    assert (nf.module, nf.step) == ("head", 2)
