"""Cleaning one physical line: ANSI codes, carriage-return overwrites, control characters,
full-width punctuation, and the prefixes stacked before the text (ranks, timestamps, hosts,
log levels)."""

from __future__ import annotations

import re
import unicodedata

from .lines import _HEAD, LazyRe

_ANSI = LazyRe(
    r"(?:\x1b|\^\[)\[[0-9;:?<>=!]{0,64}[ -/]{0,8}[@-~]"  # CSI (colours, cursor moves); ^[ = cat -v
    r"|\x1b\][^\x07\x1b]{0,2048}(?:\x07|\x1b\\)"  # OSC (titles, hyperlinks)
    r"|\x1b[@-Z\\-_]"  # two-byte escapes
    r"|\[(?:[0-9]{1,3};){0,6}[0-9]{1,3}m"  # ESC lost in a copy-paste: "[0;31m", "[38;5;241m"
)


_CONTROL = LazyRe(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


# Full-width and CJK punctuation from localised terminals and machine-translated pages.
# NFKC maps most full-width forms to ASCII but glues them to the next word
# ("RuntimeError：CUDA" -> "RuntimeError:CUDA"); these keep the space that the English
# message has, so that rules see the library's own wording.
_WIDE_PUNCT = LazyRe(r"([（【「『])|([：；，。、！？）】」』])[ \t\u3000]{0,8}")


_WIDE_MAP = {
    "：": ": ", "；": "; ", "，": ", ", "。": ". ", "、": ", ", "！": "! ", "？": "? ",
    "（": " (", "）": ") ", "【": " [", "】": "] ", "「": ' "', "」": '" ', "『": ' "', "』": '" ',
}


_QUOTE_PAIRS = (("“", '"'), ("”", '"'), ("‘", "'"), ("’", "'"), ("\u3000", " "), ("\u00a0", " "))


_TRAILING_PUNCT_SPACE = LazyRe(r"(?<=[:;,.!?)\]\"]) (?=[\"')\],.]|$)")


# Prefixes stacked before the real text. Each is tried repeatedly at the line start.
_RANK_PREFIXES = (
    ("[", LazyRe(r"\[(?:rank|default|Rank)(?P<rank>\d{1,5})\]:?\s?")),  # [rank0]: / [default3]:
    ("[", LazyRe(r"\[\d{1,5},(?P<rank>\d{1,5})\]<std(?:out|err)>:\s?")),  # mpirun --tag-output
    ("(", LazyRe(r"\((?:\w{1,40} )?rank=(?P<rank>\d{1,5})[^)]{0,80}\)\s?")),  # (VllmWorker rank=1 pid=12)
    (("rank", "Rank", "RANK"), LazyRe(r"(?:rank|Rank|RANK)\s?(?P<rank>\d{1,5})\s?[:|]\s?(?=\S)")),  # rank 1: / Rank0 |
    ("0123456789", LazyRe(r"(?P<rank>\d{1,3}): ")),  # torchrun --tee / srun -l "0: "
)


_LEVEL = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL|TRACE|SUCCESS)"
# What a prefix must start with (a str: one of its characters; a tuple: one of its
# strings; a callable: a test of the head): a regex is compiled and tried only then.
_LEVELS = ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL", "FATAL", "TRACE", "SUCCESS")
_MONTHS = ("Jan ", "Feb ", "Mar ", "Apr ", "May ", "Jun ", "Jul ", "Aug ", "Sep ", "Oct ", "Nov ", "Dec ")


