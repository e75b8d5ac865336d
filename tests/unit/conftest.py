"""The `slow` marker (registered in pyproject.toml): a unit test that starts heavy processes
(torch ranks, ansible-inventory, every CLI task), downloads, or runs a fuzz campaign.
`pytest tests/unit -m "not slow"` (`invoke test --fast`) is the fast tier; the full suite
runs them all.

Two ways a test gets it:
  - it uses one of the fixtures in SLOW_FIXTURES below (so the files that define them need no
    change, and a new test using one is slow without anyone remembering);
  - `@pytest.mark.slow` on the test itself, in its file (test_ansible_oracle.py,
    test_closed_stdout.py, test_fuzz_inventory.py, test_pystack.py).
"""

from __future__ import annotations

import pytest

# fixture -> why a test using it is slow
SLOW_FIXTURES = {
    # test_launchers.py, test_ncclrt.py
    "torch_python": "a venv with CPU torch (/tmp/tv, pip-installed when missing); the tests "
    "import torch or start torchrun with its ranks",
    # test_ncclrt.py
    "real_libnccl": "NCCL's real libnccl.so.2, fetched with `pip download` once per machine",
    # test_inventory_differential.py
    "runs": "one ansible-inventory run (forked from tests/ansible_oracle.py's server) and one "
    "nodeprep process per corpus entry",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        why = [SLOW_FIXTURES[f] for f in getattr(item, "fixturenames", ()) if f in SLOW_FIXTURES]
        if why and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow(reason="; ".join(why)))
