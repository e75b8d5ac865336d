"""Undefined names, unused imports and the like in everything the repo runs: a name dropped
by an edit of a rarely-taken path must fail here, not on a user's fleet. And one format:
`ruff format` has nothing to change (pyproject.toml's [tool.ruff] says what and how)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATHS = ["src", "tasks.py", "roles", "bench", "tests"]


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_ruff_check_is_clean():
    r = ruff("check", "--no-cache", *PATHS)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_is_clean():
    r = ruff("format", "--check", "--no-cache", *PATHS)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_checks_can_fail(tmp_path):
    """Not vacuous: with the repo's settings, an unused import, an undefined name and
    unformatted code are each found."""
    config = str(ROOT / "pyproject.toml")
    (tmp_path / "bad.py").write_text("import os\n\n\ndef f():\n    return missing_name\n")
    (tmp_path / "ugly.py").write_text("x = {  'a':1 }\n")
    r = ruff("check", "--no-cache", "--config", config, "bad.py", cwd=tmp_path)
    assert r.returncode == 1 and "F401" in r.stdout and "F821" in r.stdout, r.stdout + r.stderr
    r = ruff("format", "--check", "--no-cache", "--config", config, "ugly.py", cwd=tmp_path)
    assert r.returncode == 1 and "ugly.py" in r.stdout + r.stderr, r.stdout + r.stderr
