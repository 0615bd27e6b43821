"""No secret in any output: every shape of secret, planted anywhere mpdoctor reads
(a log line, a config value at any depth, an environment variable, a command argument),
never appears in any output format (terminal, oneline, json, markdown, a `run --report`
file, a snapshot). The one redaction module is mpdoctor/redact.py."""

from __future__ import annotations

import json
import string
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpdoctor import cli
from mpdoctor.findings import Evidence, Finding, Report
from mpdoctor.redact import (
    REDACTED,
    anonymize_snapshot,
    anonymizer,
    is_secret_name,
    markdown_safe,
    redact_argv,
    redact_obj,
    redact_snapshot,
    redact_text,
)
from mpdoctor.render import render_text
from tests.rulekit import private_cache  # noqa: F401 (autouse fixture)

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "fixtures" / "snapshots" / "t4-old-driver-fp16.json"
ALNUM = string.ascii_letters + string.digits
B64URL = ALNUM + "_-"
HEX = "0123456789abcdef"
FORMATS = ("terminal", "oneline", "json", "markdown")
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])


def chars(alphabet: str, n: int) -> st.SearchStrategy[str]:
    return st.text(alphabet=alphabet, min_size=n, max_size=n)


# every token shape: (name, strategy of the whole secret)
SHAPES = {
    "huggingface": chars(ALNUM, 34).map(lambda x: "hf_" + x),
    "github-classic": st.tuples(st.sampled_from("pousr"), chars(ALNUM, 36)).map(lambda t: f"gh{t[0]}_{t[1]}"),
    "github-fine-grained": st.tuples(chars(ALNUM, 22), chars(ALNUM, 59)).map(lambda t: f"github_pat_{t[0]}_{t[1]}"),
    "openai": chars(ALNUM, 48).map(lambda x: "sk-" + x),
    "openai-project": chars(B64URL, 64).map(lambda x: "sk-proj-" + x),
    "slack": st.tuples(st.sampled_from("bpa"), chars(string.digits, 12), chars(ALNUM, 24)).map(
        lambda t: f"xox{t[0]}-{t[1]}-{t[2]}"),
    "aws": chars(string.ascii_uppercase + string.digits, 16).map(lambda x: "AKIA" + x),
    "google": chars(B64URL, 35).map(lambda x: "AIza" + x),
    "gitlab": chars(B64URL, 20).map(lambda x: "glpat-" + x),
    "jwt": st.tuples(chars(B64URL, 20), chars(B64URL, 40), chars(B64URL, 43)).map(
        lambda t: f"eyJ{t[0]}.eyJ{t[1]}.{t[2]}"),
}
# a random value that cannot occur in mpdoctor's own text by chance
VALUE = chars(ALNUM, 20).map(lambda x: "Q7" + x)
SECRET_NAMES = ["hub_token", "HF_TOKEN", "HF_HUB_PASS", "api_key", "WANDB_API_KEY", "password", "db_password",
                "client_secret", "auth_token", "secret_key", "passwd", "apiKey", "hubToken", "access_token"]
# how a named secret is written in a line of text: (form, value) -> text
NAMED_FORMS = [
    lambda n, v: f"{n}={v}", lambda n, v: f"{n}: {v}", lambda n, v: f'"{n}": "{v}"', lambda n, v: f"{n}='{v}'",
    lambda n, v: f"--{n} {v}", lambda n, v: f"--{n.replace('_', '-')}={v}", lambda n, v: f"export {n}={v}",
]
# what may sit right before a token: anything but a letter or digit (`_` included)
JOINERS = ["", " ", "_", "/", "=", "'", '"', "(", ":", "-", "\t", "x_"]


# an argument list in any quoting: (flag, value) -> text
ARGLIST_FORMS = [
    # accelerate's CalledProcessError prints the Python list
    lambda f, v: f"Command '['/usr/bin/python', 'train.py', '{f}', '{v}', '--lr', '1']' returned non-zero exit status 1.",
    lambda f, v: f'["python", "train.py", "{f}", "{v}"]',  # a JSON array
    lambda f, v: f'{{"cmd": "[\\"{f}\\", \\"{v}\\"]"}}',  # a JSON array inside a JSON string
    lambda f, v: f"python train.py '{f}' '{v}'",  # shell words, quoted
    lambda f, v: f'python train.py {f} "{v}"',
    lambda f, v: f"('{f}', '{v}')",  # a tuple
]
# an assignment with any spacing, in code and in files: (name, value) -> text
ASSIGN_FORMS = [
    lambda n, v: f"{n}    = {v}", lambda n, v: f"{n}\t=\t{v}", lambda n, v: f"{n}  :  {v}",
    lambda n, v: f'os.environ["{n}"] = "{v}"', lambda n, v: f"os.environ['{n}']='{v}'",
    lambda n, v: f'os.environ.setdefault("{n}", "{v}")',
]