_OTHER_PREFIXES = (
    # ISO-ish or US timestamps, optionally bracketed, optionally followed by a logger
    # name and a level: "2024-01-01 12:00:00,123 - root - ERROR - ", "[2024-...][INFO] "
    ("[0123456789", LazyRe(
        r"\[?(?:\d{4}-\d{2}-\d{2}|\d{2}/\d{2}/\d{2,4})[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?"
        r"(?:Z|[+-]\d{2}:?\d{2}| ?[A-Z]{3})?\]?"
        r"(?:\s{0,4}[-|:]?\s{0,4}(?:[\w.]{1,60}\s{1,4}[-|:]\s{1,4})?\[?" + _LEVEL + r"\]?)?"
        r"(?:\s{0,8}[-|:]\s?(?:[\w.]{1,60}\s[-|:]\s|[\w.<>]{1,120}:[\w.<>]{1,120}:\d{1,7}\s-\s)?|\s{1,8}|$)"
    )),
    # journald / syslog: "Oct 04 15:02:41 host unit[123]: "
    (_MONTHS, LazyRe(r"[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \S{1,64} [\w.@/-]{1,64}(?:\[\d{1,10}\])?: ?")),
    # glog (torch's C++ and torchrun): "W1004 15:02:41.123456 12345 file.cpp:12] "
    ("IWEF", LazyRe(r"[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d{1,9}\s{1,8}\d{1,10} [\w./-]{1,200}:\d{1,7}\](?: |$)")),
    # vLLM: "ERROR 10-14 12:32:47 multiproc_worker_utils.py:233] ", "INFO 03-02 19:49:43 [x.py:242] "
    (_LEVELS, LazyRe(r"" + _LEVEL + r" \d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{1,6})? \[?[\w./-]{1,200}:\d{1,7}\](?: |$)")),
    # bare clock time "[12:00:01] " or "12:00:01 " (rich's log time column too)
    ("[0123456789", LazyRe(r"\[?\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9}|-\d{6})?\]?(?:\s|$)")),
    # python logging "ERROR:root:" / "WARNING:torch.distributed.run:"
    (_LEVELS, LazyRe(r"" + _LEVEL + r":[\w.<>-]{1,120}:")),
    # loguru "2024-.. | ERROR    | mod:fn:12 - " once the time is gone: "| ERROR    | mod:fn:12 - "
    (("|",) + _LEVELS + tuple(" " + lv for lv in _LEVELS),
     LazyRe(r"\|?\s?" + _LEVEL + r"\s{1,8}\|\s?(?:[\w.<>]{1,120}:[\w.<>]{1,120}:\d{1,7}\s-\s)?")),
    # bracketed level "[ERROR] " / "[INFO|trainer.py:123] " / deepspeed "[real_accelerator.py:219:get_accelerator] "
    (tuple("[" + lv for lv in _LEVELS), LazyRe(r"\[" + _LEVEL + r"(?:\|[^\]]{0,200})?\]\s?")),
    ("[", LazyRe(r"\[[\w.-]{1,120}\.py:\d{1,7}(?::[\w<>.]{1,120})?\]\s?")),
    # rich logging's level column: "ERROR    message" (level padded to 8)
    (_LEVELS, LazyRe(r"" + _LEVEL + r"\s{2,8}(?=\S)")),
    # Ray / vLLM process tags "(pid=123) ", "(WorkerDict pid=1, ip=10.0.0.1) "
    ("(", LazyRe(r"\((?:\w{1,40} )?pid=\d{1,10}[^)]{0,80}\)\s?")),
    # docker compose "trainer_1  | ", "trainer-1 | "
    (lambda head: "| " in head[:110], LazyRe(r"[\w.-]{1,64}(?:[-_]\d{1,4})?\s{1,32}\| ")),
    # workflow runners "[run/step/task (pid 12)] [0f1e...] "
    ("[", LazyRe(r"\[[\w./-]{1,200} \(pid \d{1,10}\)\]\s?(?:\[[0-9a-f-]{8,64}\]\s?)?")),
    # accelerate's test harness / CI runners: "stderr: ", "stdout: "
    (("stderr:", "stdout:"), LazyRe(r"std(?:err|out): ?")),
    # pdsh / clush / deepspeed multi-node host prefixes "gpu017: ", "worker-1: "
    ("abcdefghijklmnopqrstuvwxyz", LazyRe(r"[a-z][\w-]{0,40}\d{1,5}: ")),
)


# A rich logging handler's time and level columns ("17:05:31-835745 ERROR    "): it wraps
# a long message onto lines indented to the message column, which are joined back.
_RICH_HANDLER = LazyRe(r"\[?\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9}|-\d{6})?\]? " + _LEVEL + r" {1,8}(?=\S)")


# Prefixes that carry a process identity: interleaved lines are split by it.
_STREAM = LazyRe(r"pid[= ](\d{1,10})|^([a-z][\w-]{0,40}\d{1,5}): |^([\w.-]{1,64})\s{1,32}\| ")


_PROGRESS = LazyRe(r"\d%\||it/s\]|s/it\]|[█▉▊▋▌▍▎▏]|\d{1,12}/\d{1,12} \[\d")


# mpirun --tag-output's tag written mid-line when two writes of one rank interleave
# ("RuntimeError[1,1]<stderr>:: Unconvertible ..."): the tag is the launcher's, never text.
_MIDLINE_TAG = LazyRe(r"(?<=\S)\[\d{1,5},\d{1,5}\]<std(?:out|err)>:")


# A line glued after a tqdm bar that ended without a newline ("...2.88s/it][rank5]:[E602 ...",
# "...it/s]Traceback"): the bar's closing bracket ends the bar, the rest is a new line.
_AFTER_BAR = LazyRe(r"(?:it/s|s/it)\](?=\S)")


def split_after_progress(line: str) -> list[str]:
    """A physical line holding a progress bar and a line glued right after its end: two lines."""
    a, b = line.find("it/s]"), line.find("s/it]")
    at = a if b == -1 else b if a == -1 else min(a, b)
    if at == -1 or not line[at + 5:at + 6].strip():  # no bar end, or one that ends the line (the usual case)
        return [line]
    out: list[str] = []
    at = 0
    for m in _AFTER_BAR.finditer(line[:_HEAD * 4]):
        out.append(line[at:m.end()])
        at = m.end()
    out.append(line[at:])
    return out


def split_overwrites(line: str) -> list[str]:
    """A `\\r` rewrites the line (tqdm): the progress bars it overwrote are dropped,
    but text printed between two bars (an error, a warning) is kept."""
    if "\r" not in line:
        return [line]
    parts = [p for p in line.split("\r") if p.strip()]
    if not parts:
        return [""]
    kept = [p for p in parts[:-1] if not _PROGRESS.search(p[:_HEAD])]
    return kept + [parts[-1]]


