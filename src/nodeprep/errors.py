"""Errors that reach the user as one clear line, never a traceback.

InputError (exit 2) is for bad input found before any node is touched: it names the
file and line (or the flag) and says what to do. NodeprepError (exit 1) is for a run
that could not do what was asked.
"""

from __future__ import annotations


class NodeprepError(Exception):
    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message + (f" ({self.hint})" if self.hint else "")


# line breaks and other control characters, as they are shown inside a one-line message
_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, 0x85]} | {
    0x0A: "\\n",
    0x0D: "\\r",
    0x09: "\\t",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def one_line(text: str) -> str:
    """TEXT with its control characters escaped: a value quoted in a message (a name with a
    newline in it, a NUL) cannot break the message's single line."""
    return text.translate(_ESCAPES)


class InputError(NodeprepError):
    """Bad input: the message is `FILE:LINE: what is wrong (what to do)`, always one line."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        file: str | None = None,
        line: int | None = None,
    ):
        where = ""
        if file:
            where = f"{file}:{line}: " if line else f"{file}: "
        super().__init__(one_line(where + message), hint and one_line(hint))
        self.file = file
        self.line = line
