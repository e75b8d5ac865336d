"""Python stacks of hung ranks: faulthandler's dumps (rank-<R>.stack) parsed, and the rank(s)
most likely at fault named.

A dump is what one faulthandler call writes: for all threads, one block per thread, newest
thread first (the main thread last), a blank line between blocks, no line before or after;
for one thread (`dump_traceback(all_threads=False)`), a "Stack" header and its frames:

    Thread 0x00007f05b12336c0 (most recent call first):
      File "/tmp/ddp.py", line 8 in heartbeat

    Current thread 0x00007f05b1fdeb80 (most recent call first):
      File "/tmp/ddp.py", line 20 in main
      File "/tmp/ddp.py", line 24 in <module>

Dumps appended to one file follow each other with nothing in between, so a thread header
right after a frame line (no blank line), a thread seen twice, or a second current thread
starts the next dump. Inside a block, faulthandler may write `  <no Python frame>`,
`  Garbage-collecting`, `  ...` (more than 100 frames) and after the blocks `...` (more than
100 threads: the main thread, last, is then the one left out); strings over 500 characters end
in "...", unknown parts read "???". Newer Pythons put the thread's name in brackets after its
id. Any other line (log text, a line cut short by a kill) ends the dump it interrupts."""

from __future__ import annotations

import re
from dataclasses import dataclass

HEADER = re.compile(
    r"(?:(Current thread|Thread) (0x[0-9a-fA-F]{1,32})(?: \[.*?\])?|Stack)"
    r" \(most recent call first\):"
)
FRAME = re.compile(r"[ \t]*File (?:\"(.*)\"|\?\?\?), line (\d{1,18}|\?\?\?) in (.*)")
LIB_DIRS = re.compile(r"(?:^|[/\\])(?:site-packages|dist-packages|torch|deepspeed)[/\\]")
STDLIB = re.compile(r"[/\\]lib(?:64)?[/\\]python3(?:\.\d+)?t?[/\\]|^<frozen ")
PACKAGE = re.compile(
    r"(?:site-packages|dist-packages)[/\\]([^/\\]+)|(?:^|[/\\])(torch|deepspeed)[/\\]"
)
GLUE = ("wrap", "inner", "decorate", "<")  # decorator and generated frames: not what was called
NO_FRAME = "<no Python frame>"


@dataclass(frozen=True)
class Frame:
    file: str
    line: int  # 0 where faulthandler wrote "???"
    func: str

    def __str__(self) -> str:
        base = re.split(r"[/\\]", self.file)[-1] or self.file
        return f"{base}:{self.line or '?'} in {self.func}"


@dataclass
class Thread:
    ident: str  # "0x00007f..." as written; "" for a "Stack" (one thread) dump
    current: bool  # the thread that ran the signal handler (or called dump_traceback)
    frames: list[Frame]  # innermost first, as faulthandler writes them


def parse(text: str) -> list[list[Thread]]:
    """Every dump in TEXT, in order; each a list of its threads as written. Never raises:
    lines it cannot read are skipped, or end the dump they interrupt; a last line without its
    newline is taken for one cut short ("line 982 in ru" of "line 982 in run") and skipped."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    if not isinstance(text, str):
        return []
    dumps: list[list[Thread]] = []
    dump: list[Thread] | None = None
    thread: Thread | None = None
    blank = False
    lines = text.splitlines()
    if lines and not text.endswith(("\n", "\r")):
        lines.pop()  # no newline yet: a line still being written
    for line in lines:
        line = line.rstrip()
        head = HEADER.search(line)
        if head:
            if line[: head.start()].strip():  # the end of a line cut short, then a new dump
                dump = None
            thread = Thread(
                head.group(2) or "", head.group(1) == "Current thread" or not head.group(2), []
            )
            if dump is None or _starts_dump(dump, thread, blank):
                dump = []
                dumps.append(dump)
            dump.append(thread)
            blank = False
        elif not line.strip():
            blank = True
        elif _frame_line(line, thread):
            blank = False
        elif not (line[0] in " \t" or line == "..."):  # indented: a marker or a cut frame line
            dump = thread = None
    return dumps


def _starts_dump(dump: list[Thread], thread: Thread, blank: bool) -> bool:
    """Whether THREAD's header begins a new dump rather than the next block of DUMP."""
    return (
        not blank
        or not thread.ident
        or not dump[0].ident
        or any(t.ident == thread.ident for t in dump)
        or (thread.current and any(t.current for t in dump))
    )


def _frame_line(line: str, thread: Thread | None) -> bool:
    """Add LINE's frame to THREAD if it is a whole frame line (and there is a thread)."""
    m = FRAME.fullmatch(line)
    if not m or thread is None:
        return False
    num = m.group(2)
    thread.frames.append(
        Frame(
            m.group(1) if m.group(1) is not None else "???",
            int(num) if num.isdigit() else 0,
            m.group(3),
        )
    )
    return True


