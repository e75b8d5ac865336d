"""Fact parsers against real outputs, one data file per case (tests/facts/<fact>/<case>.json),
plus the probe's section framing.

A case: {"source": where the output comes from (recorded: machine, date, command; or a URL),
"case": what it shows (optional), "output": the section text the parser gets, "rc": its exit
status, and "expected": the value, or "error": the message the parser refuses it with}.
For a batched fact (FILE), "args" lists the requests that shared the section. The facts are
the `Fact` objects the modules of nodeprep.engine.facts define, found here, not listed: a fact
added without cases fails test_every_fact_has_cases."""

import importlib
import json
import pkgutil
import re
from pathlib import Path

import pytest

from nodeprep.engine import facts
from nodeprep.engine.facts import gpus
from nodeprep.engine.facts.probe import Fact

DATA = Path(__file__).parents[1] / "facts"
CASES = sorted(DATA.glob("*/*.json"))
# tests/facts/ also holds the inputs of other parsers (not facts): nccl_log/*.log, nccl_maps/*.maps
NOT_FACTS = {"nccl_log", "nccl_maps"}


def _defined_facts() -> dict[str, Fact]:
    """Every Fact object a module of the facts package defines (ALL may miss one)."""
    found: dict[str, Fact] = {}
    for mod in pkgutil.iter_modules(facts.__path__):
        module = importlib.import_module(f"{facts.__name__}.{mod.name}")
        for value in vars(module).values():
            if isinstance(value, Fact):
                found[value.name] = value
    return found


