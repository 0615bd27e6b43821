"""Secrets out of everything mpdoctor writes: the one redaction module.

Every face's output (terminal, json, markdown, `run --report`, snapshots) passes
through here just before it leaves mpdoctor. What is cut, whatever the input:

- tokens by their known shapes (Hugging Face `hf_`, GitHub `ghp_`/`gho_`/`ghs_`/
  `ghu_`/`ghr_`/`github_pat_`, OpenAI/Anthropic `sk-`, Slack `xox?-`, AWS `AKIA`/`ASIA`,
  Google `AIza`, GitLab `glpat-`, PyPI `pypi-`, npm `npm_`, JWTs `eyJ…`, `Bearer …`);
- credentials in URLs (`https://user:pass@host`) and secret query parameters
  (`?token=`, `&api_key=`, `&X-Amz-Signature=` …);
- values named like secrets: `HF_TOKEN=…`, `HF_TOKEN    = …` (any spacing), `password: …`,
  `"api_key": "…"`, `--hub_token X` / `--hub-token=X` in command lines, and in configs
  (dicts and lists) at any depth (`deepspeed_config.wandb.api_key`, `comet.api_key`);
- argument lists in any quoting: a Python list's repr (`CalledProcessError: Command
  '[..., '--hub_token', 'X']'`), JSON arrays (`["--hub_token", "X"]`, escaped inside a
  JSON string too), shell words (`'--hub_token' 'X'`); subscripts and calls
  (`os.environ["WANDB_API_KEY"] = "X"`, `os.environ.setdefault("HF_TOKEN", "X")`);
- `wandb.login(key="…")`, a `key` holding 32+ hex digits, netrc's `password X`
  (`machine h login u password p`, or a line of its own);
- what a clip cut short (`https://user:pass…`, a token's head before `…`, a private
  key block without its END): `clip()` cuts secrets first, then the text.

`inert()` shows control characters (OSC 52 clipboard writes, `\x1b[2J`, C1 controls,
bidirectional overrides) as visible escapes; `Scrubber` applies redaction, --anonymize
and `inert` as the last step of every face's output, `redact_record` to the files
mpdoctor writes on the side (MPDOCTOR_SAVE_EVENTS, MPDOCTOR_SAVE_PROBE).

Patterns are not anchored on `\\b` (an `_` before a token must not hide it) and each
is linear in its input (every repetition starts only where a word starts). Only the
secret bytes become `<redacted>`; everything around them, line numbers included, stays.

`--anonymize` (every face) also replaces the home directory with `~` and the user and
host names with `<user>` / `<host>`.

Cheap to import: `re` and `os` only, and no pattern is compiled at import: each is
compiled the first time it is needed, and `redact_text` runs a pattern only on text
holding what every match of it must hold (a `://`, an `=`, a token's prefix), so that
`mpdoctor explain` on a short traceback compiles and runs few of them.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable


class _Lazy:
    """A module-level pattern compiled on first use; then its methods are plain
    attributes, as fast as the compiled pattern's own."""

    def __init__(self, pattern: str, flags: int = 0):
        self._args = (pattern, flags)

    def __getattr__(self, name: str) -> Any:
        rx = re.compile(*self._args)
        for method in ("match", "search", "sub", "split", "finditer", "findall", "fullmatch", "pattern", "flags"):
            self.__dict__[method] = getattr(rx, method)
        return getattr(rx, name)


REDACTED = "<redacted>"
USER = "<user>"
HOST = "<host>"
MARKERS = (REDACTED, USER, HOST)

# --- names -------------------------------------------------------------------------

# a word of a name that makes the whole name secret (HF_HUB_PASS, wandb_api_key, hubToken)
_SECRET_WORDS = frozenset({
    "token", "secret", "secrets", "password", "passwd", "pass", "pwd", "passphrase", "auth",
    "authorization", "credential", "credentials", "apikey", "key", "privatekey", "accesskey",
    "secretkey", "cookie", "signature", "sig", "sas", "bearer", "jwt", "otp", "pat",
})
# whole names that look secret but hold none
_NOT_SECRET = frozenset({"pytorch_kernel_cache_path", "keyboard", "xauthority", "token_type_ids",
                         "key_dtype", "sort_key", "primary_key"})
