"""The Python stack (roles wheelhouse,venv,torch) provisioned cold on N lab nodes, against the
floor a user typing commands gets: in parallel per node, `scp -r` of the controller's platform
wheelhouse, `python3 -m venv` + `pip install --no-index` of its lock, `import torch`. The
controller's cache (wheelhouse download, deepspeed build) is warmed first and left out of
the timed part (its time is reported apart). Issue target: nodeprep at most 15 % slower.
Then, with FRESH controller state dirs, cold runs on 2 and on 4 nodes: the wheelhouse must
download once per platform whatever the node count, and a second run download and push
nothing. Usage: bench/pystack_bench.py [NODES=2] [RUNS=3]"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lib import ROOT, VENV, Foreign, bench_lab, bench_lab_down, bench_settings, save, summary
from nodeprep import lab

ROLES = "wheelhouse,venv,torch"
TORCH = "2.13.0+cpu"
TARGET = 15.0
nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 2
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3


def log(msg):
    print(msg, flush=True)


def wipe(info, n):
    """Remove ~/.nodeprep/{venv,wheelhouse} of the first N nodes (on the host fs), keep
    ~/.nodeprep."""
    for node in info.nodes[:n]:
        base = node.home / ".nodeprep"
        for d in ("venv", "wheelhouse"):
            shutil.rmtree(base / d, ignore_errors=True)
        if not base.exists():
            base.mkdir(mode=0o700)
            st = node.home.stat()
            os.chown(base, st.st_uid, st.st_gid)


def provision_cmd(info, tmp):
    return [
        str(VENV / "invoke"),
        "provision",
        "--inventory",
        str(info.inventory),
        "--roles",
        ROLES,
        "--set",
        f"controller_key={tmp / 'id_ed25519'}",
        "--set",
        f"controller_ssh_config={tmp / 'config'}",
    ]


def run_provision(cmd, env):
    """Run CMD (whole process), timestamping its status lines. Returns (seconds, phases, output).
    Phases from the plain display's per-node lines: facts, controller (after the last `facts:`
    line, before the first `plan:` line: the wheelhouse/torch controller steps), plan+apply,
    exit."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = [(time.perf_counter() - t0, ln) for ln in p.stdout]
    rc = p.wait()
    dt = time.perf_counter() - t0
    out = "".join(ln for _, ln in lines)
    if rc:
        raise SystemExit(f"bench: {' '.join(cmd)} failed ({rc}):\n{out[-3000:]}")

    def at(stage):
        return [t for t, ln in lines if re.match(rf"\S+\s+{stage}: ", ln)]

    f_end, p_start, a_end = max(at("facts")), min(at("plan")), max(at("apply") or at("plan"))
    return (
        dt,
        {
            "facts": f_end,
            "controller": p_start - f_end,
            "plan+apply": a_end - p_start,
            "exit": dt - a_end,
        },
        out,
    )


def report(state):
    return json.loads((state / "runs" / "latest" / "report.json").read_text())


def downloads(rep):
    """{platform: number of `wheelhouse.download` entries that downloaded (status changed)},
    and how many entries there were per platform."""
    got, entries = {}, {}
    for c in rep["controller"]:
        if c["step"].startswith("wheelhouse.download "):
            plat = c["step"].split(" ", 1)[1]
            entries[plat] = entries.get(plat, 0) + 1
            got[plat] = got.get(plat, 0) + (c["status"] == "changed")
    return got, entries


def changed_steps(rep, prefix):
    return sum(
        s["status"] == "changed"
        for r in rep["nodes"].values()
        for s in r.get("steps", [])
        if s["step"].split(": ", 1)[-1].startswith(prefix)
    )


def check_cold(rep, n, cached):
    """Every node changed (pushed, installed, verified torch), nothing failed; the controller
    took its wheelhouse from the cache when CACHED."""
    bad = {
        k: r.get("message") or r["status"]
        for k, r in rep["nodes"].items()
        if r["status"] != "changed"
    }
    if bad or rep["failed"] or rep["unreachable"] or len(rep["nodes"]) != n:
        raise SystemExit(f"bench: cold provision did not change every node: {bad or rep}")
    for prefix in ("wheelhouse.sync", "pip.install", "torch.verify"):
        if changed_steps(rep, prefix) != n:
            raise SystemExit(f"bench: {prefix} did not change on all {n} nodes: {rep['nodes']}")
    got, _ = downloads(rep)
    if cached and any(got.values()):
        raise SystemExit(f"bench: the timed run downloaded wheels: {rep['controller']}")