@st.composite
def planted_secret(draw) -> tuple[str, str]:
    """(the text to plant, the secret bytes that must never come out)."""
    kind = draw(st.sampled_from(["shape", "named", "url", "query", "bearer", "wandb", "arglist", "assign",
                                 "wandb-login", "netrc"]))
    if kind == "arglist":
        value = draw(VALUE)
        flag = draw(st.sampled_from(["--hub_token", "--hub-token", "--api_key", "--password", "--wandb-api-key"]))
        return draw(st.sampled_from(ARGLIST_FORMS))(flag, value), value
    if kind == "assign":
        value = draw(VALUE)
        name = draw(st.sampled_from(["HF_TOKEN", "WANDB_API_KEY", "HF_HUB_PASS", "api_key", "db_password"]))
        return draw(st.sampled_from(ASSIGN_FORMS))(name, value), value
    if kind == "wandb-login":
        hexkey = draw(chars(HEX, 40))
        return draw(st.sampled_from([f'wandb.login(key="{hexkey}")', f"wandb.login(key='{hexkey}', relogin=True)",
                                     f'key = "{hexkey}"'])), hexkey
    if kind == "netrc":
        value = draw(VALUE)
        return draw(st.sampled_from([f"machine api.wandb.ai login user password {value}",
                                     f"machine huggingface.co login hf password {value}"])), value
    if kind == "shape":
        secret = draw(st.sampled_from(sorted(SHAPES)).flatmap(lambda k: SHAPES[k]))
        before, after = draw(st.sampled_from(JOINERS)), draw(st.sampled_from(JOINERS + ["_x", ".", ","]))
        return before + secret + after, secret
    value = draw(VALUE)
    if kind == "named":
        name = draw(st.sampled_from(SECRET_NAMES))
        return draw(st.sampled_from(NAMED_FORMS))(name, value), value
    if kind == "url":
        return f"https://user:{value}@huggingface.co/org/model.git", value
    if kind == "query":
        param = draw(st.sampled_from(["token", "access_token", "api_key", "key", "password", "sig", "X-Amz-Signature"]))
        return f"https://example.com/file.bin?a=1&{param}={value}&b=2", value
    if kind == "bearer":
        return f"Authorization: Bearer {value}", value
    hexkey = draw(chars(HEX, 40))
    return f"WANDB_API_KEY={hexkey}", hexkey


def run_cli(args, capsys):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out + err


# --- the property over every face ---------------------------------------------------------

@PROPERTY
@given(planted=planted_secret(), where=st.sampled_from(["message", "path", "unrecognised"]),
       fmt=st.sampled_from(FORMATS), extra=st.sampled_from([[], ["--anonymize"], ["-v"]]))
def test_no_secret_from_a_log_reaches_any_explain_output(tmp_path, capsys, planted, where, fmt, extra):
    text, secret = planted
    lines = ["epoch 1 step 3 loss 2.1", "Traceback (most recent call last):",
             '  File "/home/ana/proj/train.py", line 9, in <module>']
    if where == "message":
        lines.append(f"ValueError: fp16 mixed precision requires a GPU {text}")
    elif where == "path" and not text.startswith("machine "):  # a netrc line is a line, not a path
        lines[2] = f'  File "/home/ana/run_{text}/train.py", line 9, in <module>'
        lines.append("ValueError: fp16 mixed precision requires a GPU")
    else:
        lines.insert(0, text)
        lines.append(f"KeyError: 'label {text}'")
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    _, out = run_cli(["explain", log, "--format", fmt, *extra], capsys)
    assert secret not in out, (fmt, extra, text)