_SECRET_PREFIX = ("aws_", "azure_", "google_application_credentials")
_WORD_SPLIT = _Lazy(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def _words(name: str) -> list[str]:
    return [w.lower() for w in _WORD_SPLIT.split(name) if w]


# a tokenizer's special tokens are text, not credentials (tokenizer.pad_token = ...)
_TOKENIZER_WORDS = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "added", "start",
                              "end", "next", "image", "audio", "chat", "default", "max", "num"})


def _tokenizer_token(words: list[str]) -> bool:
    return len(words) >= 2 and words[-1] == "token" and words[-2] in _TOKENIZER_WORDS


_STRONG_WORDS = frozenset({"secret", "secrets", "password", "passwd", "passphrase", "apikey", "credential",
                           "credentials", "privatekey", "accesskey", "secretkey"})
_STRONG_PAIRS = ("api_key", "access_key", "secret_key", "private_key", "client_secret", "session_token",
                 "auth_token", "access_token", "refresh_token", "api_token", "bearer_token")
_STANDALONE = frozenset({"token", "secret", "password", "passwd", "passphrase", "apikey", "credential",
                         "credentials", "authorization", "auth"})


def _secret_words(words: list[str], *, standalone: frozenset | set) -> bool:
    if not words or _tokenizer_token(words):
        return False
    if len(words) == 1:
        return words[0] in standalone
    joined = "_".join(words)
    return (words[-1] in _SECRET_WORDS or any(w in _STRONG_WORDS for w in words)
            or any(p in joined for p in _STRONG_PAIRS))


def is_secret_name(name: str) -> bool:
    """A config key, environment variable, query parameter or CLI flag whose value is a
    secret: its last word is token/secret/password/pass/key/auth/credential/signature...
    or it holds a strong one anywhere (`HF_TOKEN`, `HF_HUB_PASS`, `wandb_api_key`,
    `--hub-token`, `apiKey`, `AWS_SECRET_ACCESS_KEY`, `password_hash`), but not
    `TOKENIZERS_PARALLELISM`, `max_tokens`, `token_type_ids`, `pad_token`,
    `--calculate_per_token_loss`."""
    bare = name.strip().lstrip("-").strip("\"'")
    low = bare.lower()
    if not low or low in _NOT_SECRET:
        return False
    if low.startswith(_SECRET_PREFIX):
        return True
    return _secret_words(_words(bare), standalone=_SECRET_WORDS - {"pwd", "pat", "otp", "sas", "sig"})


# what makes `<word>_key` in a log line a credential (`wandb_key`, `openai_key`), where
# `full_key: a.b`, `conditioning_key=...`, `sort_key` are code's own words
_KEY_OWNERS = frozenset({"api", "access", "secret", "private", "auth", "hf", "hub", "huggingface", "wandb", "openai",
                         "anthropic", "comet", "neptune", "aws", "azure", "gcp", "google", "stripe", "github", "gitlab",
                         "ssh", "license", "licence", "client", "encryption", "signing", "session", "service",
                         "account", "master", "deploy", "bot", "webhook", "app", "user", "admin", "db", "database"})


def _is_secret_name_in_text(name: str) -> bool:
    """Stricter, for `name=value` inside free text (log lines): a bare `key:` / `pass:` /
    `sig=` is too common in logs to mean a secret; they count when joined to another
    word (`api_key`, `HF_HUB_PASS`); `<word>_key` when the word names what the key
    opens (`wandb_key`, not `full_key` or `sort_key`)."""
    low = name.lower().lstrip("-")
    if low in _NOT_SECRET:
        return False
    words = _words(name.lstrip("-"))
    if len(words) >= 2 and words[-1] == "key" and not any(w in _STRONG_WORDS for w in words) \
            and not any(p in "_".join(words) for p in _STRONG_PAIRS):
        return any(w in _KEY_OWNERS for w in words[:-1])
    return _secret_words(words, standalone=_STANDALONE)


# --- text ----------------------------------------------------------------------------

