"""Files and directories on the node: FILE(path) reads one (all FILE requests of a probe share
one section: 3 execs for any number of files), DIR(path) lists one. Contents may hold secrets,
so FILE is private: its output is never quoted in an error."""

from __future__ import annotations

import base64
import posixpath

from nodeprep.engine.facts.probe import Fact
from nodeprep.engine.remote import STAT_FORMAT, rpath

MAX_READ = 1 << 20  # managed files are small; refuse to slurp anything bigger


def read_many_script(paths: list[str]) -> str:
    """Every file of one probe in 3 execs, not 5 per file: sh builtins sort the paths into
    regular file / something else / missing, ONE `stat` gives modes and sizes, and ONE
    `cat | base64` carries the contents of those not over MAX_READ, in order; the reader
    splits them by the sizes (and refuses if a file changed size in between)."""
    words = " ".join(rpath(p) for p in paths)
    return (
        "set --\n"
        "k=\n"
        f"for f in {words}; do\n"
        '  if [ -f "$f" ] && [ -r "$f" ]; then set -- "$@" "$f"; k="${k}F"\n'
        '  elif [ -f "$f" ]; then k="${k}U"\n'
        '  elif [ -e "$f" ]; then k="${k}O"\n'
        '  else k="${k}M"; fi\n'
        "done\n"
        "printf '%s\\n' \"$k\"\n"
        "[ $# -gt 0 ] || exit 0\n"
        "m=$(stat -L -c '%a:%s' -- \"$@\") || exit 1\n"
        "printf '%s\\n' \"$m\"\n"
        # keep the small ones: each pass shifts one file off and appends it back if kept
        f'for x in $m; do f=$1; shift; [ "${{x#*:}}" -le {MAX_READ} ] && set -- "$@" "$f"; done\n'
        "echo @@DATA@@\n"
        '[ $# -eq 0 ] || cat -- "$@" 2>/dev/null | base64 -w0\n'
        "echo"
    )


def split_files(text: str, rc: int, paths: list[str]) -> list[dict]:
    lines = text.splitlines()
    kinds = lines[0].strip() if lines else ""
    if len(kinds) != len(paths) or rc != 0:
        raise ValueError(f"unexpected answer (exit {rc})")
    for p, k in zip(paths, kinds):
        if k == "O":
            raise ValueError(f"{p} exists but is not a regular file")
        if k == "U":
            raise ValueError(f"{p} is not readable by this user")
    n = kinds.count("F")
    stats = [ln.split(":") for ln in lines[1 : 1 + n]]
    if n and (len(lines) < n + 2 or lines[1 + n] != "@@DATA@@"):
        raise ValueError("unexpected answer")
    data = base64.b64decode(lines[n + 2] if len(lines) > n + 2 else "") if n else b""
    out = []
    it = iter(stats)
    pos = 0
    for p, k in zip(paths, kinds):
        if k == "M":
            out.append({"exists": False, "mode": None, "size": 0, "content": None})
            continue
        mode, size = next(it)
        size = int(size)
        content = None
        if size <= MAX_READ:
            chunk, pos = data[pos : pos + size], pos + size
            content = chunk.decode("utf-8", "surrogateescape")
        out.append({"exists": True, "mode": int(mode, 8), "size": size, "content": content})
    if pos != len(data) or any(
        len(c["content"].encode("utf-8", "surrogateescape")) != c["size"]
        for c in out
        if c["content"] is not None
    ):
        # (only the total is checked: one file shrinking while another grows by as much
        # between `stat` and `cat` would go unseen)
        raise ValueError("a file changed size while it was read; run again")
    return out


def parse_file(text: str, rc: int) -> dict:
    """{'exists', 'mode' (int), 'size', 'content' (str | None when over MAX_READ)}; the
    reader of read_many_script's answer for one path."""
    return split_files(text, rc, ["it"])[0]


def parse_dir(text: str, rc: int) -> list[str] | None:
    """Entries of a directory, sorted (None when it does not exist)."""
    lines = text.splitlines()
    return None if lines == ["@@MISSING@@"] else sorted(lines)


def dir_script(path: str) -> str:
    """sh listing PATH's entries, dot files included, a name a line; sh's own globs rather
    than an `ls` (one exec less in every probe that reads a directory)."""
    p = rpath(path)
    return (
        f"if [ -d {p} ]; then\n"
        f"  for np_f in {p}/* {p}/.[!.]* {p}/..?*; do\n"
        '    { [ -e "$np_f" ] || [ -L "$np_f" ]; } && printf \'%s\\n\' "${np_f##*/}"\n'
        "  done\n"
        "else echo @@MISSING@@; fi\n"
        "true"
    )


