"""What reading an inventory through the user's ssh config costs (issue 34), whole processes,
interleaved rounds, medians:

1. listing: `invoke inventory --inventory sshconfig:FILE --json` for a config of N aliases
   (300 by default; Host blocks spread over an included directory, a `Host *` block), against
   the same N hosts from a native hosts.yml, and against the bare floor: `ssh -G` for each
   alias one after the other (what reading them with OpenSSH costs without nodeprep);
2. a no-op `invoke facts` on a lab of M nodes (64 by default) read through `sshconfig:FILE`
   (the controller config `provision --roles ssh_keys,ssh_config` writes for the lab), against
   the same nodes from the lab's hosts.yml.

Usage: bench/sshconfig_bench.py [ALIASES=300] [NODES=64] [RUNS=5] (NODES=0: listing only).
Results: bench/results/sshconfig-*.json."""

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from lib import ROOT, VENV, bench_lab, bench_lab_down, save, timed

aliases = int(sys.argv[1]) if len(sys.argv) > 1 else 300
nodes = int(sys.argv[2]) if len(sys.argv) > 2 else 64
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5


def write_configs(tmp: Path, n: int) -> tuple[Path, Path]:
    """(an ssh config of N aliases with includes, the same hosts as hosts.yml)."""
    ssh = tmp / "ssh"
    (ssh / "conf.d").mkdir(parents=True)
    groups = [list(range(i, min(i + 50, n))) for i in range(0, n, 50)]
    main = [
        "# bench config",
        "Host *",
        "    ServerAliveInterval 30",
        "    User ops",
        "",
        f"Include {ssh}/conf.d/*.conf",
        "",
    ]
    for g, members in enumerate(groups):
        text = "".join(
            f"Host node{i:04d}   # rack {g}\n    HostName 10.{g}.{i // 250}.{i % 250 + 1}\n"
            f"    Port {2200 + i % 3}\n"
            for i in members
        )
        (ssh / "conf.d" / f"rack{g:02d}.conf").write_text(text)
    config = ssh / "config"
    config.write_text("\n".join(main))
    config.chmod(0o600)
    hosts = tmp / "hosts.yml"
    hosts.write_text(
        "vars:\n  user: ops\nhosts:\n"
        + "".join(
            f"  node{i:04d}: {{address: 10.{i // 50}.{i // 250}.{i % 250 + 1}, "
            f"port: {2200 + i % 3}}}\n"
            for i in range(n)
        )
    )
    return config, hosts


def listed(expect: int):
    def check(output: str) -> None:
        got = json.JSONDecoder().raw_decode(output[output.index("{") :])[0]
        if len(got["hosts"]) != expect:
            raise SystemExit(f"bench: listed {len(got['hosts'])} hosts, expected {expect}")

    return check


def listing(tmp: Path) -> dict:
    config, hosts = write_configs(tmp, aliases)
    names = [f"node{i:04d}" for i in range(aliases)]
    floor = ["sh", "-c", f"for h in {' '.join(names)}; do ssh -G -F {config} $h >/dev/null; done"]
    cmds = {
        "sshconfig": [
            str(VENV / "invoke"),
            "inventory",
            "--inventory",
            f"sshconfig:{config}",
            "--json",
        ],
        "hosts.yml": [str(VENV / "invoke"), "inventory", "--inventory", str(hosts), "--json"],
        "ssh -G each, serially": floor,
    }
    times = {k: [] for k in cmds}
    for _ in range(runs):
        for k, cmd in cmds.items():
            times[k].append(timed(cmd, verify=None if k.startswith("ssh") else listed(aliases)))
    return {k: statistics.median(v) for k, v in times.items()}


def facts(tmp: Path) -> dict:
    info, settings, env = bench_lab(nodes, name="sshb")
    try:
        ctl = tmp / "ctl"
        ctl.mkdir()
        sets = ["--set", f"controller_key={ctl}/id", "--set", f"controller_ssh_config={ctl}/config"]
        subprocess.run(
            [
                str(VENV / "invoke"),
                "provision",
                "--inventory",
                str(info.inventory),
                "--roles",
                "ssh_keys,ssh_config",
                *sets,
            ],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
        )
        cmds = {
            "sshconfig": [
                str(VENV / "invoke"),
                "facts",
                "--inventory",
                f"sshconfig:{ctl}/config",
                "--json",
            ],
            "hosts.yml": [
                str(VENV / "invoke"),
                "facts",
                "--inventory",
                str(info.inventory),
                "--json",
            ],
        }
        times = {k: [] for k in cmds}
        for _ in range(runs):
            for k, cmd in cmds.items():
                times[k].append(timed(cmd, env=env, verify=listed_facts(nodes)))
        return {k: statistics.median(v) for k, v in times.items()}
    finally:
        bench_lab_down("sshb")


def listed_facts(expect: int):
    def check(output: str) -> None:
        got = json.JSONDecoder().raw_decode(output[output.index("{") :])[0]
        ok = [n for n, r in got["nodes"].items() if r["status"] == "ok"]
        if len(ok) != expect:
            raise SystemExit(f"bench: facts answered on {len(ok)} of {expect} nodes")

    return check


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        out = {"aliases": aliases, "runs": runs, "listing": listing(Path(d))}
        lst = out["listing"]
        print(
            f"listing {aliases} aliases (medians of {runs}): sshconfig: {lst['sshconfig']:.2f} s, "
            f"hosts.yml {lst['hosts.yml']:.2f} s ({lst['sshconfig'] / lst['hosts.yml']:.2f}x), "
            f"ssh -G one by one {lst['ssh -G each, serially']:.2f} s"
        )
        if nodes:
            out["nodes"] = nodes
            out["facts"] = f = facts(Path(d))
            print(
                f"no-op facts on {nodes} lab nodes: sshconfig: {f['sshconfig']:.2f} s, hosts.yml "
                f"{f['hosts.yml']:.2f} s ({f['sshconfig'] / f['hosts.yml']:.2f}x)"
            )
    save("sshconfig", out)


if __name__ == "__main__":
    main()