_NB = r"(?<![A-Za-z0-9])"  # not glued to a letter or digit before; `_`, `/`, `-` are fine
_TOKEN_SHAPES = _Lazy(
    "|".join([
        _NB + r"hf_[A-Za-z0-9]{16,}",
        _NB + r"api_org_[A-Za-z0-9]{16,}",
        _NB + r"gh[pousr]_[A-Za-z0-9]{16,}",
        _NB + r"github_pat_[A-Za-z0-9_]{20,}",
        _NB + r"sk-(?:proj-|ant-|live-|test-)?[A-Za-z0-9_-]{16,}",
        _NB + r"[rs]k_(?:live|test)_[A-Za-z0-9]{16,}",
        _NB + r"xox[abposr]-[A-Za-z0-9-]{10,}",
        _NB + r"xapp-[A-Za-z0-9-]{10,}",
        r"(?<![A-Z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}",
        _NB + r"AIza[0-9A-Za-z_-]{30,}",
        _NB + r"glpat-[0-9A-Za-z_-]{16,}",
        _NB + r"pypi-[A-Za-z0-9_-]{32,}",
        _NB + r"npm_[A-Za-z0-9]{30,}",
        _NB + r"eyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]*",
        _NB + r"(?:r8|gsk|hf_oauth)_[A-Za-z0-9]{24,}",
        r"(?<=hooks\.slack\.com/services/)[A-Za-z0-9/]{16,}",
        r"(?<=discord\.com/api/webhooks/)[0-9]+/[A-Za-z0-9_-]{20,}",
    ])
)
# what every match of _TOKEN_SHAPES holds, one of these (case as in the pattern)
_TOKEN_LITERALS = ("hf_", "api_org_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "sk-", "k_live_",
                   "k_test_", "xox", "xapp-", "AKIA", "ASIA", "AIza", "glpat-", "pypi-", "npm_", "eyJ", "r8_",
                   "gsk_", "hooks.slack.com/services/", "discord.com/api/webhooks/")
_BEARER = _Lazy(r"(?i)(?<![A-Za-z0-9])(?P<scheme>bearer|basic|token)(?P<sp>\s+)(?P<val>[A-Za-z0-9._~+/=-]{12,})")
_WANDB_LOGIN = _Lazy(r"(?i)(?P<pre>wandb\s+login\s+(?:--relogin\s+)?)(?P<val>[0-9a-f]{40})(?![0-9a-f])")
# scheme://CRED@ ; CRED runs to the last @ before the path
_URL_CREDENTIALS = _Lazy(r"(?P<scheme>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,30}://)(?P<cred>[^/\s?#\"'<>@]+(?:@[^/\s?#\"'<>@]+)*)@")
_QUERY = _Lazy(r"(?P<pre>[?&;](?P<name>[A-Za-z0-9_.\[\]-]{1,64})=)(?P<val>[^&#\s\"'<>]+)")
# name = value / name: value / "name": "value" / name='value' (a word start only: linear).
# Only the head (name and separator) is matched; the value is read after it, so that a
# plain `code: /x/run_HF_TOKEN=...` does not swallow the secret assignment inside it.
_ASSIGN_HEAD = _Lazy(
    r"(?<![A-Za-z0-9_.$-])(?P<name>[A-Za-z_][A-Za-z0-9_.-]{0,80})(?P<q1>[\"']?)(?P<sep>[ \t]*(?:=>|[:=])[ \t]*)"
)
# a quoted name, then a separator: an argument list in any quoting (`'--hub_token', 'x'`
# in a Python list repr, `["--hub_token", "x"]` in JSON, `\"--hub_token\", \"x\"` inside a
# JSON string, `"--hub_token" "x"` as shell words) and a subscript or call
# (`os.environ["WANDB_API_KEY"] = "x"`, `os.environ.setdefault("HF_TOKEN", "x")`)
_QUOTED_HEAD = _Lazy(
    r"(?P<q>\\{0,2}[\"'])(?P<name>--?[A-Za-z][A-Za-z0-9_.-]{0,80}|[A-Za-z_][A-Za-z0-9_.]{0,80})(?P=q)"
    r"(?P<sep>[ \t]*(?:\][ \t]*)?(?:,|=(?![=~])|:)?[ \t]*)"
)
# netrc: `machine h login u password p` on one line, or `password p` as a line of its own
_NETRC = _Lazy(r"(?m)(?:(?<![A-Za-z0-9_.-])(?:(?:machine[ \t]+\S+|default)[ \t]+(?:login[ \t]+\S+[ \t]+)?"
               r"(?:account[ \t]+\S+[ \t]+)?|login[ \t]+\S+[ \t]+)|^[ \t]*(?=(?:password|passwd)[ \t]+\S+[ \t]*$))"
               r"(?P<name>password|passwd)[ \t]+(?P<val>[^\s|]+)")