# ELF e_machine values (the System V gABI's list) nodeprep meets on cluster nodes.
ELF_MACHINES = {0x3E: "x86_64", 0xB7: "aarch64", 0x15: "ppc64le", 0x03: "i386", 0x28: "arm"}


def elf_script(path: str) -> str:
    """For each lib*.so* in directory PATH (links followed): its name and the first 20 bytes
    in hex (the ELF identification and e_machine); nothing when PATH does not exist."""
    p = rpath(path)
    return (
        f"for np_f in {p}/lib*.so*; do\n"
        '  [ -f "$np_f" ] || continue\n'
        "  printf '%s ' \"${np_f##*/}\"\n"
        "  od -An -tx1 -N20 -- \"$np_f\" | tr -d '\\n'\n"
        "  echo\n"
        "done\n"
        "true"
    )


def parse_elf(text: str, rc: int) -> dict[str, str | None]:
    """{library name: its CPU architecture ("x86_64", "aarch64", ...), "not ELF", or
    "machine 0xNN" for one not in ELF_MACHINES}."""
    out: dict[str, str | None] = {}
    for line in text.splitlines():
        name, _, hexes = line.strip().partition(" ")
        if not name:
            continue
        try:
            b = bytes(int(x, 16) for x in hexes.split())
        except ValueError:
            b = b""
        if len(b) < 20 or b[:4] != b"\x7fELF":
            out[name] = "not ELF"
            continue
        machine = int.from_bytes(b[18:20], "little" if b[5] == 1 else "big")
        out[name] = ELF_MACHINES.get(machine, f"machine 0x{machine:x}")
    return out


FILE = Fact(
    "file",
    lambda path: read_many_script([path]),
    parse_file,
    batch=read_many_script,
    split=split_files,
    private=True,
)
DIR = Fact("dir", dir_script, parse_dir)
ELF_ARCH = Fact("elf_arch", elf_script, parse_elf)


def stamp_script(path: str) -> str:
    """The stamp at PATH (line 1: what was verified; then one STAT_FORMAT line per file, names
    relative to the stamp's directory) against the files as they are now: ONE `stat` of every
    name it lists, compared in sh; the lines travel only when something differs."""
    p, d = rpath(path), rpath(posixpath.dirname(path) or ".")
    return (
        f"[ -f {p} ] || {{ echo @@MISSING@@; exit 0; }}\n"
        f"cd {d} || exit 1\n"
        "h=\n"
        "r=\n"
        "set --\n"
        "{ IFS= read -r h\n"
        '  while IFS= read -r l || [ -n "$l" ]; do\n'
        '    r="$r$l\n"\n'  # a newline inside the quotes: the lines as read
        '    set -- "$@" "${l#* * * }"\n'
        f"  done; }} < {p}\n"
        "printf '@@HEAD@@ %s\\n' \"$h\"\n"
        "c=\n"
        "[ $# -gt 0 ] && c=$(stat -c '" + STAT_FORMAT + '\' -- "$@" 2>/dev/null)\n'
        'if [ "$c" = "${r%?}" ]; then echo @@SAME@@\n'
        "else\n"
        "  echo @@DIFF@@\n"
        "  printf '%s' \"$r\" | while IFS= read -r l; do printf 'R %s\\n' \"$l\"; done\n"
        "  printf '%s\\n' \"$c\" | while IFS= read -r l; do\n"
        '    [ -n "$l" ] && printf \'C %s\\n\' "$l"\n'
        "  done\n"
        "fi\n"
        "true"
    )


def parse_stamp(text: str, rc: int) -> dict:
    """{'exists', 'head' (line 1 as written), 'same' (every listed file as stamped),
    'changed' (names that differ or are gone, sorted)}."""
    lines = text.splitlines()
    if not lines or lines[0] == "@@MISSING@@":
        return {"exists": False, "head": None, "same": False, "changed": []}
    if rc != 0 or not lines[0].startswith("@@HEAD@@") or len(lines) < 2:
        raise ValueError(f"unexpected answer (exit {rc})")
    head = lines[0][len("@@HEAD@@ ") :]
    if lines[1] == "@@SAME@@":
        return {"exists": True, "head": head, "same": True, "changed": []}
    if lines[1] != "@@DIFF@@":
        raise ValueError("unexpected answer")

    def by_name(tag):
        return {
            ln[2:].split(" ", 3)[3]: ln[2:]
            for ln in lines[2:]
            if ln.startswith(tag) and len(ln[2:].split(" ", 3)) == 4
        }

    recorded, current = by_name("R "), by_name("C ")
    changed = sorted(n for n, line in recorded.items() if current.get(n) != line)
    return {"exists": True, "head": head, "same": not changed, "changed": changed}


STAMP = Fact("stamp", stamp_script, parse_stamp)  # STAMP(path): a stamp an action wrote
