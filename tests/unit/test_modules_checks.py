"""The modules as verify-parity (ops/verify/fingerprints.py), train's preflight
(ops/train/contract.py) and health (ops/health/node.py) read them, on the MODULES fact recorded
on the lab under Lmod 8.6 and Environment Modules 5.2 (tests/facts/modules/)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from nodeprep.engine.facts import FactValues
from nodeprep.engine.facts.modules import MODULES
from nodeprep.ops.verify import fingerprints, parity

FACTS = Path(__file__).resolve().parents[1] / "facts" / "modules"
V = {"modules": ["python/3.11", "cuda/12.6", "cuda/12.8"]}


def recorded(name: str) -> dict:
    return json.loads((FACTS / f"{name}.json").read_text())["expected"]


def keys(fact: dict | None, v: dict = V) -> dict:
    fp: dict = {}
    fingerprints._modules(fp, v, FactValues({} if fact is None else {MODULES.key: fact}))
    return fp


def test_the_system_the_loaded_modules_and_what_they_set():
    fp = keys(recorded("lmod_missing_version"))
    assert fp["modules.system"] == "lmod 8.6.19"
    assert fp["modules.loaded"] == "python/3.11, cuda/12.6"  # cuda/12.8 did not load
    assert fp["modules.env.CUDA_HOME"] == "/var/lib/nodeprep/lab-modules/sw/cuda/12.6"
    assert fp["modules.env.PATH"].startswith("/var/lib/nodeprep/lab-modules/sw/cuda/12.6/bin:")
    assert keys(recorded("tcl_missing_version"))["modules.system"] == "tcl 5.2.0"
    assert keys(recorded("no_init")) == {"modules.system": "none", "modules.loaded": "none"}
    assert keys(recorded("lmod_missing_version"), {"modules": []}) == {}  # none named: no keys


def test_a_module_resolving_elsewhere_on_one_node_is_drift_with_both_values():
    a = recorded("lmod_missing_version")
    b = copy.deepcopy(a)
    b["env"]["CUDA_HOME"] = "/opt/site/cuda-12.6.3"
    rep = parity.compare({"worker-0": keys(a), "worker-1": keys(b)})
    drift = {d.key: {g.value: list(g.nodes) for g in d.groups} for d in rep.drift}
    assert drift == {
        "modules.env.CUDA_HOME": {
            "/var/lib/nodeprep/lab-modules/sw/cuda/12.6": ["worker-0"],
            "/opt/site/cuda-12.6.3": ["worker-1"],
        }
    }


def test_a_node_whose_ranks_would_run_without_a_named_module_is_named_with_the_fix():
    from nodeprep.ops.train import contract

    named = {"worker-0": ["python/3.11", "cuda"], "worker-1": ["python/3.11", "cuda/12.6"]}
    loaded = {"worker-0": ["python/3.11", "cuda/12.6"], "worker-1": ["python/3.11"]}
    got = contract.module_problems(named, loaded)
    assert got == [
        "worker-1: ranks would run without module cuda/12.6 (a non-interactive ssh shell there "
        "has python/3.11 loaded): run `invoke provision` (the modules role's block in the env "
        "file loads them; the shell role makes every shell read that file)"
    ]
    assert contract.module_problems(named, {}) and not contract.module_problems({}, loaded)


def test_health_says_whether_the_named_modules_load():
    from nodeprep.ops.health import node
    from nodeprep.ops.health.findings import Context, Verdict

    def check(name: str):
        return [
            (c, v)
            for c, v, _r, _f in node.modules(FactValues({MODULES.key: recorded(name)}), Context())
        ]

    assert check("lmod_init_profile") == [("MODULES_OK", Verdict.OK)]
    assert check("lmod_missing_version") == [("MODULE_NOT_LOADED", Verdict.CRITICAL)]
    assert check("no_init") == [("MODULES_NO_SYSTEM", Verdict.CRITICAL)]
    assert check("unused") == []  # no modules named: nothing to say
    reason = node.modules(FactValues({MODULES.key: recorded("tcl_missing_version")}), Context())[0][
        2
    ]
    assert reason == "module cuda/12.8 not available (cuda/12.4, cuda/12.6 are)"


def test_a_value_with_newlines_stays_one_value():
    """The snippet prints each variable on one line, a newline in its value as \\x1f (which the
    probe's line splitting leaves alone): a value that looks like more variables is not split."""
    out = (
        "init /etc/profile.d/modules.sh\nversion VERSION=3.2.10\n@@env0\nA=1\n@@loads\n"
        "load cuda/12.6 0\n@@list\ncuda/12.6\n@@env1\nA=1\nNOTE=one\x1ftwo\x1fK=v\n"
    )
    got = MODULES.parse(out, 0)
    assert got["env"] == {"NOTE": "one\ntwo\nK=v"}
    assert (got["system"], got["version"]) == ("tcl", "3.2.10")  # Environment Modules 3.2


def test_the_facts_that_run_the_venvs_python_run_with_the_nodes_modules_loaded():
    """VENV and TORCH_BUILD start the venv's python, which a module's Python (cray-python) needs
    its module for: on a node naming `modules` their probe sections load them first (on top of
    the probe's shell); elsewhere the snippet is as it was."""
    from nodeprep.engine.facts import TORCH_BUILD, VENV, TorchIn
    from nodeprep.engine.facts.probe import probe_script

    v = {"modules": ["cray-python/3.11.7", "cuda/12.6"], "module_path": ["/opt/mf"]}
    reqs = [VENV("~/.nodeprep/venv"), TORCH_BUILD(TorchIn("~/.nodeprep/venv"))]
    loaded = probe_script(reqs, v, "t")
    plain = probe_script(reqs, {}, "t")
    load = "module load cray-python/3.11.7 cuda/12.6"
    assert loaded.count(load) == 2 and "module use /opt/mf" in loaded, loaded
    assert "module" not in plain
    assert VENV.command("~/.nodeprep/venv") in loaded  # each snippet itself kept whole