def test_the_planted_line_is_still_shown_with_the_secret_cut(tmp_path, capsys):
    """The property above is not vacuous: the line carrying the secret is in the output,
    the same line number, only the secret bytes replaced."""
    log = tmp_path / "train.log"
    token = "hf_" + "a1B2" * 9
    log.write_text("Traceback (most recent call last):\n  File \"/w/t.py\", line 1, in <module>\n"
                   f"ValueError: fp16 mixed precision requires a GPU (auth {token}, --hub_token s3cr3tVALUE)\n")
    _, out = run_cli(["explain", log, "--format", "json"], capsys)
    data = json.loads(out)
    ev = next(e for f in data["findings"] for e in f["evidence"] if "fp16 mixed precision" in e["text"])
    assert ev["line"] == 3
    assert ev["text"] == f"ValueError: fp16 mixed precision requires a GPU (auth {REDACTED}, --hub_token {REDACTED})"
    _, out = run_cli(["explain", log, "--format", "markdown"], capsys)
    assert token not in out and "s3cr3tVALUE" not in out and "--hub_token <redacted>" in out


@st.composite
def nested_config(draw) -> tuple[dict, str]:
    """A config with a secret-named key at a random depth, under random plain keys and
    lists (`deepspeed_config.wandb.api_key`, `comet: [{api_key: ...}]`)."""
    value = draw(VALUE)
    node: object = {draw(st.sampled_from(SECRET_NAMES)): value, "enabled": True}
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from(["deepspeed_config", "wandb", "comet", "logging", "extra", "tracker", "fsdp_config"]))
        node = {key: [node]} if draw(st.booleans()) else {key: node}
    return node, value


@PROPERTY
@given(config=nested_config(), planted=planted_secret(), env_name=st.sampled_from(SECRET_NAMES),
       fmt=st.sampled_from(FORMATS))
def test_no_secret_in_a_snapshot_reaches_check_output(tmp_path, capsys, config, planted, env_name, fmt):
    """A snapshot (from collect, or hand-made) with secrets in its config at any depth,
    its env section and a path: check prints none of them, in any format."""
    conf, conf_secret = config
    text, secret = planted
    snap = json.loads(SNAPSHOT.read_text())
    snap["accelerate_config"]["config"].update(conf)
    snap["accelerate_config"]["path"] = f"/home/ana/cfg_{text}/default_config.yaml"
    env_value = "Z9" + secret[::-1]
    snap["env"] = {env_name.upper(): env_value}
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(snap))
    _, out = run_cli(["check", "--snapshot", path, "--format", fmt], capsys)
    for s in (conf_secret, secret, env_value):
        assert s not in out, (fmt, s)
    # and the snapshot itself, as collect writes it
    dumped = json.dumps(redact_snapshot(snap))
    for s in (conf_secret, secret, env_value):
        assert s not in dumped


@PROPERTY
@given(planted=planted_secret(), flag=st.sampled_from(["--hub_token", "--hub-token", "--api_key", "--password",
                                                       "--wandb-api-key", "--auth-token"]),
       value=VALUE, fmt=st.sampled_from(FORMATS), anonymize=st.booleans())
def test_no_secret_in_a_command_line_reaches_a_run_report(planted, flag, value, fmt, anonymize):
    """What `run` writes (terminal on stderr, --report FILE in any --format): the
    command's arguments carry secrets as `--flag value`, `--flag=value`, and shapes."""
    text, secret = planted
    cmd = ["python", "train.py", flag, value, f"{flag}={value}", "--note", text, "--lr", "3e-4"]
    finding = Finding(rule="cuda-oom", category="out-of-memory", severity="error", title=f"OOM in {' '.join(cmd)}",
                      explanation=f"The command {' '.join(cmd)} failed.", fixes=[f"Rerun `{' '.join(cmd)}`."],
                      evidence=[Evidence(text=" ".join(cmd), line=1)], facts={"command": " ".join(cmd)})
    report = Report(findings=[finding], extra={"exit_code": 1, "command": cmd}, input={"command": " ".join(cmd)})
    out = render_text(report, fmt, heading="mpdoctor run (exit status 1)", anonymize=anonymize,
                      schema="mpdoctor.run/1", where="run")
    assert value not in out and secret not in out


