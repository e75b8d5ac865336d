"""Steps: a desired state on one node, checked against facts, acted on only when it differs.

A step names the facts it reads, says whether the node already matches (and why not), and
gives the sh snippet that makes it match. The runner batches the actions of all differing
steps of a node into one remote command and re-reads their facts in the same round trip to
verify each one took. Two kinds cover most roles: `FileContent` (the whole file is ours) and
`FileBlock` (a marked block inside a user's file; everything outside it is kept byte for byte).
"""

from __future__ import annotations

import difflib
from dataclasses import KW_ONLY, dataclass, field
from typing import Callable

from nodeprep.engine.facts import FILE
from nodeprep.engine.remote import write_script


@dataclass
class StepCheck:
    """A step's verdict on one node: does it match the facts, and if not, why."""

    ok: bool
    why: str = ""  # for a differing step: what differs ("missing", "content differs")
    diff: str = ""  # unified diff for --diff (redacted by the runner)


@dataclass
class Step:
    name: str  # verb on a domain + object: "file.block ~/.ssh/config"
    reads: list  # fact requests the check needs
    check: Callable[[dict], StepCheck]
    # sh snippet, or a function of the facts giving one; None: nothing nodeprep can do
    _: KW_ONLY
    action: str | Callable[[dict], str] | None = None
    hint: str = ""  # what the user can do when it fails
    role: str = ""
    secrets: list[str] = field(default_factory=list)  # values never to show
    # Controller-side work before the node's batched command, e.g. SFTP uploads: f(session, facts)
    before: Callable | None = None
    # The facts as this step's action leaves them ({key: value}), so a later step of the same
    # batch on the same file (two roles' blocks in one env file) plans on top of it.
    after: Callable[[dict], dict] | None = None
    # What its action changes: "home" (files under ~, a venv there: one node acts for all nodes
    # sharing the home), "machine" (a login shell, a system path: once per machine) or "node"
    # (nothing shared: every node acts).
    scope: str = "node"
    # Fleet-level work this step waits for: (key, f(fleet, nodes)). A node's differing steps
    # from this one on go to a later apply pass: every node of the wave first applies the
    # steps before it (e.g. the ssh mesh), then f runs ONCE per key over the nodes that have
    # the step (e.g. the wheelhouse relay, node to node over that mesh), then the pass.
    fleet: tuple[str, Callable] | None = None
    # The room its action needs, for the steps that fill a disk (a push, a venv): f(facts) ->
    # Room. Checked before anything of the node is applied; a failure is explained by it.
    room: Callable[[dict], "Room"] | None = None


@dataclass(frozen=True)
class Room:
    """What a step will write: where (a node path), how many bytes and files, and in words."""

    path: str
    bytes: int
    files: int
    _: KW_ONLY
    what: str  # "26 wheels", "the venv"


def scope_of(path: str) -> str:
    """The scope of a step that writes PATH: an absolute path is the machine's; ~/x and a
    relative path (a remote command starts in the home) are the home's."""
    return "machine" if path.startswith("/") else "home"


def _diff(path: str, old: str | None, new: str) -> str:
    return "".join(
        difflib.unified_diff(
            (old or "").splitlines(True), new.splitlines(True), f"{path} (node)", f"{path} (wanted)"
        )
    )


def FileContent(path: str, content: str, mode: int = 0o644, secrets=()) -> Step:
    req = FILE(path)

    def check(facts):
        f = facts[req.key]
        if not f["exists"]:
            return StepCheck(False, "missing", _diff(path, None, content))
        if f["content"] != content:
            return StepCheck(False, "content differs", _diff(path, f["content"], content))
        if f["mode"] != mode:
            return StepCheck(False, f"mode {f['mode']:o}, want {mode:o}")
        return StepCheck(True)

    return Step(
        f"file.content {path}",
        [req],
        check,
        action=write_script(path, content, mode),
        secrets=list(secrets),
        after=lambda facts: {req.key: _written(content, mode)},
        scope=scope_of(path),
    )


def _written(content: str, mode: int) -> dict:
    return {
        "exists": True,
        "mode": mode,
        "size": len(content.encode("utf-8", "surrogateescape")),
        "content": content,
    }


def begin_marker(name: str, comment: str = "#") -> str:
    return f"{comment} BEGIN nodeprep {name} (managed: edits inside this block are replaced)"


