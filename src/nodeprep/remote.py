"""Remote file primitives as POSIX sh snippets: quoting node paths, reading files into a fact,
and replacing a file atomically (temp file with the final mode in the same directory, then
rename), so an interrupted run never leaves a truncated authorized_keys or ssh config."""
from __future__ import annotations

import base64
import shlex

from .facts import fact

MAX_READ = 1 << 20  # managed files are small; refuse to slurp anything bigger


def rpath(path: str) -> str:
    """Quote a node path for sh; `~/x` becomes "$HOME"/'x' so the node's home is used."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def read_script(path: str) -> str:
    p = rpath(path)
    return (f"if [ -f {p} ]; then stat -c '%a %s' {p}; "
            f"[ \"$(stat -c %s {p})\" -le {MAX_READ} ] && base64 -w0 < {p}; echo; "
            f"elif [ -e {p} ]; then echo NOT_A_FILE; else echo MISSING; fi")


def parse_file(text: str, rc: int) -> dict:
    """{'exists', 'mode' (int), 'size', 'content' (str | None when too big)}."""
    lines = text.splitlines()
    if not lines or lines[0] == "MISSING":
        return {"exists": False, "mode": None, "size": 0, "content": None}
    if lines[0] == "NOT_A_FILE":
        raise ValueError("exists but is not a regular file")
    mode, size = lines[0].split()
    blob = lines[1] if len(lines) > 1 else ""
    content = base64.b64decode(blob).decode("utf-8", "surrogateescape") if int(size) <= MAX_READ else None
    return {"exists": True, "mode": int(mode, 8), "size": int(size), "content": content}


fact("file", lambda path: read_script(path))(parse_file)


@fact("dir", lambda path: f"[ -d {rpath(path)} ] && ls -1A -- {rpath(path)} || echo @@MISSING@@")
def parse_dir(text: str, rc: int) -> list[str] | None:
    """Entries of a directory (None when it does not exist)."""
    lines = text.splitlines()
    return None if lines == ["@@MISSING@@"] else lines


def write_script(path: str, content: str, mode: int) -> str:
    """Replace PATH with CONTENT atomically, creating its directory (0700) if needed."""
    p = rpath(path)
    blob = base64.b64encode(content.encode("utf-8", "surrogateescape")).decode()
    return (f"f={p}; d=$(dirname \"$f\"); [ -d \"$d\" ] || mkdir -p -m 700 \"$d\"; "
            f"t=$(mktemp \"$d/.nodeprep.XXXXXX\") && "
            f"printf %s {blob} | base64 -d > \"$t\" && chmod {mode:o} \"$t\" && "
            f"mv -f \"$t\" \"$f\" || {{ rm -f \"$t\"; exit 1; }}")
