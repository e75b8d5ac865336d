"""Container image distribution (issue 45): the image to N lab nodes through the relay chain,
against the controller sending the archive to each node itself. Target: relay / direct <= 0.6
at 8 nodes.

A lab "img" with --containers (rootless Podman on every node), each node's link limited both
ways to RATE (tc on its veth) and the controller's own uplink to CTRL_RATE (tc on the lab
bridge's egress: what the controller sends to any node leaves through it, node-to-node traffic
is forwarded past it), as on a cluster whose login node has one link like the nodes'. The image
is the lab's test image (Debian 12 + Python, 221 MB, lab/images.py). Before every timed run the
image is removed from every node (`podman rmi -a -f`), so each run is cold:
  relay:  `invoke provision --roles ssh_keys,container` (the mesh in place: the chain)
  direct: `invoke provision --roles container` (no mesh in the run: the controller pushes)
  loads:  the floor: the archive already in every node's home (copied untimed), every node's
          `podman load` and keep-id warm-up at once over ssh, as nodeprep's load step runs
          them; relay - loads and direct - loads are what distribution itself costs
Each run is checked: every node changed its image step, and under relay the controller sent
one copy (the report's controller_bytes). Medians of RUNS, interleaved.
Usage: bench/image_bench.py [NODES=8] [RUNS=3]   (env RATE=200mbit CTRL_RATE=RATE)
"""

import json
import os
import shutil
import subprocess
import sys
import time

from lib import ROOT, VENV, bench_lab, bench_lab_down, save, summary
from nodeprep.lab import images  # noqa: E402  (lib puts src/ on the path)
from nodeprep.lab.config import bridge_name  # noqa: E402
from nodeprep.ops.container import archive  # noqa: E402

NAME = "img"
nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 8
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
rate = os.environ.get("RATE", "200mbit")
ctrl_rate = os.environ.get("CTRL_RATE", rate)
STATE = ROOT / ".nodeprep" / f"bench-{NAME}"


def command(info, image, roles: str) -> list[str]:
    cmd = [str(VENV / "invoke"), "provision", "--inventory", str(info.inventory), "--json"]
    sets = [
        f"container_image={image}",
        f"controller_key={STATE}/ctl/id",
        f"controller_ssh_config={STATE}/ctl/config",
    ]
    for s in sets:
        cmd += ["--set", s]
    return cmd + ["--roles", roles]


def on_every_node(info, settings, command: str) -> list[int]:
    """COMMAND on every node at once over ssh; the exit codes."""
    procs = [
        subprocess.Popen(
            [
                "ssh",
                "-i",
                str(info.key),
                "-o",
                "BatchMode=yes",
                "-o",
                f"UserKnownHostsFile={settings.known_hosts}",
                f"{info.user}@{n.address}",
                command,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for n in info.nodes
    ]
    return [p.wait() for p in procs]


def clear(info, settings) -> None:
    on_every_node(info, settings, "podman rmi -a -f >/dev/null 2>&1; true")


def loads(info, settings, image, image_id: str) -> float:
    """The floor: every node loads the archive already in its home (as the role's load step:
    load, inspect, the keep-id warm-up container)."""
    for n in info.nodes:
        dest = n.home / "np-lab.tar"
        shutil.copyfile(image, dest)
        os.chown(dest, n.home.stat().st_uid, n.home.stat().st_gid)
    warm = f"podman run --rm --userns keep-id --network none --entrypoint true {image_id}"
    t0 = time.perf_counter()
    codes = on_every_node(
        info,
        settings,
        f"podman load -q -i np-lab.tar >/dev/null && rm -f np-lab.tar && "
        f"podman image inspect {image_id} >/dev/null && {warm} >/dev/null",
    )
    dt = time.perf_counter() - t0
    if any(codes):
        raise SystemExit(f"bench: a node's load failed: {codes}")
    return dt


def run(cmd, env, relayed: bool, size: int) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"bench: {' '.join(cmd)} failed: {r.stderr[-800:]}")
    report = json.loads(r.stdout)
    for node, res in report["nodes"].items():
        steps = [s for s in res["steps"] if s["step"].startswith("container: container.image")]
        if not steps or steps[0]["status"] != "changed":
            raise SystemExit(f"bench: {node} did not load the image: {res}")
    if relayed:
        sent = sum(
            (res.get("container_image") or {}).get("controller_bytes", 0)
            for res in report["nodes"].values()
        )
        if not size <= sent < 1.05 * size:
            raise SystemExit(f"bench: the controller sent {sent} bytes for a {size}-byte image")
    return dt


def main() -> None:
    image = images.docker_archive(images.base_root(), STATE / "np-lab.tar", "localhost/np-lab:1")
    size = image.stat().st_size
    info, settings, env = bench_lab(nodes, NAME, containers=True, link_rate=rate)
    bridge = bridge_name(NAME)
    subprocess.run(
        [
            "tc",
            "qdisc",
            "replace",
            "dev",
            bridge,
            "root",
            "tbf",
            "rate",
            ctrl_rate,
            "burst",
            "256k",
            "latency",
            "400ms",
        ],
        check=True,
    )
    try:
        contenders = {
            "relay (chain)": (command(info, image, "ssh_keys,container"), True),
            "direct (controller to each)": (command(info, image, "container"), False),
        }
        floor = "loads only (archive already on each node)"
        image_id = archive.read(image).id
        subprocess.run(contenders["relay (chain)"][0], env=env, cwd=ROOT, capture_output=True)
        times: dict[str, list[float]] = {k: [] for k in [*contenders, floor]}
        for i in range(runs):
            order = [*contenders, floor]
            order = order if i % 2 == 0 else list(reversed(order))
            for k in order:
                clear(info, settings)
                if k == floor:
                    times[k].append(loads(info, settings, image, image_id))
                else:
                    cmd, relayed = contenders[k]
                    times[k].append(run(cmd, env, relayed, size))
                print(f"  round {i + 1}: {k} {times[k][-1]:.2f} s", flush=True)
        res = summary(
            f"image {size / 1e6:.0f} MB to {nodes} nodes, links {rate}, controller {ctrl_rate}",
            times,
            "direct (controller to each)",
        )
        med = res["medians"]
        relay, direct, base = med["relay (chain)"], med["direct (controller to each)"], med[floor]
        ratio = relay / direct
        print(
            f"  relay / direct: x{ratio:.2f} (issue 45's target <= 0.6: "
            f"{'met' if ratio <= 0.6 else 'NOT met'})"
        )
        moved = (relay - base) / (direct - base) if direct > base else float("nan")
        print(
            f"  past the loads (relay - loads) / (direct - loads): "
            f"{relay - base:.1f} s / {direct - base:.1f} s = x{moved:.2f}"
        )
        res.update(
            nodes=nodes,
            rate=rate,
            ctrl_rate=ctrl_rate,
            image_bytes=size,
            ratio=ratio,
            floor_s=base,
            ratio_past_loads=moved,
        )
        print(f"saved {save(f'image-{nodes}', [res])}")
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", bridge, "root"], capture_output=True)
        bench_lab_down(NAME)


if __name__ == "__main__":
    main()
