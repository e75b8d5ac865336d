"""A project's files as git sees them (ops/sync/fileset.py), on real git repositories made
here: .gitignore at several depths with negations, an ignored checkpoint directory, a tracked
file .nodeprepignore takes out, a deleted tracked file, a nested repository. Oracles: `git
ls-files --cached --others --exclude-standard` in the repository (the issue's own check), and
for a directory outside git, the same tree made a repository with every file git would add."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.ops.sync import fileset

TREE = {
    ".gitignore": "*.log\n!keep.log\ncheckpoints/\n/build\nwandb/\n",
    "train.py": "print('hi')\n",
    "keep.log": "kept by the negation\n",
    "debug.log": "ignored\n",
    "checkpoints/step-100.pt": "x" * 100,
    "build/out.o": "ignored at the top only\n",
    "src/build/kept.py": "a build/ below the top is kept (/build is anchored)\n",
    "src/model.py": "model\n",
    "src/.gitignore": "*.tmp\n!important.tmp\n",
    "src/scratch.tmp": "ignored by the nested file\n",
    "src/important.tmp": "kept by the nested negation\n",
    "configs/a.yaml": "lr: 1\n",
    "data/big.bin": "tracked, but the nodes need not get it\n",
    ".nodeprepignore": "data/\n",
    "wandb/run-1/log.txt": "ignored\n",
}
WANT = [
    ".gitignore",
    ".nodeprepignore",
    "configs/a.yaml",
    "keep.log",
    "src/.gitignore",
    "src/build/kept.py",
    "src/important.tmp",
    "src/model.py",
    "train.py",
]


def _write(root: Path, tree: dict) -> None:
    for rel, text in tree.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def _git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t")
    env.update(GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(
        ["git", *args], cwd=root, env=env, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")  # no excludesFile of this machine's
    root = tmp_path / "proj"
    _write(root, TREE)
    _git(root, "init", "-q")
    _git(root, "add", "train.py", ".gitignore", "data/big.bin", "configs/a.yaml")
    _git(root, "commit", "-qm", "start")
    return root


def test_a_repository_gives_what_git_would_track_less_nodeprepignore(repo):
    got = fileset.of(repo)
    assert got.in_git and got.files == WANT
    oracle = _git(repo, "ls-files", "--cached", "--others", "--exclude-standard").split()
    assert sorted(set(oracle) - {"data/big.bin"}) == got.files


def test_outside_git_the_ignore_files_alone_give_the_same_set(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no repository above
    root = tmp_path / "plain"
    _write(root, TREE)
    got = fileset.of(root)
    assert not got.in_git and got.files == WANT
    assert not (root / ".git").exists()  # nothing written into the project
    _git(root, "init", "-q")  # the oracle: the same tree as a repository, everything added
    _git(root, "add", "-A")
    oracle = set(_git(root, "ls-files").split()) - {"data/big.bin"}
    assert sorted(oracle) == got.files


def test_deleted_tracked_files_and_a_nested_repository_are_left_out(repo):
    (repo / "train.py").unlink()
    _write(repo / "vendor" / "lib", {"x.py": "nested repo\n"})
    _git(repo / "vendor" / "lib", "init", "-q")
    got = fileset.of(repo)
    assert "train.py" not in got.files
    assert not any(f.startswith("vendor/") for f in got.files)
    assert list(got.left_out) == ["vendor/lib/"], got.left_out


def test_a_subdirectory_of_a_repository_is_its_own_project(repo):
    got = fileset.of(repo / "src")
    assert got.in_git and got.files == [".gitignore", "build/kept.py", "important.tmp", "model.py"]


def test_not_a_directory_is_bad_input(tmp_path):
    with pytest.raises(InputError):
        fileset.of(tmp_path / "nope")


def test_the_users_git_dir_does_not_change_the_projects_files(repo, tmp_path, monkeypatch):
    other = tmp_path / "other"
    other.mkdir()
    _git(other, "init", "-q")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(other / ".git" / "index"))
    assert fileset.of(repo).files == WANT


def test_a_file_name_that_is_not_utf8_is_kept_as_the_file_system_names_it(repo):
    name = os.fsdecode(b"caf\xe9.py")
    (repo / name).write_text("latin-1 name\n")
    assert name in fileset.of(repo).files
    assert (repo / name).exists()


def test_a_repository_git_refuses_to_read_is_an_error_not_another_file_set(repo, monkeypatch):
    monkeypatch.setenv("GIT_TEST_ASSUME_DIFFERENT_OWNER", "1")  # git's own switch for this
    with pytest.raises(InputError) as e:
        fileset.of(repo)
    assert "git cannot read this project's repository" in e.value.message, e.value.message
