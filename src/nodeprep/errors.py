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


class InputError(NodeprepError):
    """Bad input: the message is `FILE:LINE: what is wrong (what to do)`."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, file: str | None = None,
                 line: int | None = None):
        where = ""
        if file:
            where = f"{file}:{line}: " if line else f"{file}: "
        super().__init__(where + message, hint)
        self.file = file
        self.line = line