@pytest.mark.slow
def test_run_report_file_and_stderr_carry_no_hub_token(tmp_path):
    """The repro: `run --report` wrote a `--hub_token X` argument twice."""
    import subprocess

    token = "hf_" + "Zx9" * 12
    script = tmp_path / "t.py"
    script.write_text("import sys\nraise ValueError('fp16 mixed precision requires a GPU')\n")
    for fmt, name in (("json", "r.json"), ("markdown", "r.md"), ("oneline", "r.txt")):
        report = tmp_path / name
        proc = subprocess.run([sys.executable, "-m", "mpdoctor", "run", "--no-probe", "--format", fmt, "--report",
                               str(report), "--", sys.executable, str(script), "--hub_token", "plainSECRET42", token],
                              capture_output=True, text=True, timeout=60)
        body = report.read_text()
        for out in (body, proc.stderr):
            assert "plainSECRET42" not in out and token not in out
        if fmt == "json":
            data = json.loads(body)
            assert data["schema"] == "mpdoctor.run/1"
            assert data["command"][-3:] == ["--hub_token", REDACTED, REDACTED]
        if fmt == "markdown":
            assert body.startswith("## mpdoctor run") and "**Environment**" in body


# --- the repros of the issue, one each ----------------------------------------------------

def test_token_after_underscore_in_a_path_is_cut():
    assert redact_text("/cache/models--org_hf_abcdefghijklmnopqrstuvwxyz0123/x") == \
        f"/cache/models--org_{REDACTED}/x"
    assert redact_text("run_ghp_abcdefghijklmnopqrstuvwxyz0123456789_final") == f"run_{REDACTED}_final"


def test_secret_names_env_config_and_flags():
    assert is_secret_name("HF_HUB_PASS") and is_secret_name("WANDB_API_KEY") and is_secret_name("--hub-token")
    assert is_secret_name("apiKey") and is_secret_name("AWS_SESSION_TOKEN")
    assert not is_secret_name("TOKENIZERS_PARALLELISM") and not is_secret_name("max_tokens")
    assert not is_secret_name("mixed_precision") and not is_secret_name("KEYBOARD")


def test_deepspeed_and_accelerate_config_secrets_at_any_depth():
    cfg = {"deepspeed_config": {"wandb": {"enabled": True, "api_key": "k" * 40, "project": "p"},
                                "comet": {"api_key": "c0metKEY", "workspace": "w"}},
           "mixed_precision": "fp16", "hub": [{"token": "t0k"}]}
    out = redact_obj(cfg)
    assert out["deepspeed_config"]["wandb"] == {"enabled": True, "api_key": REDACTED, "project": "p"}
    assert out["deepspeed_config"]["comet"] == {"api_key": REDACTED, "workspace": "w"}
    assert out["mixed_precision"] == "fp16" and out["hub"] == [{"token": REDACTED}]


def test_invalid_yaml_error_line_keeps_no_secret():
    """An invalid YAML config put the offending line (with its secret) into the snapshot."""
    snap = {"accelerate_config": {"error": {"type": "YAMLError", "message":
            "while parsing a block mapping\n  in \"cfg.yaml\", line 3\n    hub_token: hf_abcdefghijklmnopqrstuvwxyz0123\n"
            "    api_key: plainValue123 ]["}}, "env": {"HF_HUB_PASS": "pw1"}}
    out = json.dumps(redact_snapshot(snap))
    assert "hf_abc" not in out and "plainValue123" not in out and "pw1" not in out


def test_argv_flags_and_harmless_values():
    assert redact_argv(["accelerate", "launch", "--hub_token", "abc", "--hub-token=xyz", "--push_to_hub",
                        "--use_auth_token", "--lr", "1e-4"]) == \
        ["accelerate", "launch", "--hub_token", REDACTED, f"--hub-token={REDACTED}", "--push_to_hub",
         "--use_auth_token", "--lr", "1e-4"]
    assert redact_text("Namespace(hub_token=None, push=True)") == "Namespace(hub_token=None, push=True)"
    assert redact_text("TOKENIZERS_PARALLELISM=false max_tokens=512") == "TOKENIZERS_PARALLELISM=false max_tokens=512"


def test_url_credentials_and_query_parameters():
    assert redact_text("git clone https://oauth2:p@ss@gitlab.com/a/b.git") == f"git clone https://{REDACTED}@gitlab.com/a/b.git"
    assert redact_text("GET https://s3.aws/x?X-Amz-Signature=abcd1234&X-Amz-Date=1") == \
        f"GET https://s3.aws/x?X-Amz-Signature={REDACTED}&X-Amz-Date=1"