# a login call's key (`wandb.login(key="...")`, `wandb.login(key='...', relogin=True)`)
_LOGIN_CALL = _Lazy(r"(?<![A-Za-z0-9_])login[ \t]*\((?P<args>[^()\n]{0,400})\)")
_CALL_KEY = _Lazy(r"(?<![A-Za-z0-9_])(?P<pre>(?:key|api_key|token)[ \t]*=[ \t]*)(?P<q>[\"']?)(?P<val>[^\"',)\s]+)(?P=q)")
_KEY_HEX_VALUE = _Lazy(r"(\\{0,2}[\"']?)[0-9a-fA-F]{32,}(?![0-9A-Za-z_])\1")
# --flag value / --flag=value / -flag value inside a line
_FLAG_HEAD = _Lazy(r"(?<![A-Za-z0-9-])(?P<name>--?[A-Za-z][A-Za-z0-9_.-]{0,80})(?P<sep>=|[ \t]+)")
# a quoted value, its quote escaped once or twice inside a JSON string (`\"x\"`)
_VALUE_QUOTED = _Lazy(r"(\\{0,2}[\"'])([^\"'\n\\]*(?:\\(?![\"'])[^\"'\n\\]*)*)\1")
_VALUE_BARE = _Lazy(r"[^\s\"',;&)}\]>]+")
_VALUE_ARG = _Lazy(r"[^\s\"',;)\]}>-][^\s\"',;)\]}>]*")
_HARMLESS_VALUES = frozenset({"none", "null", "true", "false", "", "0", "1", "yes", "no", "bearer", "basic",
                              "<redacted>", "***", "[redacted]"})


def _keep_value(value: str) -> bool:
    v = value.strip().lower()
    # `<redacted>`, and a paste's own placeholder (`TOKEN=<secret>`, `<your_token>`): no token starts with "<"
    return v in _HARMLESS_VALUES or v.startswith("<") or v.startswith("$") or v.startswith("${")


_IDENTIFIER_PATH = _Lazy(r"[A-Za-z_][A-Za-z0-9_]{0,80}(?:\.[A-Za-z_][A-Za-z0-9_]{0,80}){0,8}")


def _code_reference(name: str, value: str) -> bool:
    """`use_auth_token=use_auth_token`, `token=args.hub_token`, `auth=auth`: code passing
    a variable along (a bare value, not a string literal) names the secret, holds none."""
    if not _IDENTIFIER_PATH.fullmatch(value):
        return False
    last = value.rsplit(".", 1)[-1]
    return last.lower() == name.lstrip("-").lower() or is_secret_name(last)


def _metavar(name: str, value: str) -> bool:
    """`--aws_secret_access_key AWS_SECRET_ACCESS_KEY` in a usage message: a placeholder."""
    norm = name.lstrip("-").replace("-", "_").upper()
    return value.replace("-", "_").upper() == norm and value.isupper()


def _names_a_key(name: str) -> bool:
    """`key`, `wandb_key`: a name too common in logs to be secret by itself, whose value
    is one when it has the shape of an API key (32 or more hex digits: W&B's is 40)."""
    words = _words(name.lstrip("-"))
    # `apikey`, `wandbkey`, a name glued to the text before it (`xkey`): its last word ends in key
    return bool(words) and words[-1].endswith("key")


def _redact_named(text: str, head: _Lazy, is_secret: Callable[[str], bool], bare: _Lazy) -> str:
    out: list[str] = []
    pos = 0
    for m in head.finditer(text):
        if m.start() < pos:
            continue
        name = m.group("name")
        secret = is_secret(name)
        # `key`: a secret only when its value has an API key's shape (looked at, not scanned)
        if not secret and not (_names_a_key(name) and _KEY_HEX_VALUE.match(text, m.end())):
            continue
        q = _VALUE_QUOTED.match(text, m.end())
        if q:
            span, value = (q.start(2), q.end(2)), q.group(2)
        else:
            v = bare.match(text, m.end())
            if v is None:
                continue
            span, value = v.span(), v.group()
            if _code_reference(name, value):
                continue
        if _keep_value(value) or _metavar(name, value):
            continue
        out.append(text[pos:span[0]])
        out.append(REDACTED)
        pos = span[1]
    out.append(text[pos:])
    return "".join(out)


def _quoted_name_is_secret(name: str, sep: str) -> bool:
    if name.startswith("-"):  # an argument of an argument list: as redact_argv judges it
        return is_secret_name(name)
    if not sep:  # `"HF_TOKEN" "x"`: two strings, not a name and its value
        return False
    if sep.endswith(","):  # ("HF_TOKEN", "x"): a call's arguments; a plain word is a list's item
        return len(_words(name)) >= 2 and _is_secret_name_in_text(name)
    return _is_secret_name_in_text(name)


