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
    """--png: matplotlib is here and PNG names a .png file that can be written, said before
    any node is touched."""
    import importlib.util
    import os

    if not png:
        return
    if importlib.util.find_spec("matplotlib") is None:
        raise InputError(
            "--png needs matplotlib, which is not installed here",
            hint=".venv/bin/pip install matplotlib (or leave out --png)",
        )
    folder = os.path.dirname(os.path.abspath(png))
    if not png.lower().endswith(".png") or not os.path.isdir(folder):
        raise InputError(
            f"--png {png}: expected a .png file in an existing directory",
            hint="e.g. --png timeline.png",
        )
    if not os.access(folder, os.W_OK):
        raise InputError(f"--png {png}: cannot write in {folder}", hint="give another path")