def test_anonymize_home_user_and_host():
    anon = anonymizer(home="/home/ana", user="ana", host="gpu-node-17.cluster.local")
    assert anon("/home/ana/proj/t.py on gpu-node-17 by ana") == "~/proj/t.py on <host> by <user>"
    assert anon("/home/bob/x C:\\Users\\carol\\y") == "/home/<user>/x C:\\Users\\<user>\\y"
    snap = anonymize_snapshot({"platform": {"executable": "/home/ana/venv/bin/python"}}, home="/home/ana", user="ana")
    assert snap["platform"]["executable"] == "~/venv/bin/python" and snap["anonymized"] is True


def test_markdown_keeps_the_markers_visible():
    md = "It ran at <redacted> for <user>.\n```text\nline 1: <redacted>\n```\n`<user>`"
    assert markdown_safe(md) == "It ran at \\<redacted\\> for \\<user\\>.\n```text\nline 1: <redacted>\n```\n`<user>`"


def test_check_markdown_anonymize_hides_the_home_directory(capsys):
    _, plain = run_cli(["check", "--snapshot", SNAPSHOT, "--format", "markdown"], capsys)
    assert "/home/ana" in plain  # what it hid before
    for fmt in FORMATS:
        _, out = run_cli(["check", "--snapshot", SNAPSHOT, "--format", fmt, "--anonymize"], capsys)
        assert "/home/ana" not in out, fmt
        if fmt != "oneline":
            assert "/home/<user>" in out.replace("\\<user\\>", "<user>"), fmt


def test_redaction_is_linear_on_long_hostile_lines():
    import time

    for ch in ("a", "_", "-", "=", ":", "@", "/", "`", " ", "hf_", "https://", "--token "):
        t0 = time.perf_counter()
        redact_text(ch * 20000)
        assert time.perf_counter() - t0 < 1.0, ch


def test_private_key_blocks_webhooks_and_more_token_shapes():
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\nAAAAdGVzdA==\n-----END OPENSSH PRIVATE KEY-----"
    assert redact_text(f"key file:\n{pem}\n") == \
        f"key file:\n-----BEGIN OPENSSH PRIVATE KEY-----{REDACTED}-----END OPENSSH PRIVATE KEY-----\n"
    assert "XXXXXXXXXXXXXXXXXXXXXXXX" not in redact_text("https://hooks.slack.com/services/T00/B00/XXXXXXXXXXXXXXXXXXXXXXXX")
    for token in ("sk-ant-api03-" + "a" * 40, "api_org_" + "b" * 30, "xoxp-1234-5678-abcdefabcdef", "glpat-" + "c" * 20):
        assert redact_text(f"use={token};") in (f"use={REDACTED};",), token