def _redact_quoted(text: str) -> str:
    """Values after a quoted secret name: `'--hub_token', 'x'`, `["--hub_token", "x"]`,
    `\\"--hub_token\\", \\"x\\"`, `"--hub_token" "x"`, `os.environ["HF_TOKEN"] = "x"`,
    `os.environ.setdefault("HF_TOKEN", "x")`."""
    out: list[str] = []
    pos = 0
    for m in _QUOTED_HEAD.finditer(text):
        if m.start() < pos:
            continue
        name, sep = m.group("name"), m.group("sep").replace(" ", "").replace("\t", "")
        if not _quoted_name_is_secret(name, sep):
            continue
        q = _VALUE_QUOTED.match(text, m.end())
        if q:
            span, value = (q.start(2), q.end(2)), q.group(2)
        elif sep.endswith(("=", ":")):
            v = _VALUE_BARE.match(text, m.end())
            if v is None:
                continue
            span, value = v.span(), v.group()
        else:
            continue
        if value.startswith("-") or _keep_value(value) or _metavar(name, value):
            continue
        out.append(text[pos:span[0]])
        out.append(REDACTED)
        pos = span[1]
    out.append(text[pos:])
    return "".join(out)


def _sub_login_call(m: re.Match) -> str:
    """`wandb.login(key="...")`: the key's value, quoted or a bare key-shaped word (not
    `key=os.environ["WANDB_API_KEY"]`, which holds none)."""
    def key(k: re.Match) -> str:
        value = k.group("val")
        if _keep_value(value) or (not k.group("q") and not _BARE_KEY.fullmatch(value)):
            return k.group(0)
        return k.group("pre") + k.group("q") + REDACTED + k.group("q")

    return m.group(0)[: m.start("args") - m.start()] + _CALL_KEY.sub(key, m.group("args")) + ")"


