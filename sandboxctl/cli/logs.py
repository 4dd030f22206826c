"""Log lines a client cannot forge: every control character in a log message is escaped.

A log message carries what clients chose (request paths, ids, metadata, header values,
exception messages that quote them). A line feed in one would start a line of its own that
reads as a genuine record; an ESC would drive the operator's terminal. So every record is
made as an :class:`EscapedRecord` (``logging.setLogRecordFactory``, installed once by
``service_logging``), whose message has CR, LF, TAB, every other C0 and C1 control, DEL,
the Unicode line and paragraph separators, the bidirectional overrides and lone
surrogates written as ``\\n``, ``\\x1b``, ``\\u2028``... That covers every logger, ours,
uvicorn's and any library's, whatever handler or formatter prints it, so no call site can
forget. A traceback stays a multi-line traceback: only the exception messages in it (where
client data may be) are escaped, the frames are printed as they are.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Iterator
from types import TracebackType
from typing import Any

_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def escape(text: str, keep_newlines: bool = False) -> str:
    """``text`` with every character a log reader or a terminal would act on escaped;
    ``keep_newlines``: but LF."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_kept if keep_newlines else _escaped, text)


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def _kept(match: re.Match[str]) -> str:
    return "\n" if match.group() == "\n" else _escaped(match)


class EscapedRecord(logging.LogRecord):
    """A log record whose message, and the exception messages of its traceback, are
    escaped; the traceback is formatted when the record is made, so every formatter
    prints this text (``Formatter.format`` keeps an ``exc_text`` it finds)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.exc_info and self.exc_info[0] is not None:
            self.exc_text = format_traceback(self.exc_info)

    def getMessage(self) -> str:
        return escape(super().getMessage())


def format_traceback(exc_info: ExcInfo) -> str:
    """The traceback as ``logging`` prints it (no final newline), each exception message
    escaped into one line, whatever it quotes. (In an exception group, whose lines are
    indented, a message keeps its line feeds: every line of it is indented too.)"""
    report = traceback.TracebackException(*exc_info)
    messages = set(_exception_lines(report))
    chunks = (
        escape(chunk.removesuffix("\n")) + "\n"
        if chunk in messages
        else escape(chunk, keep_newlines=True)
        for chunk in report.format()
    )
    return "".join(chunks).removesuffix("\n")


def _exception_lines(report: traceback.TracebackException) -> Iterator[str]:
    """What ``format`` prints of each exception of the chain but its frames: the
    ``Type: message`` line and the notes."""
    seen: set[int] = set()
    pending = [report]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield from current.format_exception_only()
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        pending.extend(current.exceptions or ())


def escape_every_record() -> None:
    """Make every log record of this process an :class:`EscapedRecord`."""
    logging.setLogRecordFactory(EscapedRecord)