def test_no_false_alarm_on_the_rule_base_and_the_real_logs():
    """Redaction must not eat what mpdoctor says or the logs' ordinary lines
    (`tokenizer.pad_token = tokenizer.eos_token`, `$PWD:/workspace`, usage metavars)."""
    from mpdoctor.rulebase import load

    for rule in load([]):
        for text in [rule.title, *rule.fixes, *rule.references]:
            assert redact_text(text) == text, (rule.id, text)
    changed = []
    for path in sorted((ROOT / "fixtures" / "logs").rglob("*.log")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if redact_text(line) != line:
                changed.append((path.name, line))
    assert changed == []


# --- the paths of issue 17: files written on the side, rule pages, clipped text -------------

EVENTS = ROOT / "fixtures" / "events" / "clean-run.json"
PROBE = ROOT / "fixtures" / "probe" / "bf16-cpu.json"


def _strings_into(doc: dict, text: str, secret_env: tuple[str, str]) -> dict:
    """A recorded document with secrets planted where a run or a probe mode puts them: the
    command line, each process's environment section and recorded exception, any string."""
    name, value = secret_env
    doc = json.loads(json.dumps(doc))
    if "command" in doc:
        doc["command"] = ["python", "train.py", "--hub_token", value, "--note", text]
    for p in doc.get("processes", []):
        p["env"].setdefault("env", {})[name] = value
        p["exceptions"] = [{"exception": f"RuntimeError: failed {text}", "module": "", "step": 1}]
    doc["note"] = text
    return doc


@PROPERTY
@given(planted=planted_secret(), env_name=st.sampled_from(["HF_TOKEN", "WANDB_API_KEY", "HF_HUB_PASS"]), value=VALUE)
def test_no_secret_in_a_saved_events_file(tmp_path, planted, env_name, value):
    """MPDOCTOR_SAVE_EVENTS held the process's HF_TOKEN and `--hub_token X` verbatim: the
    document is written through redact_record (diagnosis/run.py)."""
    from mpdoctor.redact import redact_record

    text, secret = planted
    doc = _strings_into(json.loads(EVENTS.read_text()), text, (env_name, value))
    out = json.dumps(redact_record(doc))
    assert secret not in out and value not in out
    assert json.loads(out)["processes"][0]["env"]["env"][env_name] == REDACTED


@PROPERTY
@given(planted=planted_secret(), value=VALUE)
def test_no_secret_in_a_saved_probe_file(tmp_path, monkeypatch, planted, value):
    """MPDOCTOR_SAVE_PROBE=DIR: the file probe/judge.save_evidence writes, read back."""
    from mpdoctor.diagnosis.probe import save_evidence

    text, secret = planted
    evidence = json.loads(PROBE.read_text())
    evidence["options"] = {**evidence.get("options", {}), "cmd": ["--hub_token", value], "note": text}
    evidence["stderr"] = f"Traceback ...\nRuntimeError: {text}\nHF_TOKEN={value}"
    import tempfile

    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    monkeypatch.setenv("MPDOCTOR_SAVE_PROBE", str(folder))
    save_evidence(evidence)
    body = (folder / f"probe-{evidence['mode']}.json").read_text(encoding="utf-8")
    assert secret not in body and value not in body


@pytest.mark.slow
def test_a_real_run_saves_events_without_its_secrets(tmp_path):
    """The repro end to end: an instrumented run with HF_TOKEN in its environment and
    `--hub_token X` in its command line; the saved events keep neither."""
    import os
    import subprocess

    token, plain = "hf_" + "Qz8" * 12, "plainSAVEDsecret9"
    script = tmp_path / "t.py"
    script.write_text("import sys\nraise ValueError('fp16 mixed precision requires a GPU')\n")
    saved = tmp_path / "events.json"
    env = {**os.environ, "HF_TOKEN": token, "MPDOCTOR_SAVE_EVENTS": str(saved)}
    subprocess.run([sys.executable, "-m", "mpdoctor", "run", "--", sys.executable, str(script), "--hub_token", plain],
                   capture_output=True, text=True, timeout=120, env=env)
    body = saved.read_text(encoding="utf-8")
    assert json.loads(body)["command"][-2:] == ["--hub_token", REDACTED]
    assert token not in body and plain not in body


def _toml(s: str) -> str:
    return json.dumps(s)  # a TOML basic string takes JSON's escapes


@PROPERTY
@given(planted=planted_secret(), fmt=st.sampled_from(["terminal", "json", "markdown"]),
       where=st.sampled_from(["title", "doc", "fix", "reference"]))
def test_no_secret_from_a_user_rule_reaches_rules_show_or_list(tmp_path, capsys, planted, fmt, where):
    """`rules show --format json|markdown` printed a user rule's tokens and URL credentials
    (the terminal format cut them)."""
    text, secret = planted
    text = text.replace("{", "(").replace("}", ")")  # braces are a template's placeholders
    title = f"Mine failed {text}" if where == "title" else "Mine failed"
    import tempfile

    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    (folder / "log").mkdir(parents=True)
    (folder / "log" / "mine.toml").write_text("\n".join([
        'id = "mine"', 'category = "cuda-kernel-fault"', f"title = {_toml(title)}",
        'patterns = ["MINE FAILED"]', 'explanation = ["Because."]',
        f"fixes = [{_toml('Run it again ' + text if where == 'fix' else 'Run it again.')}]",
        f"references = [{_toml('https://example.com/x ' + text if where == 'reference' else 'https://example.com/x')}]",
        "[doc]", f"why = {_toml('It happens: ' + text if where == 'doc' else 'It happens.')}",
        "[[example]]", 'text = "MINE FAILED here"', "[[near_miss]]", 'text = "fine"']) + "\n")
    code, out = run_cli(["rules", "show", "mine", "--rules", folder, "--format", fmt], capsys)
    assert code == 0, out
    assert secret not in out, (fmt, where, text)
    code, out = run_cli(["rules", "list", "--rules", folder, "--format", fmt], capsys)
    assert secret not in out


@PROPERTY
@given(planted=planted_secret(), pad=st.integers(340, 410), where=st.sampled_from(["message", "unrecognised"]),
       fmt=st.sampled_from(FORMATS))
def test_a_clip_never_leaves_part_of_a_secret(tmp_path, capsys, planted, pad, where, fmt):
    """Evidence and unrecognised exceptions are clipped to 400 characters: a secret across
    the cut (`https://user:password` whose `@` falls past it) came out whole. Secrets are
    cut first now; no 8 characters of one reach the output."""
    text, secret = planted
    filler = ("x " * pad)[:pad]
    if where == "message":
        line = f"ValueError: fp16 mixed precision requires a GPU {filler}{text} and more words after it"
    else:
        line = f"KeyError: 'label {filler}{text} and more words after it'"
    log = tmp_path / "clip.log"
    log.write_text(f'Traceback (most recent call last):\n  File "/w/t.py", line 1, in <module>\n{line}\n')
    _, out = run_cli(["explain", log, "--format", fmt], capsys)
    pieces = [secret[i:i + 8] for i in range(0, max(1, len(secret) - 7))]
    assert not [p for p in pieces if p in out], (fmt, where, text)


def test_the_url_whose_at_falls_past_the_cut():
    from mpdoctor.redact import clip

    line = "x" * 380 + " https://ana:Sup3rS3cretPassw0rd@git.example.com/org/repo.git"
    out = clip(line, 400)
    assert len(out) == 400 and "Sup3rS3cret" not in out and out.endswith("…")
    assert "https://<redacted>" in redact_text("see https://ana:Sup3rS3cret…")  # already cut by someone else
    # cut without a mark (a `[:300]` elsewhere): a password is not a port
    assert "Sup3rS3cret" not in redact_text("RuntimeError: cannot clone https://ana:Sup3rS3cret")
    assert redact_text("listening on http://localhost:8080") == "listening on http://localhost:8080"


@pytest.mark.parametrize("text, secret", [
    ("subprocess.CalledProcessError: Command '['/usr/bin/python', 'train.py', '--hub_token', 'plainSecret1']' "
     "returned non-zero exit status 1.", "plainSecret1"),
    ('["--hub_token", "plainSecret2", "--lr", "1e-4"]', "plainSecret2"),
    ("HF_TOKEN    = plainSecret3", "plainSecret3"),
    ('os.environ["WANDB_API_KEY"] = "plainSecret4"', "plainSecret4"),
    ('wandb.login(key="0123456789abcdef0123456789abcdef01234567")', "0123456789abcdef0123456789abcdef01234567"),
    ("password plainSecret5", "plainSecret5"),
    ("machine api.wandb.ai login user password plainSecret6", "plainSecret6"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\nAAAAdGVzdA", "b3BlbnNzaC1rZXk"),
])
def test_the_new_secret_shapes_of_the_issue(text, secret):
    out = redact_text(text)
    assert secret not in out and REDACTED in out


@pytest.mark.parametrize("text", [
    "wandb.login(key=os.environ['WANDB_API_KEY'])", "login failed: wrong password for user bob",
    "tokens = ['the', 'token', 'is', 'here']", "['--lr', '3e-4', '--push_to_hub', '--output_dir', 'out']",
    "tokenizer.pad_token = tokenizer.eos_token", 'parser.add_argument("--hub_token", type=str, default=None)',
])
def test_what_only_looks_like_the_new_shapes_stays(text):
    assert redact_text(text) == text


def test_the_new_shapes_stay_linear_on_long_hostile_lines():
    import time

    for unit in ("'--token', ", '"HF_TOKEN"', "machine h ", "login(", "key=", " = ", "\\\"", "https://a…"):
        t0 = time.perf_counter()
        redact_text(unit * (20000 // len(unit)))
        assert time.perf_counter() - t0 < 1.0, unit


def test_a_pastes_own_placeholder_is_not_a_secret():
    """`--env "HUGGING_FACE_HUB_TOKEN=<secret>"` (a real paste, blind set 4) stays as pasted;
    it became `<redacted>>`. A real value next to it is still cut."""
    line = 'docker run --env "HUGGING_FACE_HUB_TOKEN=<secret>" -p 5000:5000 vllm/vllm-openai'
    assert redact_text(line) == line
    assert redact_text("HF_TOKEN=<your_token_here>") == "HF_TOKEN=<your_token_here>"
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in redact_text("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123")
