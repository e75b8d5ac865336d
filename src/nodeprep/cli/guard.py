"""What every entry point of the cli shares: `guarded` (a NodeprepError as one line on stderr
with its exit code, Ctrl-C as 130), JSON output, and --png's precondition (matplotlib)."""

from __future__ import annotations

import functools
import json
import sys

from nodeprep.errors import InputError, NodeprepError


def guarded(fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw) -> int:
        try:
            return fn(*a, **kw) or 0
        except NodeprepError as e:
            print(f"error: {e}", file=sys.stderr)
            return e.exit_code
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return wrapper


def print_json(data) -> None:
    print(json.dumps(data, indent=2, default=str))


def need_matplotlib(png: str | None) -> None:
    """--png: matplotlib is here, said before any node is touched."""
    import importlib.util

    if png and importlib.util.find_spec("matplotlib") is None:
        raise InputError(
            "--png needs matplotlib, which is not installed here",
            hint=".venv/bin/pip install matplotlib (or leave out --png)",
        )
