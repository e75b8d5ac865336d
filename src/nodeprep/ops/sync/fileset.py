"""A project's files as git sees them (issue 48): what `train --payload` syncs to the nodes.

Inside a git work tree: the files git would track, `git ls-files --cached --others
--exclude-standard` (tracked, plus untracked and not ignored: .gitignore files at every depth,
negations, .git/info/exclude and the user's core.excludesFile, exactly as git applies them, since
git itself answers). Outside one: the same rules from the ignore files alone, answered by git
over a throwaway git directory with PROJECT as its work tree. Either way, a `.nodeprepignore`
(gitignore syntax, at any depth) then takes out what git tracks but the nodes need not get.

Tracked files deleted from the work tree, submodules (a directory, not a file) and anything not
a regular file or a symlink are not in the set. Paths are relative to PROJECT, POSIX, sorted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from nodeprep.errors import InputError, NodeprepError

IGNORE_FILE = ".nodeprepignore"


@dataclass
class FileSet:
    root: Path
    files: list[str]  # relative POSIX paths, sorted
    in_git: bool  # PROJECT is inside a git work tree
    left_out: dict = field(default_factory=dict)  # path -> why (not a regular file, ...)


def _git(args: list[str], cwd: Path, env: dict | None = None) -> str:
    if shutil.which("git") is None:
        raise InputError(
            "git is not installed on this machine: nodeprep reads a project's files as git does",
            hint="install git (apt-get install git)",
        )
    r = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
    )
    if r.returncode:
        raise NodeprepError(f"git {' '.join(args[:2])} in {cwd}: {r.stderr.strip()[-300:]}")
    return r.stdout


def _in_git(root: Path) -> bool:
    r = subprocess.run(
        ["git", "rev-parse", "--is-inside-work-tree"], cwd=root, capture_output=True, text=True
    )
    return r.returncode == 0 and r.stdout.strip() == "true"


def _listed(out: str) -> set[str]:
    return {p for p in out.split("\0") if p}


def of(project: str | Path) -> FileSet:
    """PROJECT's file set (see the module's docstring)."""
    root = Path(project).resolve()
    if not root.is_dir():
        raise InputError(f"{project}: not a directory", hint="give the project's directory")
    mine = ["--exclude-per-directory=" + IGNORE_FILE]
    if _in_git(root):
        want = _listed(_git(["ls-files", "-z", "--cached", "--others", "--exclude-standard"], root))
        dropped = _listed(
            _git(["ls-files", "-z", "--cached", "--others", "--ignored", *mine], root)
        )
        return _checked(root, want - dropped, True)
    with tempfile.TemporaryDirectory(prefix="nodeprep-git-") as tmp:
        env = {"GIT_DIR": tmp, "GIT_WORK_TREE": str(root)}
        _git(["init", "-q"], root, env)
        want = _listed(_git(["ls-files", "-z", "--others", "--exclude-standard"], root, env))
        dropped = _listed(_git(["ls-files", "-z", "--others", "--ignored", *mine], root, env))
    return _checked(root, want - dropped, False)


def _checked(root: Path, paths: set[str], in_git: bool) -> FileSet:
    """The paths that are files now: a tracked file deleted, a submodule, a fifo are left out."""
    files, left_out = [], {}
    for rel in sorted(paths):
        p = root / rel
        if p.is_symlink() or p.is_file():
            files.append(rel)
        elif p.is_dir():
            left_out[rel] = "a directory in git's index (a submodule): not synced"
        elif p.exists():
            left_out[rel] = "not a regular file"
    return FileSet(root, files, in_git, left_out)
