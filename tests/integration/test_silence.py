"""A node that goes silent (blackhole routes in its network namespace: what a power loss, a
dead switch port or a hung kernel looks like from outside: no RST, no answer) never hangs a
run: it is named within 30 s (connect_timeout 10 s, silent_after 15 s by default), the other
nodes complete, the command exits 1 without a traceback, and after the fault heals a re-run
converges. Ctrl-C ends a command within 3 s in every state, one line per node saying what it
interrupted, locks released. A node without room is named with the numbers.

Durations asserted here are the documented deadlines (a behaviour), with slack for the lab's
2 shared cores; bench/silence_bench.py measures them.

The cold provisions here move and install a small synthetic stack (tests/integration/
synthetic.py: three wheels of random bytes, 150 MB in all, no torch) in a venv and wheelhouse
of its own beside the site's: what a silent node or Ctrl-C does to a cold wheelhouse push and
pip install does not depend on what the wheels hold, and the site's stack, which parity and
training use, is never taken down."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import FactsOptions, ProvisionOptions, VerifyOptions
from nodeprep.commands.provision import provision
from nodeprep.engine.events import Events

from .synthetic import make_stack, stack_sets

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 30.0  # a silent node is named within this, by default
# under ~: the small stack's venv, wheelhouse and env file (beside the site's)
VENV, WHEELHOUSE, ENV = (
    ".nodeprep/venv-silence",
    ".nodeprep/wheelhouse-silence",
    ".nodeprep/env-silence.sh",
)
ROLES = "wheelhouse,venv"


# what an interrupted run left running on a node (every command of a run carries NODEPREP_RUN)
_LEFT_BEHIND = (
    "myns=$(readlink /proc/self/ns/net); for p in /proc/[0-9]*; do "
    '[ "$(readlink $p/ns/net 2>/dev/null)" = "$myns" ] || continue; '
    "tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -q '^NODEPREP_RUN=' && "
    "kill -9 ${p#/proc/} 2>/dev/null; "
    "done; true"
)


@pytest.fixture(scope="module")
def stack(site, lab, lab_settings, tmp_path_factory):
    """(the site's --set overrides plus the small stack's, its wheels directory, its settings).
    The settings: a state directory of its own (the host keys pinned so far copied), so that
    the small stack's resolution never replaces the site's in the controller's wheelhouse
    (one resolution is kept per platform)."""
    base = tmp_path_factory.mktemp("silence-stack")
    req = make_stack(base, "npsilence", [50_000_000, 50_000_001, 50_000_002])
    settings = lab_settings.with_(state_dir=str(base / "state"))
    settings.state.mkdir()
    shutil.copy2(lab_settings.known_hosts, settings.known_hosts)
    sets = (*site, *stack_sets(req, f"~/{VENV}", f"~/{WHEELHOUSE}", f"~/{ENV}"))
    yield sets, base / "wheels", settings
    for node in lab.nodes:
        labmod.node_shell(lab, node.index, f"cd /home/nodeprep && rm -rf {VENV} {WHEELHOUSE} {ENV}")


@pytest.fixture
def small(stack, monkeypatch):
    """The small stack's --set overrides; the controller's pip (here and in an `invoke` this
    test starts) resolves from its wheels alone."""
    sets, wheels, _settings = stack
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return sets


@pytest.fixture
def small_settings(stack):
    """The Settings the small stack is provisioned with (see stack)."""
    return stack[2]


@pytest.fixture
def heal(lab, lab_up):
    """Heal every node after the test (routes), stop what interrupted runs left running there
    (the next run's lock takeover would; the next TEST must not race it), the lab as it was."""
    yield
    for node in lab.nodes:
        labmod.silence_node(lab, node.index, silent=False)
        labmod.node_shell(lab, node.index, _LEFT_BEHIND)
    lab_up()


def _json(out: str) -> dict:
    return json.loads(out[out.index("{\n") :])


def test_silent_from_the_start_is_named_at_connect(lab, lab_settings, heal, capsys):
    labmod.silence_node(lab, 1)
    t0 = time.monotonic()
    code = api.facts(
        FactsOptions(inventory=str(lab.inventory), limit=None, json=True), lab_settings
    )
    took = time.monotonic() - t0
    rep = _json(capsys.readouterr().out)
    assert code == 1 and took < DEADLINE
    assert rep["nodes"]["worker-1"]["status"] == "unreachable"
    assert "no answer within 10 s" in rep["nodes"]["worker-1"]["message"]
    assert "tries" not in rep["nodes"]["worker-1"]["message"]  # a silent address: no retry
    assert [rep["nodes"][n]["status"] for n in ("worker-0", "worker-2")] == ["ok", "ok"]


def test_silent_during_verify_parity_others_compared(lab, lab_settings, heal, capsys):
    labmod.silence_node(lab, 2)
    t0 = time.monotonic()
    code = api.verify_parity(
        VerifyOptions(inventory=str(lab.inventory), limit=None, json=True, port=None), lab_settings
    )
    took = time.monotonic() - t0
    rep = _json(capsys.readouterr().out)
    assert code == 1 and took < DEADLINE + 10
    assert list(rep["unreachable"]) == ["worker-2"]


class _SilenceAt(Events):
    """Silences NODE when it starts what MATCH says (a stage's progress message), and records
    when NODE's status became unreachable."""

    def __init__(self, lab, node: int, match: str):
        self.lab, self.index, self.match = lab, node, match
        self.name = lab.nodes[node].name
        self.silenced: float | None = None
        self.named: float | None = None
        self.lock = threading.Lock()

    def status(self, node, stage, status, message=""):
        with self.lock:
            if (
                node == self.name
                and self.silenced is None
                and status == "running"
                and self.match in message
            ):
                labmod.silence_node(self.lab, self.index)
                self.silenced = time.monotonic()
            if node == self.name and status == "unreachable" and self.named is None:
                self.named = time.monotonic()


def _on_pair(lab, settings, sets, **kw) -> int:
    """`provision` of the small stack (SETS) on worker-[1-2] with SETTINGS: its exit code."""
    opts = ProvisionOptions(
        inventory=str(lab.inventory), limit="worker-[1-2]", roles=ROLES, sets=tuple(sets), **kw
    )
    return api.provision(opts, settings)


def _cold(lab, index: int) -> None:
    """Node INDEX without the small stack (venv, wheelhouse): the next provision is cold."""
    labmod.node_shell(lab, index, f"rm -rf /home/nodeprep/{VENV} /home/nodeprep/{WHEELHOUSE}")


@pytest.mark.parametrize(
    "match", ["upload for wheelhouse", "pip.install"], ids=["wheel-push", "pip"]
)
def test_silent_during_a_cold_provision(
    site, lab, lab_settings, small, small_settings, heal, match
):
    sets = (*small, "wheelhouse_relay=false")
    opts = ProvisionOptions(
        inventory=str(lab.inventory), limit="worker-[1-2]", roles=ROLES, sets=sets
    )
    # the whole lab warm first (maybe already): parity checks the mesh to every node
    assert (
        api.provision(ProvisionOptions(inventory=str(lab.inventory), sets=site), lab_settings) == 0
    )
    _cold(lab, 2)
    events = _SilenceAt(lab, 2, match)
    res = provision(opts, small_settings, events)
    assert events.silenced is not None, f"worker-2 never reached {match!r}"
    rep = res.report
    assert rep["nodes"]["worker-2"]["status"] == "unreachable", rep["nodes"]["worker-2"]
    assert rep["nodes"]["worker-2"]["message"].startswith("silent for 15 s during")
    assert events.named - events.silenced < DEADLINE
    assert rep["nodes"]["worker-1"]["status"] in ("ok", "changed") and res.exit_code == 1
    labmod.silence_node(lab, 2, silent=False)  # healed: converges, parity holds
    assert api.provision(opts, small_settings) == 0
    assert (
        api.verify_parity(
            VerifyOptions(inventory=str(lab.inventory), limit=None, port=None), lab_settings
        )
        == 0
    )


def test_no_room_is_named_with_the_numbers_before_the_push(
    lab, small_settings, small, heal, capsys
):
    _cold(lab, 2)
    labmod.limit_space(lab, 2, WHEELHOUSE, "16m")
    try:
        code = _on_pair(lab, small_settings, small, json=True)
        rep = _json(capsys.readouterr().out)
    finally:
        labmod.limit_space(lab, 2, WHEELHOUSE, None)
    assert code == 1
    failed = [s for s in rep["nodes"]["worker-2"]["steps"] if s["status"] == "failed"]
    assert failed and failed[0]["message"].startswith(
        f"no space on /home/nodeprep/{WHEELHOUSE}: 16 MiB free"
    )
    assert "wheels needs" in failed[0]["message"]
    assert rep["nodes"]["worker-1"]["status"] in ("ok", "changed")
    # room again: the next run converges
    assert _on_pair(lab, small_settings, small) == 0


def test_a_read_only_home_is_named_as_such(lab, small_settings, small, heal, capsys):
    _cold(lab, 2)
    labmod.readonly_home(lab, 2)
    try:
        code = _on_pair(lab, small_settings, small, json=True)
        rep = _json(capsys.readouterr().out)
    finally:
        labmod.readonly_home(lab, 2, readonly=False)
    assert code == 1
    text = json.dumps(rep["nodes"]["worker-2"]).lower()
    assert "read-only file system" in text and "/home/nodeprep" in text, text
    assert _on_pair(lab, small_settings, small) == 0


# -- Ctrl-C: a real `invoke` process, SIGINT as a terminal sends it --------------------------------


def _invoke(lab, lab_settings, *args) -> subprocess.Popen:
    env = dict(
        os.environ,
        INVOKE_NODEPREP_STATE_DIR=lab_settings.state_dir,
        INVOKE_NODEPREP_LAB_ROOT=lab_settings.lab_root,
        PYTHONUNBUFFERED="1",
    )
    args = list(args)
    cut = args.index("--") if "--" in args else len(args)  # options before the payload's own
    args[cut:cut] = ["--inventory", str(lab.inventory)]
    return subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "invoke"), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _interrupt(proc: subprocess.Popen) -> tuple[int, float, str]:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, time.monotonic() - t0, out


