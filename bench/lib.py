"""Shared benchmark helpers: a lab of its own for each bench, interleaved timed runs, medians.

Benches time whole commands as a user runs them (process start included), alternate the
contenders inside every round so machine noise hits both alike, and print medians + ratios.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from nodeprep import lab  # noqa: E402
from nodeprep.settings import Settings  # noqa: E402

VENV = ROOT / ".venv" / "bin"


def bench_settings(state: Path) -> Settings:
    """Settings with state dir STATE, rooted at this repository (its inventory/ and roles/,
    whatever the current directory)."""
    return Settings(state_dir=str(state), project_root=str(ROOT))


def bench_lab(nodes: int, name: str = "bench", **options):
    """Bring up lab NAME with NODES nodes; state (known_hosts, runs) kept apart from the
    project's. OPTIONS: more lab.UpOptions fields (shared_home=True...). Returns (LabInfo,
    Settings, env for child `invoke` processes)."""
    state = ROOT / ".nodeprep" / f"bench-{name}"
    settings = bench_settings(state)
    info = lab.up(
        nodes,
        name=name,
        settings=settings,
        options=lab.UpOptions(inventory_dir=state / "inventory", **options),
        log=lambda *a: None,
    )
    env = dict(os.environ, INVOKE_NODEPREP_STATE_DIR=str(state))
    return info, settings, env


def bench_lab_down(name: str = "bench") -> None:
    state = ROOT / ".nodeprep" / f"bench-{name}"
    lab.down(name, settings=bench_settings(state), log=lambda *a: None)
    forget_controller_block(state / "inventory" / "hosts.yml")


def rsync_all(info, settings, nodes: int, args: list[str], dest: str) -> float:
    """`rsync -a ARGS node:DEST` to the first NODES nodes of lab INFO at once, over ssh with
    the lab's pinned host keys: seconds until the last one is done (SystemExit if one fails)."""
    procs = []
    t0 = time.perf_counter()
    for node in info.nodes[:nodes]:
        ssh = (
            f"ssh -F none -o BatchMode=yes -o StrictHostKeyChecking=yes "
            f"-o UserKnownHostsFile={settings.known_hosts} -o IdentitiesOnly=yes "
            f"-i {info.key} -p {node.port}"
        )
        argv = ["rsync", "-a", "--mkpath", "-e", ssh, *args]
        argv.append(f"{info.user}@{node.address}:{dest}")
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    errs = [p.communicate()[1] for p in procs]
    took = time.perf_counter() - t0
    if any(p.returncode for p in procs):
        raise SystemExit(f"bench: rsync failed: {errs[0][-300:]!r}")
    return took


def mesh(info, settings) -> None:
    """The cluster key and pinned host keys on every node of lab INFO (provision's ssh_keys and
    ssh_config roles): what node-to-node chains log in with."""
    from nodeprep.commands import provision
    from nodeprep.commands.options import ProvisionOptions
    from nodeprep.engine.events import Events

    opts = ProvisionOptions(inventory=str(info.inventory), roles="ssh_keys,ssh_config")
    if provision.provision(opts, settings, Events()).exit_code:
        raise SystemExit("bench: the mesh could not be provisioned")


def forget_controller_block(inventory: Path, config: Path = Path("~/.ssh/config")) -> None:
    """Remove the blocks the ssh_config role wrote for INVENTORY into the controller's ssh
    config (lab.down does it too): a torn-down bench lab's `Host worker-N` entries would
    otherwise conflict with the next inventory that names its nodes alike."""
    from nodeprep.lab.host import forget_ssh_blocks

    forget_ssh_blocks(inventory, ROOT, config)


def timed(cmd: list[str], env=None, check=True, verify=None) -> float:
    """Seconds CMD took. VERIFY(output): called after the clock stops with stdout + stderr
    (stdout is kept only then), raises if the run did not do what the bench assumes."""
    t0 = time.perf_counter()
    r = subprocess.run(
        cmd,
        env=env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        stdout=subprocess.PIPE if verify else subprocess.DEVNULL,
    )
    dt = time.perf_counter() - t0
    if check and r.returncode != 0:
        raise SystemExit(
            f"bench: {' '.join(cmd)} failed ({r.returncode}): {r.stderr[-500:]}"
            f"{(r.stdout or '')[-1500:]}"
        )
    if verify:
        verify(r.stdout + r.stderr)
    return dt


def rounds(
    contenders: dict[str, list[str]], n: int, env=None, verify: dict | None = None
) -> dict[str, list[float]]:
    """Run every contender once to warm caches, then N interleaved rounds. VERIFY: optional
    {contender: function(output)} checked after every run of that contender (see timed)."""
    verify = verify or {}
    for k, cmd in contenders.items():
        timed(cmd, env, verify=verify.get(k))
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(n):
        for k, cmd in contenders.items():
            times[k].append(timed(cmd, env, verify=verify.get(k)))
    return times


def summary(title: str, times: dict[str, list[float]], base: str) -> dict:
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{title}")
    for k, v in times.items():
        ratio = med[k] / med[base]
        print(
            f"  {k:<34} median {med[k]:6.3f} s   x{ratio:4.2f} vs {base}   "
            f"runs: {' '.join(f'{t:.3f}' for t in v)}"
        )
    return {"title": title, "medians": med, "runs": times, "base": base}


def save(name: str, results: list[dict]) -> Path:
    """Write RESULTS under bench/results/ (and to $BENCH_OUT when set: bench/guard.py reads it)."""
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    path = out / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    text = json.dumps(results, indent=2) + "\n"
    path.write_text(text)
    if os.environ.get("BENCH_OUT"):
        Path(os.environ["BENCH_OUT"]).write_text(text)
    print(f"\nsaved {path.relative_to(ROOT)}")
    return path


class Foreign:
    """Mean number of running processes outside this bench (not in a bench-lab netns, not
    under this process), sampled every 0.5 s: other engineers share this machine's cores."""

    def __init__(self):
        self.samples, self.stop = [], threading.Event()

    def _count(self):
        ours = set()
        for ns in Path("/run/netns").glob("np-bench-*"):
            try:
                ours.add(ns.stat().st_ino)
            except OSError:
                pass
        me, procs = os.getpid(), {}
        for d in filter(str.isdigit, os.listdir("/proc")):
            try:
                fields = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
                net = os.stat(f"/proc/{d}/ns/net").st_ino
            except (OSError, ValueError, IndexError):
                continue
            procs[int(d)] = (fields[0], int(fields[1]), net)

        def mine(pid):
            while pid > 1:
                if pid == me:
                    return True
                pid = procs.get(pid, (0, 0))[1]
            return False

        return sum(
            st == "R" and net not in ours and not mine(pid) for pid, (st, _pp, net) in procs.items()
        )

    def __enter__(self):
        def loop():
            while not self.stop.wait(0.5):
                self.samples.append(self._count())

        self.t = threading.Thread(target=loop, daemon=True)
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join()

    @property
    def mean(self):
        return sum(self.samples) / max(1, len(self.samples))
