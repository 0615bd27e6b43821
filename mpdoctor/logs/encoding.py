"""Is it text, and in which encoding? A log's first bytes decide (`sniff_encoding`)."""

from __future__ import annotations

from ..logtext import LazyRe

# C0 control bytes a text log does not hold (tab, line breaks, form feed and ESC it may)
_CONTROLS = bytes(c for c in range(32) if c not in (9, 10, 11, 12, 13, 27)) + b"\x7f"
_NUL_RUN = LazyRe(rb"\x00{8,}")


def sniff_encoding(sample: bytes) -> str | None:
    """The encoding of a log from its first bytes, or None when it is not text.

    Text as people have it: a byte-order mark (UTF-8/16/32); UTF-16 or UTF-32 without
    one, by where its NUL bytes fall (PowerShell's `>` writes UTF-16); NUL padding a
    crash left (skipped); UTF-8, else the legacy encoding that decodes cleanly
    (GB18030/GBK, Shift-JIS, cp1252). Binary is what has control bytes a log does not
    (an ELF, a PNG, random bytes) or decodes as nothing."""
    if sample.startswith(b"\xef\xbb\xbf"):
        return "utf-8-sig"
    if sample.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "utf-32"
    if sample.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    body = sample.rstrip(b"\x00")
    n = len(body) - len(body) % 4
    if n >= 8:
        q = n // 4
        z = [body[i:n:4].count(0) for i in range(4)]
        if z[2] >= 0.95 * q and z[3] >= 0.95 * q and z[0] < 0.05 * q:
            return "utf-32-le"
        if z[0] >= 0.95 * q and z[1] >= 0.95 * q and z[3] < 0.05 * q:
            return "utf-32-be"
        h = n // 2
        even, odd = z[0] + z[2], z[1] + z[3]
        if odd >= 0.3 * h and even < 0.02 * h:
            return "utf-16-le"
        if even >= 0.3 * h and odd < 0.02 * h:
            return "utf-16-be"
    body = _NUL_RUN.sub(b"", body)  # padding in the middle: a crash, then more log
    if not body:
        return None if sample else "utf-8"
    controls = len(body) - len(body.translate(None, _CONTROLS))
    if controls > len(body) * 0.05:  # random bytes have ~10%, a terminal capture a few BELs
        return None
    import codecs

    def clean(enc: str) -> str | None:
        try:  # a character cut at the sample's end is not an error
            return codecs.getincrementaldecoder(enc)("strict").decode(body, final=False)
        except (UnicodeDecodeError, LookupError):
            return None

    text = clean("utf-8")
    if text is not None:
        return None if text.count("\ufffd") > len(text) * 0.15 else "utf-8"
    sjis = clean("shift_jis")
    if sjis is not None:
        wide = sum(1 for ch in sjis if ord(ch) > 127)
        if wide and sum(1 for ch in sjis if "\u3040" <= ch <= "\u30ff") > wide * 0.05:
            return "shift_jis"
    if clean("gb18030") is not None:
        return "gb18030"
    if sjis is not None:
        return "shift_jis"
    if clean("cp1252") is not None:
        return "cp1252"
    text = body.decode("utf-8", errors="replace")
    return None if text.count("\ufffd") > len(text) * 0.15 else "utf-8"


def looks_binary(sample: bytes) -> bool:
    return sniff_encoding(sample) is None