def main_thread(dump: list[Thread]) -> Thread | None:
    """The interpreter's main thread: the one whose outermost frame is a module's top level;
    else the current one (its outer frames may be cut off at 100); else the last (faulthandler
    writes the main thread last, and past 100 threads no thread is marked current)."""
    for t in dump:
        if t.frames and t.frames[-1].func == "<module>":
            return t
    return next((t for t in dump if t.current), dump[-1] if dump else None)


def in_library(frame: Frame) -> bool:
    """Whether FRAME runs installed code: site-/dist-packages, torch, deepspeed, the stdlib."""
    return bool(LIB_DIRS.search(frame.file) or STDLIB.search(frame.file))


def where(frames: list[Frame]) -> str:
    """The innermost frame of the user's code ("ddp.py:143 in main"), else the innermost
    frame; "" for none."""
    if not frames:
        return ""
    return str(next((f for f in frames if not in_library(f)), frames[0]))


def _position(frames: list[Frame]) -> str:
    return where(frames) or NO_FRAME


def _package(frame: Frame) -> str:
    """The library FRAME is in: the package under site-packages, torch, deepspeed, or the
    stdlib module ("threading", "concurrent.futures.thread")."""
    m = PACKAGE.search(frame.file)
    if m:
        name = m.group(1) or m.group(2)
        return name.removesuffix(".py")
    m = STDLIB.search(frame.file)
    rest = frame.file[m.end() :] if m else re.split(r"[/\\]", frame.file)[-1]
    return re.sub(r"[/\\]", ".", rest.rstrip(">").removesuffix(".py")).removesuffix(".__init__")


def waits_in(frames: list[Frame]) -> str:
    """What a rank blocked in a library waits in, "torch (backward)": the library call the
    user's code made (the outermost library frame above it that is no decorator glue or
    private helper); for a stack without user code, its innermost frame; "" when the
    innermost frame is the user's."""
    lib = []
    for f in frames:
        if not in_library(f):
            break
        lib.append(f)
    if not lib:
        return ""
    if len(lib) == len(frames):  # no user code above: no call to name
        return f"{_package(lib[0])} ({lib[0].func})"
    called = next(
        (
            f
            for f in reversed(lib)
            if not f.func.startswith("_") and not any(g in f.func for g in GLUE)
        ),
        lib[0],
    )
    return f"{_package(called)} ({called.func})"


def _ranks(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _user_vs_library(have: dict[int, list[Frame]]) -> tuple[list[int], str] | None:
    """Rule 1: ranks whose innermost frame is the user's own code while others wait in a
    library (a collective, backward): the others wait for them."""
    user = sorted(r for r, fs in have.items() if fs and not in_library(fs[0]))
    lib = sorted(r for r, fs in have.items() if fs and in_library(fs[0]))
    if not user or not lib:
        return None
    pos = _unique([where(have[r]) for r in user])
    verb = "is" if len(user) == 1 else "are"
    at = pos[0] if len(pos) == 1 else "user code (" + "; ".join(pos) + ")"
    waits = ", ".join(_unique([waits_in(have[r]) for r in lib]))
    wait = "waits" if len(lib) == 1 else "wait"
    return user, f"{_ranks(user)} {verb} in {at} while {_ranks(lib)} {wait} in {waits}"


def _odd_group(have: dict[int, list[Frame]]) -> tuple[list[int], str] | None:
    """Rule 2: positions split into groups and exactly one is smaller than every other."""
    groups: dict[str, list[int]] = {}
    for r in sorted(have):
        groups.setdefault(_position(have[r]), []).append(r)
    if len(groups) < 2:
        return None
    by_size = sorted(groups.items(), key=lambda kv: (len(kv[1]), kv[1]))
    (pos, odd), rest = by_size[0], by_size[1:]
    if len(odd) >= len(rest[0][1]):
        return None
    others = " / ".join(p for p, _ in sorted(rest, key=lambda kv: (-len(kv[1]), kv[1])))
    return odd, f"{_ranks(odd)} at {pos} while the others are at {others}"


def culprits(stacks: dict[int, list[Frame] | None]) -> tuple[list[int], str]:
    """The ranks most likely at fault, from each rank's main-thread frames (None: the rank
    wrote no dump), and why, in one line; ([], why not) where no rank stands out."""
    have = {r: fs for r, fs in stacks.items() if fs is not None}
    missing = sorted(r for r, fs in stacks.items() if fs is None)
    for rule in (_user_vs_library, _odd_group):
        found = rule(have)
        if found:
            return found
    if have and missing:
        return missing, f"no stack from {_ranks(missing)}"
    if not have:
        return [], "no stacks"
    groups = _unique([_position(have[r]) for r in sorted(have)])
    if len(groups) == 1:
        return [], f"every rank is at {groups[0]}"
    split = "; ".join(
        f"{_ranks([r for r in have if _position(have[r]) == p])} at {p}" for p in groups
    )
    return [], f"no rank stands out: {split}"