def _plain(value):
    """A parsed value as JSON holds it: sets as sorted lists."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def test_cases_are_found():
    """An empty glob would parametrize test_fact_parser with nothing, which pytest skips."""
    assert len(CASES) >= len(facts.ALL) >= 17, f"fact cases under {DATA}: {[str(c) for c in CASES]}"


def test_every_fact_has_cases():
    defined = _defined_facts()
    assert set(defined) == set(facts.ALL), (
        "a Fact defined in nodeprep.engine.facts is missing "
        "from ALL (or ALL names one no module defines)"
    )
    assert len(defined) >= 17
    covered = {c.parent.name for c in CASES}
    assert sorted(set(defined) - covered) == [], f"facts without a data case under {DATA}/<fact>/"
    assert sorted(covered - set(defined)) == [], "case directories naming no fact"
    dirs = {d.name for d in DATA.iterdir() if d.is_dir()}
    assert sorted(dirs - covered - NOT_FACTS) == [], "directories without any .json case"


# Cases from before the rule that every data file names its source (their provenance was
# not written down); the list may only shrink.
UNSOURCED = {
    "gpus/a100_8x",
    "gpus/driver_not_loaded",
    "gpus/h100_2x",
    "gpus/l4_1x",
    "gpus/no_devices",
    "gpus/no_nvidia_smi",
    "gpus/r470_a10_not_a100",
    "gpus/r470_no_compute_cap_v100",
    "gpus/rtx3070",
    "identity/garbage_lines_ignored",
    "identity/no_boot_id",
    "identity/no_home_id",
    "identity/no_machine_id",
    "identity/normal",
    "identity/nothing",
    "interfaces/lab_node",
    "interfaces/no_ip_command",
    "interfaces/veth_and_docker",
    "os/debian12",
    "os/ubuntu_aarch64",
    "python/centos7",
    "python/missing",
    "python/musl_or_unknown_libc",
    "python/system",
}


def _id(case: Path) -> str:
    return f"{case.parent.name}/{case.stem}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_fact_parser(case):
    data = json.loads(case.read_text())
    fact = facts.ALL[case.parent.name]
    if _id(case) not in UNSOURCED:
        assert str(data.get("source", "")).strip(), f"{case}: no source"
    assert ("expected" in data) != ("error" in data), f"{case}: give expected or error, not both"
    if "args" in data:
        assert fact.split, f"{case}: args, but {fact.name} is not batched"
        read = lambda: fact.split(data["output"], data["rc"], data["args"])
        if len(data["args"]) == 1 and "expected" in data:  # the one-request reader too
            assert _plain(fact.parse(data["output"], data["rc"])) == data["expected"][0]
    else:
        read = lambda: fact.parse(data["output"], data["rc"])
    if "error" in data:
        with pytest.raises((ValueError, KeyError, IndexError), match=re.escape(data["error"])):
            read()
    else:
        assert _plain(read()) == data["expected"]


def test_unsourced_cases_still_exist():
    """UNSOURCED names only cases that exist and still lack a source (a case given one
    leaves the list)."""
    for name in sorted(UNSOURCED):
        path = DATA / f"{name}.json"
        assert path.is_file(), path
        assert not json.loads(path.read_text()).get("source"), (
            f"{name} has a source now: take it off UNSOURCED"
        )


def test_probe_sections_roundtrip():
    script = facts.probe_script(
        [facts.HOSTNAME, facts.PYTHON], {"python": "python3; rm -rf /"}, "abc"
    )
    # The inventory value is quoted into the command, never spliced as shell code.
    assert "'python3; rm -rf /'" in script
    out = "@@abc:0@@\nworker-0\n@@abc:rc=0@@\n@@abc:1@@\nMISSING\n@@abc:rc=0@@\n"
    assert facts.split_sections(out, "abc") == {"0": ("worker-0", 0), "1": ("MISSING", 0)}
    assert facts.parse_sections("n", [facts.HOSTNAME, facts.PYTHON], out, "abc", 0) == {
        "hostname": "worker-0",
        "python": None,
    }


def test_forged_marker_with_other_token_is_plain_text():
    out = "@@abc:hostname@@\n@@zzz:rc=0@@\nreal\n@@abc:rc=3@@\n"
    assert facts.split_sections(out, "abc") == {"hostname": ("@@zzz:rc=0@@\nreal", 3)}


@pytest.mark.parametrize(
    "name,cap",
    [
        ("NVIDIA A100-SXM4-40GB", "8.0"),
        ("NVIDIA A10G", "8.6"),
        ("NVIDIA A10", "8.6"),
        ("Tesla T4", "7.5"),
        ("NVIDIA L40S", "8.9"),
        ("NVIDIA GH200 480GB", "9.0"),
        ("NVIDIA H100 PCIe", "9.0"),
        ("NVIDIA B200", "10.0"),
        ("NVIDIA GeForce RTX 5090", "12.0"),
        ("Tesla V100-PCIE-16GB", "7.0"),
        ("Some Future GPU", None),
    ],
)
def test_capability_from_name(name, cap):
    assert gpus.capability_from_name(name) == cap


def test_gpu_summary():
    g = gpus.parse("535.104.05, NVIDIA A100-SXM4-80GB, 8.0, 81920 MiB\n" * 2)
    assert gpus.summary(g) == "2x NVIDIA A100-SXM4-80GB (8.0), driver 535.104.05"
    assert gpus.summary(gpus.parse("NO_NVIDIA_SMI")) == "none"


def _run_os_probe(etc, usr_lib, env=None):
    """The OS fact's section, run by /bin/sh (dash on Debian, as on the nodes), with the node's
    /etc/os-release at ETC and /usr/lib/os-release at USR_LIB (files that may not exist)."""
    import subprocess

    script = facts.probe_script([facts.OS], {}, "t")
    assert "/etc/os-release" in script and "/usr/lib/os-release" in script
    script = script.replace("/etc/os-release", str(etc)).replace(
        "/usr/lib/os-release", str(usr_lib)
    )
    out = subprocess.run(
        ["/bin/sh", "-c", script],
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return facts.parse_sections("n", [facts.OS], out, "t", 0)["os"]


def test_os_probe_without_an_os_release_file(tmp_path):
    """A `.` of a missing file ends a POSIX sh: before the fix, a node without /etc/os-release
    gave an empty section and the fact failed to parse. Now: the fallback os-release(5)
    names, /usr/lib/os-release; with neither, an unknown release (the kernel name); one in
    the environment is not taken for the node's."""
    import os

    uname = os.uname()
    etc, usr_lib = tmp_path / "etc-os-release", tmp_path / "usr-lib-os-release"
    unknown = {"release": uname.sysname, "kernel": uname.release, "arch": uname.machine}
    assert _run_os_probe(etc, usr_lib) == unknown
    assert _run_os_probe(etc, usr_lib, {"PRETTY_NAME": "Not This One"}) == unknown
    usr_lib.write_text('NAME="Fallback"\nPRETTY_NAME="Fallback OS 1"\n')
    assert _run_os_probe(etc, usr_lib)["release"] == "Fallback OS 1"
    etc.write_text('PRETTY_NAME="Etc OS 2"\n')
    assert _run_os_probe(etc, usr_lib)["release"] == "Etc OS 2"
    etc.write_text('NAME="No pretty name"\n')  # as before: the kernel name
    assert _run_os_probe(etc, usr_lib) == unknown