_BARE_KEY = _Lazy(r"[A-Za-z0-9_-]{20,}")
# where a clip (`…`) cut a secret before the part that marks it: a URL's credentials cut
# before their `@`, a token cut short of its full length
_CLIPPED = _Lazy(
    r"(?P<scheme>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,30}://)(?P<cred>[^/\s?#\"'<>@…]+)(?P<end>…|\Z)"
    r"|(?P<token>(?<![A-Za-z0-9])(?:hf_|api_org_|gh[pousr]_|github_pat_|sk-|[rs]k_(?:live|test)_|xox[abposr]-|xapp-|"
    r"AKIA|ASIA|AIza|glpat-|pypi-|npm_|eyJ|r8_|gsk_)[A-Za-z0-9_.-]*)(?=…)"
)
_KEY_BLOCK_OPEN = _Lazy(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----(?!" + re.escape(REDACTED) + ")")


def _url_cut_at_the_end(text: str) -> bool:
    """Whether the text ends inside a URL's credentials (`... https://user:pass`): a
    cheap look before the pattern is compiled (a whole URL at the end, as a reference
    is, has a path or a port)."""
    tail = text.rsplit(None, 1)[-1] if text.strip() else ""
    i = tail.find("://")
    if i < 0 or "/" in tail[i + 3:] or "@" in tail[i + 3:]:
        return False
    authority = tail[i + 3:]
    return ":" in authority and not authority.rsplit(":", 1)[1].isdigit()


def _sub_clipped(m: re.Match) -> str:
    if not m.group("scheme"):
        return REDACTED
    # cut without a mark (`text[:300]` somewhere): `https://host:8080` is a port, `user:pass` is not
    cred = m.group("cred")
    if not m.group("end") and (":" not in cred or cred.rsplit(":", 1)[1].isdigit()):
        return m.group(0)
    return m.group("scheme") + REDACTED + m.group("end")


def _open_key_blocks(text: str) -> str:
    """A private key block whose END was cut off (or never came): all after its BEGIN."""
    m = _KEY_BLOCK_OPEN.search(text)
    while m:
        end = text.find("-----END ", m.end())
        text = text[: m.end()] + REDACTED + (text[end:] if end >= 0 else "")
        m = _KEY_BLOCK_OPEN.search(text, m.end() + len(REDACTED))
    return text


def _sub_bearer(m: re.Match) -> str:
    value = m.group("val")
    if m.group("scheme").lower() != "bearer" and value.isalpha() and (value.islower() or value[1:].islower()):
        # `Basic environments`, `token classification`: a word, not a credential
        return m.group(0)
    return m.group("scheme") + m.group("sp") + REDACTED


def _sub_query(m: re.Match) -> str:
    name = m.group("name")
    if not (is_secret_name(name) or _secret_words(_words(name), standalone=_SECRET_WORDS)) \
            or _keep_value(m.group("val")):
        return m.group(0)
    return m.group("pre") + REDACTED


_PRIVATE_KEY = _Lazy(r"(-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----)[^-]{0,20000}(-----END )")


def redact_text(text: str) -> str:
    """`text` with every secret-shaped value replaced by `<redacted>`; the rest (line
    breaks, positions of other words) unchanged."""
    if not text or not isinstance(text, str):
        return text
    # Each pattern runs only where its match could be: on text holding the literal every
    # match of it holds (its own case; the caseless ones judged on ASCII text only, where
    # lower() folds as the pattern does).
    if "PRIVATE KEY" in text:
        text = _PRIVATE_KEY.sub(lambda m: m.group(1) + REDACTED + m.group(2), text)
    if "://" in text and "@" in text:
        text = _URL_CREDENTIALS.sub(lambda m: m.group("scheme") + REDACTED + "@", text)
    if "=" in text:
        text = _QUERY.sub(_sub_query, text)
    if any(lit in text for lit in _TOKEN_LITERALS):
        text = _TOKEN_SHAPES.sub(REDACTED, text)
    # the caseless patterns' literals looked for in the text folded as the patterns fold
    # it (casefold also maps the long s and the Kelvin sign that re's IGNORECASE takes)
    low = text.lower() if text.isascii() else text.casefold()
    if "bearer" in low or "basic" in low or "token" in low:
        text = _BEARER.sub(_sub_bearer, text)
    if "wandb" in low:
        text = _WANDB_LOGIN.sub(lambda m: m.group("pre") + REDACTED, text)
    if "-" in text:
        text = _redact_named(text, _FLAG_HEAD, _is_secret_name_in_text, _VALUE_ARG)
    if '"' in text or "'" in text:
        text = _redact_quoted(text)
    if "=" in text or ":" in text:
        text = _redact_named(text, _ASSIGN_HEAD, _is_secret_name_in_text, _VALUE_BARE)
    if "password" in text or "passwd" in text:
        text = _NETRC.sub(lambda m: m.group(0)[: m.start("val") - m.start()] + REDACTED, text)
    if "login" in text:
        text = _LOGIN_CALL.sub(_sub_login_call, text)
    if "…" in text or ("://" in text and _url_cut_at_the_end(text)):
        text = _CLIPPED.sub(_sub_clipped, text)
    if "PRIVATE KEY" in text:
        text = _open_key_blocks(text)
    return text


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters (an ellipsis marking the cut), its secrets cut
    first: a clip never leaves the start of a secret without the part that marks it
    (a URL's credentials before their `@`, the head of a token)."""
    if len(text) <= limit:
        return text
    text = redact_text(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- structures ----------------------------------------------------------------------

_FLAG_NAME = _Lazy(r"--?[A-Za-z][A-Za-z0-9_.-]{0,80}")


def redact_argv(argv: list[Any]) -> list[Any]:
    """A command line with the values of secret-named flags cut: `--hub_token X`,
    `--hub-token=X`, and every token shape in any argument."""
    out: list[Any] = []
    hide_next = False
    for arg in argv:
        if not isinstance(arg, str):
            out.append(arg)
            hide_next = False
            continue
        if hide_next and not arg.startswith("-") and not _keep_value(arg):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        name, eq, value = arg.partition("=")
        if _FLAG_NAME.fullmatch(name) and is_secret_name(name):
            if eq:
                out.append(name + "=" + (value if _keep_value(value) or _metavar(name, value) else REDACTED))
                continue
            hide_next = True
        out.append(redact_text(arg))
    return out


def _secret_value(value: Any) -> Any:
    """What a value under a secret name becomes: scalars cut, containers walked with
    every scalar cut."""
    if isinstance(value, dict):
        return {k: _secret_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_secret_value(v) for v in value]
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and _keep_value(value):
        return value
    return REDACTED


def redact_obj(obj: Any, *, by_name: bool = True) -> Any:
    """A copy of a JSON-like structure with secrets cut at any depth: every string
    through `redact_text`, every value under a secret-named key cut whole (when
    `by_name`), lists of strings read as command lines (`--hub_token X`)."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if by_name and isinstance(k, str) and is_secret_name(k):
                out[k] = _secret_value(v)
            else:
                out[k] = redact_obj(v, by_name=by_name)
        return out
    if isinstance(obj, (list, tuple)):
        if obj and all(isinstance(a, str) for a in obj) and any(a.startswith("-") for a in obj):
            return redact_argv(list(obj))
        return [redact_obj(v, by_name=by_name) for v in obj]
    return obj


# environment names run words together (HUBTOKEN, MYAPIKEY): parts of words count there
_ENV_SECRET = _Lazy(r"TOKEN(?!IZER)|SECRET|PASSW|PASSPHRASE|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|"
                         r"AUTH(?!OR)|_PASS$|_PWD$|SESSION_?KEY|WEBHOOK")


def is_secret_env_name(name: str) -> bool:
    upper = name.upper()
    if upper.lower() in _NOT_SECRET:
        return False
    return is_secret_name(name) or bool(_ENV_SECRET.search(upper))


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Environment variables: a secret-named one keeps its name and loses its value."""
    return {k: (REDACTED if is_secret_env_name(k) and v else redact_text(v)) for k, v in env.items()}


def redact_snapshot(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A snapshot with secrets cut everywhere: strings, secret-named keys at any depth
    of the accelerate/DeepSpeed config, the `env` section's secret-named variables."""
    out = redact_obj(snapshot)
    if isinstance(out.get("env"), dict):
        out["env"] = redact_env(out["env"])
    return out


# --- anonymize -----------------------------------------------------------------------

# user names too common as words to replace outside paths (the home dir still goes)
_COMMON_NAMES = frozenset({"root", "user", "admin", "ubuntu", "runner", "jovyan", "localhost", "docker",
                           "test", "users", "home", "data", "vm"})


def _default_user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except Exception:  # no passwd entry (containers): nothing to hide by name
        return ""


def _default_host() -> str:
    try:
        import socket

        return socket.gethostname()
    except Exception:
        return ""


_OTHER_HOMES = _Lazy(r"(?P<pre>(?<![A-Za-z0-9_.-])(?:/home/|/Users/|/export/home/|[A-Za-z]:\\Users\\|[A-Za-z]:/Users/))"
                          r"(?!<user>)[^/\\\s\"'<>:]{1,64}(?=[/\\\s\"'<>:]|$)")


def anonymizer(home: str | None = None, user: str | None = None,
               host: str | None = None) -> Callable[[str], str]:
    """A function hiding the home directory (`~`), the user name (`<user>`) and the host
    name (`<host>`) in a string."""
    home = home if home is not None else os.path.expanduser("~")
    user = user if user is not None else _default_user()
    host = host if host is not None else _default_host()
    home = (home or "").rstrip("/\\")
    pairs: list[tuple[re.Pattern, str]] = []
    names = []
    if host and host.lower() not in _COMMON_NAMES and len(host) >= 3:
        names.append((host, HOST))
        short = host.split(".")[0]
        if short != host and len(short) >= 3 and short.lower() not in _COMMON_NAMES:
            names.append((short, HOST))
    if user and len(user) >= 2 and user.lower() not in _COMMON_NAMES:
        names.append((user, USER))
    for name, marker in names:
        pairs.append((re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])"), marker))
    # the home dir only as a whole path component (/home/ana, not /home/anastasia)
    home_rx = re.compile(re.escape(home) + r"(?![A-Za-z0-9_.-])") if home and len(home) > 1 else None
    user_dir = (re.compile(r"(?<=[/\\])" + re.escape(user) + r"(?=[/\\]|$)")
                if user and len(user) >= 2 else None)

    def anonymize(text: str) -> str:
        if not isinstance(text, str) or not text:
            return text
        if home_rx is not None:
            text = home_rx.sub("~", text)
        # any other user's home, as a snapshot from another machine carries it
        text = _OTHER_HOMES.sub(lambda m: m.group("pre") + USER, text)
        if user_dir is not None:  # /home/root/..., C:\Users\ana\...
            text = user_dir.sub(USER, text)
        for rx, marker in pairs:
            text = rx.sub(marker, text)
        return text

    return anonymize


def _walk(obj: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _walk(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_walk(v, fn) for v in obj]
    return obj


def anonymize_obj(obj: Any, fn: Callable[[str], str] | None = None) -> Any:
    return _walk(obj, fn or anonymizer())


def anonymize_snapshot(snapshot: dict[str, Any], home: str | None = None, user: str | None = None,
                       host: str | None = None) -> dict[str, Any]:
    out = _walk(snapshot, anonymizer(home, user, host))
    out["anonymized"] = True
    return out


# --- control characters ----------------------------------------------------------------

# What a terminal obeys rather than shows: C0 controls but tab and newline (ESC starts
# OSC 52 clipboard writes and `\x1b[2J`), DEL, C1 controls (`\x9b` is a CSI), and the
# bidirectional overrides that make text read differently from what it is.
_CONTROL = _Lazy("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _printable(text: str) -> bool:
    """No character a terminal would obey (tab and newline aside), without a pattern:
    str.isprintable is false for every control and format character."""
    return text.isprintable() or text.replace("\n", "").replace("\t", "").isprintable()


def _visible(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def inert(text: str) -> str:
    """`text` with every control character shown as a visible escape (`\\x1b`, `\\x07`,
    `\\u202e`) instead of obeyed: what a rule file or a log says reaches a terminal as
    text, never as a clipboard write or a cleared screen. Tab and newline stay; a CRLF
    line end becomes a newline."""
    if not isinstance(text, str) or _printable(text):
        return text
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    return _CONTROL.sub(_visible, text)


_ESCAPE_SEQUENCE = _Lazy(r"\x1b\[[0-9;:]*m|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def inert_but_colour(text: str) -> str:
    """As `inert`, but a colour sequence (SGR, `\\x1b[1;31m`) stays: for what rich itself
    writes to a terminal, whose content was made inert before it styled it."""
    if _printable(text) or not _CONTROL.search(text):
        return text
    return _ESCAPE_SEQUENCE.sub(lambda m: m.group() if len(m.group()) > 1 else _visible(m), text)


def _walk_keys(obj: Any, fn: Callable[[str], str]) -> Any:
    """As _walk, the keys of dicts too (a user rule's table keys)."""
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, dict):
        return {(fn(k) if isinstance(k, str) else k): _walk_keys(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_walk_keys(v, fn) for v in obj]
    return obj


class Scrubber:
    """What every output goes through, as its last step: secrets always, home/user/host
    with anonymize, control characters made visible (`inert`)."""

    def __init__(self, anonymize: bool = False):
        self.anonymize = anonymize
        self._anon = anonymizer() if anonymize else None

    def text(self, text: str, *, controls: bool = True) -> str:
        """`controls=False`: for a stream rich styles (its colour sequences stay; any
        other control character is still shown, not obeyed)."""
        if not isinstance(text, str):
            return text
        text = redact_text(text)
        if self._anon is not None:
            text = self._anon(text)
        return inert(text) if controls else inert_but_colour(text)

    def obj(self, obj: Any, *, by_name: bool = True) -> Any:
        out = redact_obj(obj, by_name=by_name)
        if self._anon is not None:
            out = _walk(out, self._anon)
        return _walk_keys(out, inert)


def redact_record(obj: Any) -> Any:
    """A document mpdoctor writes on the side (MPDOCTOR_SAVE_EVENTS, MPDOCTOR_SAVE_PROBE)
    with its secrets cut as a snapshot's are: every string, secret-named keys at any
    depth, and each environment section (`env`, `environ`) by variable name."""
    out = redact_obj(obj)

    def envs(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (redact_env(v) if k in ("env", "environ", "environment") and isinstance(v, dict)
                        and all(isinstance(x, str) for x in v.values()) else envs(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [envs(v) for v in node]
        return node

    return envs(out)


def scrub(text: str, anonymize: bool = False) -> str:
    return Scrubber(anonymize).text(text)


def markdown_safe(text: str) -> str:
    """`<redacted>`, `<user>`, `<host>` stay visible in rendered markdown (GitHub drops
    unknown HTML tags): escaped outside code fences and code spans."""
    if "<" not in text:
        return text
    out = []
    fence = False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fence = not fence
            out.append(line)
            continue
        if fence or not any(m in line for m in MARKERS):
            out.append(line)
            continue
        parts = line.split("`")
        for i in range(0, len(parts), 2):  # even parts are outside code spans
            for m in MARKERS:
                parts[i] = parts[i].replace(m, "\\" + m[:-1] + "\\>")
        out.append("`".join(parts))
    return "\n".join(out)