def ssh_opts(settings, info):
    return [
        "-F",
        "/dev/null",
        "-i",
        str(info.key),
        "-o",
        f"UserKnownHostsFile={settings.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
    ]


def sh(cmd, stdin=None):
    r = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(
            f"{' '.join(cmd[:2])} ... {cmd[-1][:120]} failed ({r.returncode}): {r.stderr[-800:]}"
        )
    return r.stdout


def bare(info, settings, house: Path, n):
    """By hand, one thread per node; returns (seconds, {phase: slowest node's seconds})."""
    opts = ssh_opts(settings, info)
    t0 = time.perf_counter()
    lock = "\n".join(json.loads((house / "MANIFEST.json").read_text())["lock"]) + "\n"

    def one(node):
        dest, ph, t = f"{info.user}@{node.address}", {}, time.perf_counter()
        sh(["scp", "-q", "-r", *opts, str(house), f"{dest}:.nodeprep/wheelhouse"])
        ph["scp"], t = time.perf_counter() - t, time.perf_counter()
        sh(
            [
                "ssh",
                *opts,
                dest,
                "cat > ~/.nodeprep/wheelhouse/requirements.lock && "
                "python3 -m venv ~/.nodeprep/venv && "
                "~/.nodeprep/venv/bin/pip install -q --no-index "
                "--find-links ~/.nodeprep/wheelhouse -r ~/.nodeprep/wheelhouse/requirements.lock",
            ],
            lock,
        )
        ph["venv+pip"], t = time.perf_counter() - t, time.perf_counter()
        got = sh(
            [
                "ssh",
                *opts,
                dest,
                "~/.nodeprep/venv/bin/python -c 'import torch; "
                "print(torch.__version__, torch.version.cuda)'",
            ]
        ).split()
        ph["import torch"] = time.perf_counter() - t
        if got != [TORCH, "None"]:
            raise RuntimeError(f"{node.name}: torch {got}, want {TORCH} (cuda None)")
        return ph

    with ThreadPoolExecutor(n) as pool:
        phases = list(pool.map(one, info.nodes[:n]))
    dt = time.perf_counter() - t0
    return dt, {k: max(p[k] for p in phases) for k in phases[0]}


def fmt(ph):
    return ", ".join(f"{k} {v:.1f}" for k, v in ph.items())


