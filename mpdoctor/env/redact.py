"""Kept for the collector's imports: redaction lives in one module, mpdoctor/redact.py,
which every face's output goes through."""

from __future__ import annotations

from ..redact import (  # noqa: F401
    REDACTED,
    anonymize_snapshot,
    anonymizer,
    is_secret_name,
    redact_env,
    redact_obj,
    redact_snapshot,
    redact_text,
)
