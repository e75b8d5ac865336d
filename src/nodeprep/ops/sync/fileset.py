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


# git's variables that point it at another repository, index or work tree (`git rev-parse
# --local-env-vars`): a user's GIT_DIR must not change which files are the project's
_LOCAL_ENV = (
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_CONFIG",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
    "GIT_OBJECT_DIRECTORY",
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_IMPLICIT_WORK_TREE",
    "GIT_GRAFT_FILE",
    "GIT_INDEX_FILE",
    "GIT_NO_REPLACE_OBJECTS",
    "GIT_REPLACE_REF_BASE",
    "GIT_PREFIX",
    "GIT_INTERNAL_SUPER_PREFIX",
    "GIT_SHALLOW_FILE",
    "GIT_COMMON_DIR",
)


def _env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _LOCAL_ENV}
    return {**env, **(extra or {})}


def _git(args: list[str], cwd: Path, env: dict | None = None) -> bytes:
    r = subprocess.run(["git", *args], cwd=cwd, env=_env(env), capture_output=True)
    if r.returncode:
        why = r.stderr.decode(errors="replace").strip()[-300:]
        raise NodeprepError(f"git {' '.join(args[:2])} in {cwd}: {why}")
    return r.stdout


def _in_git(root: Path) -> bool:
    """Inside a git work tree; "not a git repository" is a plain no, any other refusal (git's
    dubious ownership, a broken repository) an error: reading the project without its own
    repository would give another file set."""
    r = subprocess.run(
        ["git", "rev-parse", "--is-inside-work-tree"], cwd=root, env=_env(), capture_output=True
    )
    if r.returncode == 0:
        return r.stdout.strip() == b"true"
    why = r.stderr.decode(errors="replace").strip()
    if "not a git repository" in why:
        return False
    raise InputError(
        f"{root}: git cannot read this project's repository: {why.splitlines()[-1][:200]}",
        hint="fix what git says (e.g. git config --global --add safe.directory DIR), run again",
    )


def _listed(out: bytes) -> set[str]:
    return {os.fsdecode(p) for p in out.split(b"\0") if p}


def of(project: str | Path) -> FileSet:
    """PROJECT's file set (see the module's docstring)."""
    root = Path(project).resolve()
    if not root.is_dir():
        raise InputError(f"{project}: not a directory", hint="give the project's directory")
    if shutil.which("git") is None:
        raise InputError(
            "git is not installed on this machine: nodeprep reads a project's files as git does",
            hint="install git (apt-get install git)",
        )
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
