"""No-op `invoke provision --roles ssh_keys,ssh_config,shell,nccl,deepspeed_env` on N lab nodes
against an Ansible playbook and a pyinfra deploy that manage the same files with the same
content and modes (read back from what nodeprep wrote), all three already converged, so every
timed run must change nothing: checked after every run (nodeprep's report.json, Ansible's
PLAY RECAP, pyinfra's per-host summary). Issue targets: >= 5x faster than Ansible, >= 2x faster
than pyinfra. Usage: bench/provision_bench.py [NODES=8] [RUNS=5]"""

import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import peers
from lib import VENV, bench_lab, bench_lab_down, rounds, save, summary

ROLES = "ssh_keys,ssh_config,shell,nccl,deepspeed_env"
nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 8
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5


def converge(label, cmd, env, verify=None):
    """One untimed run; VERIFY(output) tells what it changed."""
    r = subprocess.run(cmd, env=env, cwd=peers.ROOT, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(
            f"bench: first {label} run failed ({r.returncode}):\n"
            f"{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
        )
    print(f"  first {label} run: {verify(r.stdout + r.stderr) if verify else 'ok'}", flush=True)


def nodeprep_noop(state: Path, n_nodes: int):
    """From the run's report.json (runs/latest): every node and every controller step ok."""

    def check(_output, quiet=False):
        report = json.loads((state / "runs" / "latest" / "report.json").read_text())
        ctl = [c for c in report["controller"] if c["status"] != "ok"]
        if quiet:
            return f"{report['changed']} changed on the nodes, {len(ctl)} on the controller"
        bad = {n: r for n, r in report["nodes"].items() if r["status"] != "ok" or r["changed"]}
        if report["changed"] or bad or ctl or len(report["nodes"]) != n_nodes:
            raise SystemExit(f"bench: nodeprep run was not a no-op: {bad or ctl or report}")

    return check


def ansible_noop(n_hosts: int):
    def check(stdout, quiet=False):
        recap = re.findall(
            r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)",
            stdout,
            re.M,
        )
        changed = sum(int(c) for _, _, c, _, _ in recap)
        if quiet:
            return f"changed={changed} over {len(recap)} hosts"
        if len(recap) != n_hosts or changed or any(int(u) or int(f) for *_, u, f in recap):
            raise SystemExit(f"bench: Ansible run was not a no-op:\n{stdout[-3000:]}")

    return check


def main():
    abin, pbin = peers.venv("ansible"), peers.venv("pyinfra")
    versions = {t: peers.version(t) for t in ("ansible", "pyinfra")}
    tmp = Path(tempfile.mkdtemp(prefix="nodeprep-bench-"))
    try:
        info, settings, env = bench_lab(nodes)
        state = Path(settings.state_dir)
        peers.prepare_out()
        env = dict(
            env,
            ANSIBLE_CONFIG=str(peers.OUT / "ansible" / "ansible.cfg"),
            ANSIBLE_HOME=str(peers.OUT / "ansible" / "home"),
            ANSIBLE_NOCOLOR="1",
        )
        key, config = tmp / "id_ed25519", tmp / "config"
        provision = [
            str(VENV / "invoke"),
            "provision",
            "--inventory",
            str(info.inventory),
            "--roles",
            ROLES,
            "--set",
            f"controller_key={key}",
            "--set",
            f"controller_ssh_config={config}",
        ]
        print(
            f"provision bench: {nodes} nodes, {runs} runs; ansible-core {versions['ansible']}, "
            f"pyinfra {versions['pyinfra']}",
            flush=True,
        )
        converge(
            "nodeprep", provision, env, lambda out: nodeprep_noop(state, nodes)(out, quiet=True)
        )
        end = peers.end_state(info, config)
        keys = [key, state / "cluster_key" / "id_ed25519"]
        cfg, playbook = peers.write_ansible(info, settings.known_hosts, end, keys)
        inv, deploy = peers.write_pyinfra(info, settings.known_hosts, end, keys)
        ansible = [str(abin / "ansible-playbook"), str(playbook)]
        pyinfra = [str(pbin / "pyinfra"), "-y", str(inv), str(deploy)]
        checks = {
            "invoke provision (no-op)": nodeprep_noop(state, nodes),
            f"Ansible {versions['ansible']} playbook": ansible_noop(nodes + 1),
            f"pyinfra {versions['pyinfra']} deploy": peers.pyinfra_noop(nodes + 1),
        }
        names = list(checks)
        # Converge each peer (a no-op already if they write exactly what nodeprep wrote),
        # then nodeprep once more, to be sure the peers left nothing it would change back.
        converge("Ansible", ansible, env, lambda out: checks[names[1]](out, quiet=True))
        converge("pyinfra", pyinfra, env, lambda out: checks[names[2]](out, quiet=True))
        converge(
            "nodeprep (after peers)",
            provision,
            env,
            lambda out: checks[names[0]](out) or "no change (verified)",
        )
        times = rounds(dict(zip(names, [provision, ansible, pyinfra])), runs, env, verify=checks)
    finally:
        bench_lab_down()
        shutil.rmtree(tmp, ignore_errors=True)
    res = summary(
        f"no-op provision ({ROLES}) on {nodes} lab nodes, {runs} interleaved runs "
        "(whole processes; every run verified to change nothing)",
        times,
        names[0],
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, target in ((names[1], 5), (names[2], 2)):
        x = med[k] / med[names[0]]
        print(
            f"  nodeprep is {x:.2f}x faster than {k} (target >= {target}x: "
            f"{'met' if x >= target else 'NOT met'})"
        )
    res["versions"] = versions
    save(f"provision-{nodes}", [res])


main()