def part1(info, settings, env, tmp):
    state = Path(settings.state_dir)
    cmd = provision_cmd(info, tmp)
    log(f"pystack bench: {nodes} nodes, {runs} rounds; warming the controller cache ({state})")
    wipe(info, nodes)
    dt, ph, _ = run_provision(cmd, env)
    rep = report(state)
    check_cold(rep, nodes, cached=False)
    got, _ = downloads(rep)
    warm = {"seconds": dt, "phases": ph, "downloaded": got}
    log(
        f"  warm-up provision {dt:.1f} s ({fmt(ph)}); "
        f"controller-side prep {ph['controller']:.1f} s, "
        f"wheelhouse downloaded: {got}"
    )
    plats = [p for p in (state / "wheelhouse").iterdir() if (p / "MANIFEST.json").exists()]
    if len(plats) != 1:
        raise SystemExit(f"bench: expected one platform wheelhouse, found {plats}")
    house = plats[0]
    names = ["invoke provision (cold nodes)", "bare scp + venv + pip (parallel)"]
    times = {k: [] for k in names}
    phases = {k: [] for k in names}
    foreign = {k: [] for k in names}
    for i in range(runs):
        for k in names if i % 2 == 0 else names[::-1]:
            wipe(info, nodes)
            with Foreign() as fg:
                if k == names[0]:
                    dt, ph, _ = run_provision(cmd, env)
                else:
                    dt, ph = bare(info, settings, house, nodes)
            if k == names[0]:
                check_cold(report(state), nodes, cached=True)
            times[k].append(dt)
            phases[k].append(ph)
            foreign[k].append(fg.mean)
            log(
                f"  round {i + 1}: {k:<34} {dt:6.1f} s  ({fmt(ph)}; foreign running procs "
                f"{fg.mean:.2f})"
            )
    res = summary(
        f"cold Python stack ({ROLES}) on {nodes} lab nodes, {runs} interleaved rounds "
        "(controller cache warm; node venv+wheelhouse wiped before every run)",
        times,
        names[1],
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    over = (med[names[0]] / med[names[1]] - 1) * 100
    log(
        f"  nodeprep overhead over bare: {over:+.1f} % (target <= {TARGET:.0f} %: "
        f"{'met' if over <= TARGET else 'NOT met'})"
    )
    for k in names:
        log(
            f"  {k} median phases: "
            + fmt({p: statistics.median(x[p] for x in phases[k]) for p in phases[k][0]})
        )
    res.update(
        overhead_pct=over,
        target_pct=TARGET,
        warmup=warm,
        phases=phases,
        foreign=foreign,
        wheels=len(json.loads((house / "MANIFEST.json").read_text())["files"]),
        wheelhouse_mb=sum(f.stat().st_size for f in house.iterdir()) / 1e6,
    )
    return res


def part2(tmp):
    """Fresh controller state per node count; cold nodes; then a second run."""
    out = {}
    for n in (2, 4):
        state = tmp / f"fresh-state-{n}"
        settings = bench_settings(state)
        info = lab.up(
            n,
            name="bench",
            settings=settings,
            options=lab.UpOptions(inventory_dir=state / "inventory"),
            log=lambda *a: None,
        )
        env = dict(os.environ, INVOKE_NODEPREP_STATE_DIR=str(state))
        wipe(info, n)
        cmd = provision_cmd(info, tmp)
        dt, ph, _ = run_provision(cmd, env)
        rep = report(state)
        check_cold(rep, n, cached=False)
        got, entries = downloads(rep)
        dt2, ph2, _ = run_provision(cmd, env)
        rep2 = report(state)
        got2, _ = downloads(rep2)
        pushes2 = changed_steps(rep2, "wheelhouse.sync")
        plats = sorted(
            p.name for p in (state / "wheelhouse").iterdir() if (p / "MANIFEST.json").exists()
        )
        out[n] = {
            "cold_seconds": dt,
            "cold_phases": ph,
            "downloads": got,
            "download_entries": entries,
            "platform_dirs": plats,
            "second_seconds": dt2,
            "second_downloads": got2,
            "second_sync_changed": pushes2,
            "second_changed_steps": rep2["changed"],
        }
        ok = (
            all(v == 1 for v in got.values())
            and not any(got2.values())
            and not pushes2
            and len(rep2["nodes"]) == n
            and all(r["status"] == "ok" for r in rep2["nodes"].values())
        )
        log(
            f"  fresh state, {n} nodes: cold {dt:.1f} s (first-time controller prep "
            f"{ph['controller']:.1f} s; {fmt(ph)}); downloads per platform {got} "
            f"(entries {entries}); second run {dt2:.1f} s: downloads {got2}, wheelhouse.sync "
            f"changed {pushes2}, node steps changed {rep2['changed']} -> "
            f"{'once per platform, then nothing: met' if ok else 'NOT met'}"
        )
        out[n]["met"] = ok
    return out


def main():
    tmp = Path(tempfile.mkdtemp(prefix="nodeprep-pystack-"))
    info = None
    try:
        info, settings, env = bench_lab(nodes)
        res = part1(info, settings, env, tmp)
        log("\ndownloads per platform (fresh controller state dirs, cold nodes):")
        res2 = part2(tmp)
    finally:
        try:
            now = lab.status("bench", bench_settings(ROOT / ".nodeprep" / "bench-bench"))
            if now:
                wipe(now, len(now.nodes))  # ~1 GB per node: do not leave it in the lab homes
        finally:
            bench_lab_down()
            shutil.rmtree(tmp, ignore_errors=True)
    save(f"pystack-{nodes}", [res, {"title": "downloads per platform", "by_nodes": res2}])


if __name__ == "__main__":
    main()
