"""The whole suite: when the run includes the aarch64 lab tests (tests/integration/
test_aarch64.py) and this machine has no arm64 root yet, build it in the background from the
start (lab/foreign.prebuild: minutes of emulated package scripts on the core the unit tests
leave idle); that test's lab waits for it. Its output: <basetemp>/arm64-root.log."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

PREBUILD = "from nodeprep.lab import foreign; foreign.prebuild('aarch64')"


def _wants_aarch64(session) -> bool:
    return any(item.nodeid.startswith("tests/integration/test_aarch64.py") for item in session.items)


def pytest_collection_finish(session):
    if os.geteuid() != 0 or not _wants_aarch64(session):
        return
    from nodeprep.lab import foreign
    if foreign.cached_root("aarch64") is not None:
        return
    log = session.config._tmp_path_factory.getbasetemp() / "arm64-root.log"
    session.config.stash[ROOT_BUILD] = subprocess.Popen(
        [sys.executable, "-c", PREBUILD], stdin=subprocess.DEVNULL, stdout=open(log, "w"),
        stderr=subprocess.STDOUT)


ROOT_BUILD = pytest.StashKey[subprocess.Popen]()


@pytest.fixture(scope="session")
def arm64_root_ready(request):
    """Wait for the background build, if one was started (lab.up then finds the root)."""
    proc = request.config.stash.get(ROOT_BUILD, None)
    if proc is not None:
        proc.wait()
