"""Undefined names, unused imports and the like in everything the repo runs: a name dropped
by an edit of a rarely-taken path must fail here, not on a user's fleet."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_pyflakes_is_clean():
    r = subprocess.run([sys.executable, "-m", "pyflakes", "src", "tasks.py", "roles", "bench", "tests"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