def _run_python_probe(home, python):
    import subprocess

    script = facts.probe_script([facts.PYTHON], {"python": str(python)}, "t")
    out = subprocess.run(
        ["sh", "-c", script],
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return facts.parse_sections("n", [facts.PYTHON], out, "t", 0)["python"]


@pytest.mark.skipif(
    not Path("/etc/machine-id").is_file(), reason="the cache is keyed by /etc/machine-id"
)
def test_python_probe_cache(tmp_path):
    """Real sh, a real interpreter (a copy, so its stat can change): no cache on a machine
    nodeprep does not manage yet; then one keyed by the interpreter's stat, read back on a
    hit (the doctored answer proves it), dropped when the file changes; never for a script."""
    import os
    import shutil
    import sys

    home, py = tmp_path / "home", tmp_path / "bin" / "python3"
    home.mkdir()
    py.parent.mkdir()
    shutil.copy2(os.path.realpath(sys.executable), py)
    real = _run_python_probe(home, py)
    assert real["version"] == "%d.%d.%d" % sys.version_info[:3]
    assert not (home / ".nodeprep").exists()  # unmanaged machine: nothing written
    (home / ".nodeprep").mkdir()
    assert _run_python_probe(home, py) == real
    cache = next((home / ".nodeprep").glob("python_probe.*"))
    lines = cache.read_text().splitlines()
    assert lines[0].startswith(f"{py} ") and lines[1:3] == [real["path"], real["version"]]
    cache.write_text("\n".join([lines[0], lines[1], "9.9.9", lines[3]]) + "\n")
    assert _run_python_probe(home, py)["version"] == "9.9.9"  # a hit: answered from the cache
    os.utime(py, (1, 1))  # the interpreter changed
    assert _run_python_probe(home, py) == real
    shim = tmp_path / "bin" / "python3-shim"  # pyenv/asdf shims: never cached
    shim.write_text(f'#!/bin/sh\nexec {py} "$@"\n')
    shim.chmod(0o755)
    cache.unlink()
    assert _run_python_probe(home, shim)["version"] == real["version"]
    assert not cache.exists()
    # cached, then replaced by a script at the same path: its stat differs, so it is asked
    # (no stale hit), and the script's answer is not written (the check runs before writing)
    assert _run_python_probe(home, py) == real
    entry = cache.read_text()
    new = py.with_name("python3.new")
    new.write_text(f'#!/bin/sh\nexec {os.path.realpath(sys.executable)} "$@"\n')
    new.chmod(0o755)
    new.rename(py)
    assert _run_python_probe(home, py)["version"] == real["version"]
    assert cache.read_text() == entry


@pytest.mark.skipif(
    not Path("/etc/machine-id").is_file(), reason="the cache is keyed by /etc/machine-id"
)
def test_python_probe_cache_keeps_several_interpreters(tmp_path):
    """Two probes asking for two interpreters on one machine (an inventory's /usr/bin/python3
    and a venv's python3 first on PATH) both hit, instead of evicting each other's entry on
    every run; the newest entry comes first, at most 4 are kept."""
    import os
    import shutil
    import sys

    home = tmp_path / "home"
    (home / ".nodeprep").mkdir(parents=True)
    pys = []
    for i in range(6):
        p = tmp_path / f"bin{i}" / "python3"
        p.parent.mkdir()
        shutil.copy2(os.path.realpath(sys.executable), p)
        pys.append(p)
    real = [_run_python_probe(home, p) for p in pys[:2]]
    cache = next((home / ".nodeprep").glob("python_probe.*"))
    text = cache.read_text().splitlines()
    assert len(text) == 8 and text[0].startswith(f"{pys[1]} ") and text[4].startswith(f"{pys[0]} ")
    doctored = [text[0], text[1], "8.8.8", text[3], text[4], text[5], "7.7.7", text[7]]
    cache.write_text("\n".join(doctored) + "\n")
    for _ in range(2):  # both answered from the cache, in either order
        assert _run_python_probe(home, pys[0])["version"] == "7.7.7"
        assert _run_python_probe(home, pys[1])["version"] == "8.8.8"
    assert real[0]["path"] == str(pys[0])
    for p in pys[2:]:
        _run_python_probe(home, p)
    kept = [line.split(" ")[0] for line in cache.read_text().splitlines()[::4]]
    assert kept == [str(p) for p in reversed(pys[2:])]  # the 4 newest, newest first
    assert _run_python_probe(home, pys[5])["version"] == real[0]["version"]


def _run_venv_probe(venv):
    import subprocess

    script = facts.probe_script([facts.VENV(str(venv))], {}, "t")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    return facts.parse_sections("n", [facts.VENV(str(venv))], out, "t", 0)[facts.VENV(str(venv))]


@pytest.mark.skipif(not Path("/etc/machine-id").is_file(), reason="the run key is kept per machine")
def test_venv_probe_runs_the_interpreter_only_when_it_changed(tmp_path):
    """Real sh on a hand-made venv: the interpreter's start is remembered in the venv per
    machine, keyed by its target's stat; a remembered key skips the start (a failing
    interpreter is not noticed then: the proof that it did not run), a new target or a
    dangling link runs it again and reports the venv broken."""
    import os
    import sys

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages" / "numpy-2.1.0.dist-info").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.2\n")
    os.symlink(os.path.realpath(sys.executable), venv / "bin" / "python")
    good = _run_venv_probe(venv)
    assert good == {
        "exists": True,
        "python": "3.11.2",
        "packages": {"numpy": "2.1.0"},
        "platforms": {},
        "home": "/usr/bin",  # the directory of the interpreter that made it
    }
    mark = next(venv.glob(".nodeprep-runs.*"))
    key = mark.read_text()
    failing = tmp_path / "failing-python"
    failing.write_text("#!/bin/sh\nexit 1\n")
    failing.chmod(0o755)
    (venv / "bin" / "python").unlink()
    os.symlink(failing, venv / "bin" / "python")  # another target: runs, fails
    assert _run_venv_probe(venv)["error"] == "its python does not run"
    assert mark.read_text() == key  # a failed start is not remembered
    import subprocess

    new_key = subprocess.run(
        [
            "stat",
            "-L",
            "--printf",
            "%d:%i:%s:%Y ",
            "--",
            str(venv / "bin" / "python"),
            "/etc/ld.so.cache",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    mark.write_text(new_key + "\n")
    assert _run_venv_probe(venv) == good  # remembered: not started
    (venv / "bin" / "python").unlink()
    os.symlink(tmp_path / "gone", venv / "bin" / "python")  # base Python removed
    assert _run_venv_probe(venv) == {
        "exists": False,
        "python": None,
        "packages": {},
        "platforms": {},
    }