def _wide_punct(m: re.Match[str]) -> str:
    if m.group(1):  # an opening bracket: one space before it, whatever was there
        i = m.start()
        return _WIDE_MAP[m.group(1)].lstrip() if i == 0 or m.string[i - 1] in " \t\u3000" else _WIDE_MAP[m.group(1)]
    return _WIDE_MAP[m.group(2)]


# What a paste gained or lost on its way through a web page or a chat window, undone:
# URL-encoding (%20), markdown emphasis and code marks around words, a colon retyped
# without its space ("CUDA error:out of memory").
_PERCENT = LazyRe(r"%([0-9A-Fa-f]{2})")
_GLUED_COLON = LazyRe(r":(?:(?<=[Ee]rror:)|(?<=[Ee]xception:)|(?<=[Ww]arning:)|(?<=[Ff]ailed:)|(?<=FAILED:)|(?<=ERROR:))"
                       r"(?=[A-Za-z])")  # the colon first: skipped to at memchr speed


def fold_paste(line: str) -> str:
    """Undo what a web page did to a pasted line: URL-encoding, markdown's ** and
    backticks, a colon that lost its space. Library messages never contain these, so
    rules see the message as the library wrote it."""
    if "%" in line and len(_PERCENT.findall(line[:_HEAD])) >= 2:
        decoded = _PERCENT.sub(lambda m: chr(int(m.group(1), 16)), line)
        if decoded.isprintable():
            line = decoded
    if "**" in line:
        line = line.replace("**", "")
    if "`" in line:
        line = line.replace("`", "")
    if ":" in line:
        line = _GLUED_COLON.sub(": ", line)
    return line


def clean_physical_line(line: str) -> str:
    """ANSI codes and control characters out; punctuation made ASCII; right padding off;
    what a web page did to a paste undone (fold_paste)."""
    if "\x1b" in line or "[" in line:
        line = _ANSI.sub("", line)
    line = _CONTROL.sub("", line)
    if not line.isascii():
        line = _WIDE_PUNCT.sub(_wide_punct, line)
        for fancy, plain in _QUOTE_PAIRS:  # str.replace: translate() is slow on long lines
            if fancy in line:
                line = line.replace(fancy, plain)
        line = unicodedata.normalize("NFKC", line).replace("\ufffd", "?")
        line = _TRAILING_PUNCT_SPACE.sub("", line)
    if "]<std" in line:
        line = _MIDLINE_TAG.sub("", line)
    return fold_paste(line).rstrip()


def strip_prefixes(line: str) -> tuple[str, int | None]:
    """Remove stacked rank / timestamp / host prefixes; return (text, rank)."""
    text, rank, _stream = _strip_prefixes(line)
    return text, rank


def _may_start(starts, head: str, first: str) -> bool:
    if type(starts) is str:
        return first in starts
    if type(starts) is tuple:
        return head.startswith(starts)
    return starts is None or starts(head)


def _by_first(prefixes: tuple) -> tuple[dict[str, tuple], tuple]:
    """The prefixes a line may start with, by its first character, in their order (a
    line is tried against two or three, not twenty): ({char: prefixes}, the prefixes for
    any other first character: those that test the head as a whole)."""
    def chars(starts) -> set[str] | None:
        if type(starts) is str:
            return set(starts)
        if type(starts) is tuple:
            return {s[:1] for s in starts}
        return None  # a test of the whole head: any first character

    keys = set().union(*(chars(st) or set() for st, _rx in prefixes))
    table = {c: tuple(p for p in prefixes if chars(p[0]) is None or c in chars(p[0])) for c in keys}
    return table, tuple(p for p in prefixes if chars(p[0]) is None)


_RANK_BY_FIRST = _by_first(_RANK_PREFIXES)
_OTHER_BY_FIRST = _by_first(_OTHER_PREFIXES)


def _strip_prefixes(line: str) -> tuple[str, int | None, str | None]:
    rank: int | None = None
    stream: str | None = None
    for _ in range(8):
        head = line[:_HEAD]
        first = head[:1]
        if not first:
            return line, rank, stream
        table, rest = _RANK_BY_FIRST
        for starts, rx in table.get(first, rest):
            if type(starts) is not str and not _may_start(starts, head, first):
                continue
            m = rx.match(head)
            if m:
                # stacked rank prefixes ("[default1]:[rank3]:", "[1,0]<stderr>:[rank3]:"): the
                # launcher's local index comes first, the process's own rank last; the inner wins
                rank = int(m.group("rank"))
                line = line[m.end():]
                break
        else:
            table, rest = _OTHER_BY_FIRST
            for starts, rx in table.get(first, rest):
                if type(starts) is not str and not _may_start(starts, head, first):
                    continue
                m = rx.match(head)
                if m and m.end() > 0:
                    if stream is None:
                        s = _STREAM.search(head[:m.end()])
                        if s:
                            stream = next(g for g in s.groups() if g)
                    line = line[m.end():]
                    break
            else:
                return line, rank, stream
    return line, rank, stream