def _wait_for(check, seconds: float, seen=None, every: float = 0.2) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return
        time.sleep(every)
    raise AssertionError(
        "the state to interrupt never came"
        + ("; output:\n" + "".join(seen)[-3000:] if seen else "")
    )


def _no_locks(lab, indexes) -> bool:
    out = [
        labmod.node_shell(lab, i, "ls -d /home/nodeprep/.nodeprep/lock 2>/dev/null").stdout
        for i in indexes
    ]
    return not any(o.strip() for o in out)


def _invoke_on_pair(lab, settings, sets) -> subprocess.Popen:
    """`invoke provision` of the small stack (SETS) on worker-[1-2], as _on_pair runs it."""
    sets_args = [arg for s in sets for arg in ("--set", s)]
    return _invoke(
        lab, settings, "provision", "--limit", "worker-[1-2]", "--roles", ROLES, *sets_args
    )


def test_ctrl_c_while_connecting_to_a_silent_node(lab, lab_settings, heal):
    labmod.silence_node(lab, 1)
    proc = _invoke(lab, lab_settings, "facts")
    time.sleep(3)
    code, took, out = _interrupt(proc)
    assert code == 130 and took < 3, out
    assert "worker-1  interrupted during facts: connecting to" in out
    assert "Traceback" not in out