def end_marker(name: str, comment: str = "#") -> str:
    return f"{comment} END nodeprep {name}"


def _block_span(lines: list[str], name: str, comment: str) -> tuple[int, int] | None:
    """(first, last) line index of the managed block NAME in LINES, or None."""
    begin, end = begin_marker(name, comment), end_marker(name, comment)
    starts = [i for i, ln in enumerate(lines) if ln.rstrip("\r\n") == begin]
    ends = [i for i, ln in enumerate(lines) if ln.rstrip("\r\n") == end]
    return (starts[0], ends[0]) if starts and ends and ends[0] > starts[0] else None


def without_block(text: str | None, name: str, comment: str = "#") -> str:
    """TEXT with the managed block NAME removed; everything else untouched."""
    lines = (text or "").splitlines(True)
    span = _block_span(lines, name, comment)
    return "".join(lines[: span[0]] + lines[span[1] + 1 :]) if span else (text or "")


def _leading(lines: list[str], comment: str) -> int:
    """How many lines at the top of LINES are managed blocks (of any name), blank lines and
    comments: what can stand before a block that must come first."""
    i, n = 0, len(lines)
    prefix = f"{comment} BEGIN nodeprep "
    while i < n:
        text = lines[i].rstrip("\r\n")
        if not text.strip() or (text.lstrip().startswith(comment) and not text.startswith(prefix)):
            i += 1
            continue
        if not text.startswith(prefix):
            break
        name = text[len(prefix) :].removesuffix(" (managed: edits inside this block are replaced)")
        end = next(
            (j for j in range(i + 1, n) if lines[j].rstrip("\r\n") == end_marker(name, comment)),
            None,
        )
        if end is None:
            break
        i = end + 1
    return i


def with_block(
    text: str | None, name: str, body: str, where: str = "bottom", comment: str = "#"
) -> str:
    """TEXT with the managed block NAME set to BODY; content outside the block untouched.
    WHERE a new block goes: bottom, top, or first (before any line of the user's, moved there
    when it is found below one: for files where the first value wins, as ssh_config)."""
    begin, end = begin_marker(name, comment), end_marker(name, comment)
    block = begin + "\n" + body.rstrip("\n") + ("\n" if body.strip() else "") + end + "\n"
    text = text or ""
    lines = text.splitlines(True)
    span = _block_span(lines, name, comment)
    if span and where == "first" and span[0] >= _leading(lines, comment):
        text, span = "".join(lines[: span[0]] + lines[span[1] + 1 :]), None
    if span:
        return "".join(lines[: span[0]]) + block + "".join(lines[span[1] + 1 :])
    if where in ("top", "first"):
        return block + text
    if text and not text.endswith("\n"):
        text += "\n"
    return text + block


def FileBlock(
    path: str, name: str, body: str, mode: int | None = None, where: str = "bottom", secrets=()
) -> Step:
    """A managed block in PATH. MODE None keeps the file's mode (0644 for a new file)."""
    req = FILE(path)

    def wanted(f) -> str:
        return with_block(f["content"], name, body, where)

    def check(facts):
        f = facts[req.key]
        if f["exists"] and f["content"] is None:
            return StepCheck(False, "file too large to manage")
        new = wanted(f)
        if not f["exists"]:
            return StepCheck(False, "missing", _diff(path, None, new))
        if new != f["content"]:
            return StepCheck(False, f"block '{name}' differs", _diff(path, f["content"], new))
        if mode is not None and f["mode"] != mode:
            return StepCheck(False, f"mode {f['mode']:o}, want {mode:o}")
        return StepCheck(True)

    def action(facts):  # the new content depends on what the file holds now
        f = facts[req.key]
        return write_script(path, wanted(f), mode if mode is not None else (f["mode"] or 0o644))

    def after(facts):
        f = facts[req.key]
        return {req.key: _written(wanted(f), mode if mode is not None else (f["mode"] or 0o644))}

    return Step(
        f"file.block {path} [{name}]",
        [req],
        check,
        action=action,
        secrets=list(secrets),
        after=after,
        scope=scope_of(path),
    )


def action_for(step: Step, facts: dict) -> str | None:
    return step.action(facts) if callable(step.action) else step.action
