"""Secrets out, before anything is printed or saved.

Environment variables whose names say they hold a secret keep their name and lose
their value; credentials inside URLs and well-known token shapes are cut out of every
string in the snapshot (an error message can quote a URL with a token in it).
`anonymize` also replaces the home directory and the user name in paths.
"""

from __future__ import annotations

import getpass
import os
import re
from typing import Any, Callable

REDACTED = "<redacted>"

_SECRET_NAME = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
_SECRET_PREFIX = ("AWS_", "AZURE_", "GOOGLE_APPLICATION_CREDENTIALS")
# Names that match the words above but hold no secret.
_NOT_SECRET = {"PYTORCH_KERNEL_CACHE_PATH", "TORCH_KEY_PATH_UNUSED", "KEYBOARD", "XAUTHORITY"}

_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<cred>[^/@\s:]+(?::[^/@\s]*)?)@")
_QUERY_SECRET = re.compile(r"(?P<key>[?&](?:token|access_token|api_key|apikey|key|sig|signature|password|secret)=)[^&\s\"']+",
                           re.IGNORECASE)
_TOKEN_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|"
    r"AKIA[0-9A-Z]{16}|ASIA[0-9A-Z]{16}|sk-[A-Za-z0-9_-]{20,}|xox[abpr]-[A-Za-z0-9-]{10,})\b"
)


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    if upper in _NOT_SECRET:
        return False
    return upper.startswith(_SECRET_PREFIX) or bool(_SECRET_NAME.search(upper))


def redact_text(text: str) -> str:
    text = _URL_CREDENTIALS.sub(lambda m: m.group("scheme") + REDACTED + "@", text)
    text = _QUERY_SECRET.sub(lambda m: m.group("key") + REDACTED, text)
    return _TOKEN_SHAPES.sub(REDACTED, text)


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) and v else redact_text(v)) for k, v in env.items()}


def _walk(obj: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _walk(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v, fn) for v in obj]
    return obj


def redact_snapshot(snapshot: dict[str, Any]) -> dict[str, Any]:
    """Every string in the snapshot, with URL credentials and token shapes removed;
    the `env` section's secret-named variables blanked."""
    out = _walk(snapshot, redact_text)
    if isinstance(out.get("env"), dict):
        out["env"] = redact_env(out["env"])
    return out


def anonymizer(home: str | None = None, user: str | None = None) -> Callable[[str], str]:
    home = home if home is not None else os.path.expanduser("~")
    try:
        user = user if user is not None else getpass.getuser()
    except Exception:  # no passwd entry (containers): nothing to hide by name
        user = user or ""
    home = home.rstrip("/\\")
    user_rx = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(user)}(?![A-Za-z0-9_])") if len(user) >= 2 else None

    def anonymize(text: str) -> str:
        if home and len(home) > 1:
            text = text.replace(home, "~")
        if user_rx is not None:
            text = user_rx.sub("<user>", text)
        return text

    return anonymize


def anonymize_snapshot(snapshot: dict[str, Any], home: str | None = None, user: str | None = None) -> dict[str, Any]:
    out = _walk(snapshot, anonymizer(home, user))
    out["anonymized"] = True
    return out