def test_ctrl_c_while_waiting_on_a_silent_node_mid_provision(lab, small_settings, small, heal):
    sets = (*small, "wheelhouse_relay=false")
    _cold(lab, 2)
    proc = _invoke_on_pair(lab, small_settings, sets)
    venv = lab.nodes[2].home / VENV
    _wait_for(venv.exists, 240)  # worker-2 is in its apply
    labmod.silence_node(lab, 2)
    time.sleep(2)
    code, took, out = _interrupt(proc)
    assert code == 130 and took < 3, out
    assert "worker-2  interrupted during apply" in out and "Traceback" not in out
    assert _no_locks(lab, [1])  # the node that answers: released
    labmod.silence_node(lab, 2, silent=False)
    # healed: the next run takes over the lock the silent node kept (its holder is gone), stops
    # what the interrupted run left running there, replaces the venv it was making, converges
    assert _on_pair(lab, small_settings, sets) == 0


def test_ctrl_c_while_pushing_wheels(lab, small_settings, small, heal):
    sets = (*small, "wheelhouse_relay=false")
    _cold(lab, 2)
    proc = _invoke_on_pair(lab, small_settings, sets)
    wheelhouse = lab.nodes[2].home / WHEELHOUSE
    # 150 MB over the lab's veth: a push of about a second, so look often
    _wait_for(lambda: any(p.name.endswith(".part") for p in wheelhouse.glob(".*")), 240, every=0.01)
    code, took, out = _interrupt(proc)
    assert code == 130 and took < 3, out
    assert "worker-2  interrupted during apply" in out
    time.sleep(1)
    assert _no_locks(lab, [1, 2])
    # what was pushed whole stays; the next run completes the node
    assert _on_pair(lab, small_settings, sets) == 0


def test_ctrl_c_while_training(provisioned, lab, lab_settings, heal):
    """Training: every rank on every node stopped, within 3 s, nothing of the job left."""
    proc = _invoke(
        lab,
        lab_settings,
        "train",
        "--limit",
        "worker-[0-1]",
        "--payload",
        "ddp",
        "--launcher",
        "torchrun",
        "--",
        "--epochs",
        "100",
        "--steps-per-epoch",
        "40",
        "--sleep-per-step",
        "0.1",
    )
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(proc.stdout), daemon=True)
    reader.start()
    _wait_for(lambda: any("rank 1 epoch 0 step" in line for line in seen), 120, seen)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    took = time.monotonic() - t0
    reader.join(5)
    out = "".join(seen)
    assert proc.returncode == 130 and took < 3, out[-3000:]
    assert "FAILED: interrupted (Ctrl-C)" in out and "0 processes left on 2 node(s)" in out
