"""The whole suite.

Workers: `invoke test` runs the suite on several pytest-xdist workers (`--dist loadscope`,
modules in the order set here, not by test count): every test of one module goes to one
worker (its module fixtures are built once), and each worker runs its own lab "t"
(tests/integration/conftest.py names it), so no two workers share a lab. The modules known to
be long start first (LONG_FIRST), then the other integration modules, then the unit modules
(short ones fill the workers' ends), so no long module is the tail.

Tiers (markers, registered in pyproject.toml): every integration test is `lab`; TIERS below adds
`slurm`, `aarch64`, `cold` (provisions real wheels onto bare nodes) and `train` per module, and
a test that uses a Slurm fixture is `slurm` wherever it is. `invoke test --tier NAME` runs one.

aarch64: when the run includes tests/integration/test_aarch64.py, or NODEPREP_TEST_PREBUILD=aarch64
says a run that does follows (`invoke test` sets it for the unit tier before the lab tier), and
this machine has no arm64 root yet, build it in the background from the start
(lab/foreign.prebuild: minutes of emulated package scripts); that test's lab waits for it. Its
output: <basetemp>/arm64-root.log.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys

import pytest

# the prebuild holds PREBUILT for its whole life (binfmt_misc put back included), so a test in
# another worker waits for it to end, as the worker that started it waits for the process
PREBUILT = "/var/cache/nodeprep/prebuild.lock"
PREBUILD = (
    "import fcntl, os; os.makedirs(os.path.dirname(%r), exist_ok=True); f = open(%r, 'w'); "
    "fcntl.flock(f, fcntl.LOCK_EX); from nodeprep.lab import foreign; foreign.prebuild('aarch64')"
    % (PREBUILT, PREBUILT)
)


def _wants_aarch64(session) -> bool:
    return any(
        item.nodeid.startswith("tests/integration/test_aarch64.py") for item in session.items
    )


def pytest_collection_finish(session):
    # one process starts it: the only one, or the first worker (every worker collects at start)
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    wanted = _wants_aarch64(session) or os.environ.get("NODEPREP_TEST_PREBUILD") == "aarch64"
    if os.geteuid() != 0 or not wanted:
        return
    from nodeprep.lab import foreign

    if foreign.cached_root("aarch64") is not None:
        return
    log = session.config._tmp_path_factory.getbasetemp() / "arm64-root.log"
    session.config.stash[ROOT_BUILD] = subprocess.Popen(
        [sys.executable, "-c", PREBUILD],
        stdin=subprocess.DEVNULL,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )


ROOT_BUILD = pytest.StashKey[subprocess.Popen]()


@pytest.fixture(scope="session")
def arm64_root_ready(request):
    """Wait for the background build, if one was started (lab.up then finds the root)."""
    proc = request.config.stash.get(ROOT_BUILD, None)
    if proc is not None:
        proc.wait()
    elif os.path.exists(PREBUILT):
        with open(PREBUILT) as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)


# integration module -> its tiers besides `lab`
TIERS = {
    "test_aarch64": ("aarch64", "cold", "train"),
    "test_bastion": ("cold", "train"),
    "test_pystack": ("cold",),
    "test_shapes": ("cold", "train"),
    "test_silence": ("cold",),
    "test_verified": ("cold",),
    "test_fanout": ("cold",),
    "test_slurm_transport": ("slurm",),
    "test_health_drain": ("slurm",),
    "test_user_script": ("slurm", "train"),
    "test_train": ("train",),
    "test_train_restarts": ("train",),
    "test_train_resume": ("train",),
    "test_train_watch": ("train",),
    "test_closed_stdout": ("train",),
    "test_health_gate": ("train",),
    "test_init": ("train",),
    "test_ansible_vars": ("train",),
}
SLURM_FIXTURES = {"real_slurm", "slurm", "slurm_lab", "slx"}
# the longest modules, started first on the workers (measured 2026-11-28: docs/testing.md)
LONG_FIRST = (
    "test_aarch64",
    "test_train_watch",
    "test_silence",
    "test_shapes",
    "test_bastion",
    "test_train",
    "test_train_resume",
    "test_train_restarts",
    "test_inventory_differential",
    "test_launchers",
    "test_closed_stdout",
)

# in one process, the lab modules run last: test_aarch64 (the arm64 root builds in the
# background meanwhile), then the modules whose deadlines (a silent node named within 30 s,
# Ctrl-C within 3 s) want the cores to themselves, the root build long done
LATE = (
    "test_aarch64",
    "test_silence",
    "test_train_watch",
    "test_train",
    "test_train_resume",
    "test_closed_stdout",
)


def _module(item) -> str:
    return item.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = _module(item)
        if "/integration/" not in item.nodeid:
            continue
        tiers = {"lab", *TIERS.get(module, ())}
        if SLURM_FIXTURES & set(getattr(item, "fixturenames", ())):
            tiers.add("slurm")
        for tier in sorted(tiers):
            item.add_marker(getattr(pytest.mark, tier))
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        # one process: unit tests first, then the lab modules with LATE last (sort is stable)
        late = {name: i + 1 for i, name in enumerate(LATE)}
        items.sort(key=lambda item: ("/integration/" in item.nodeid, late.get(_module(item), 0)))
        return
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(_module(item), len(rank) + ("/unit/" in item.nodeid)))
