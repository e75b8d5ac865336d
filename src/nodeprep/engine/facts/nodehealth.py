"""Node health facts, the parts of a node a multi-node job needs besides its GPUs: memory,
/dev/shm, the user's limits (locked memory, open files), the clock and its sync daemon, the
RDMA ports (/sys/class/infiniband: InfiniBand, RoCE and EFA alike) and each network
interface's speed and MTU. Judged in ops/health/; only shell builtins and /proc, /sys reads
where they do (one probe costs the node a few execs)."""

from __future__ import annotations

import re

from nodeprep.engine.facts.probe import Fact

# -- LIMITS ------------------------------------------------------------------------------------

LIMITS_PROBE = (
    'echo "memlock $(ulimit -l)"\n'
    'echo "nofile $(ulimit -n)"\n'
    "while read -r k v _; do\n"
    '  case $k in MemAvailable:|MemTotal:) echo "$k $v";; esac\n'
    "done < /proc/meminfo\n"
    "LC_ALL=C df -Pk /dev/shm 2>/dev/null | tail -n 1 | {\n"
    "  read -r _d size _u free _r\n"
    '  echo "shm ${size:-none} ${free:-none}"\n'
    "}"
)


def _kib(v: str) -> int | None:
    """A limit in KiB, None for unlimited."""
    return None if v == "unlimited" else int(v)


def parse_limits(text: str, rc: int) -> dict:
    """{memlock_kib (None: unlimited), nofile (None: unlimited), mem_total_kib,
    mem_available_kib, shm_kib (None: no /dev/shm), shm_free_kib}."""
    vals = {}
    for line in text.strip().splitlines():
        parts = line.split()
        if parts:
            vals[parts[0].rstrip(":")] = parts[1:]
    shm = vals.get("shm", ["none", "none"])
    return {
        "memlock_kib": _kib(vals["memlock"][0]),
        "nofile": _kib(vals["nofile"][0]),
        "mem_total_kib": int(vals["MemTotal"][0]),
        "mem_available_kib": int(vals["MemAvailable"][0]),
        "shm_kib": None if shm[0] == "none" else int(shm[0]),
        "shm_free_kib": None if shm[1] == "none" else int(shm[1]),
    }


LIMITS = Fact("limits", lambda _v: LIMITS_PROBE, parse_limits)


# -- CLOCK -------------------------------------------------------------------------------------

# The node's time (read as the probe passes: the controller brackets the probe with its own
# clock), and which time-sync daemon runs (a process list: works with or without systemd).
# (/proc/PID/comm holds 15 characters: systemd-timesyncd is `systemd-timesyn` there)
SYNC_DAEMONS = ("chronyd", "ntpd", "systemd-timesyn", "ptp4l", "phc2sys", "openntpd", "timemaster")
CLOCK_PROBE = (
    'echo "now $(date +%s.%N)"\n'
    "for np_p in /proc/[0-9]*/comm; do\n"
    '  IFS= read -r np_c < "$np_p" 2>/dev/null || continue\n'
    "  case $np_c in " + "|".join(SYNC_DAEMONS) + ') echo "sync $np_c";; esac\n'
    "done\n"
    "true"
)


def parse_clock(text: str, rc: int) -> dict:
    """{now: the node's epoch seconds, sync: [time-sync daemons running]}."""
    now, sync = None, []
    for line in text.strip().splitlines():
        if line.startswith("now "):
            try:
                now = float(line.split()[1])
            except (IndexError, ValueError):
                now = None
        elif line.startswith("sync "):
            name = line.split(None, 1)[1].strip()
            if name not in sync:
                sync.append(name)
    return {"now": now, "sync": sync}


CLOCK = Fact("clock", lambda _v: CLOCK_PROBE, parse_clock)


# -- RDMA_PORTS: /sys/class/infiniband ---------------------------------------------------------

RDMA_PROBE = (
    "for np_p in /sys/class/infiniband/*/ports/*; do\n"
    '  [ -d "$np_p" ] || continue\n'
    "  np_s=\n"
    "  np_r=\n"
    "  np_l=\n"
    "  np_ph=\n"
    '  IFS= read -r np_s < "$np_p/state" 2>/dev/null\n'
    '  IFS= read -r np_r < "$np_p/rate" 2>/dev/null\n'
    '  IFS= read -r np_l < "$np_p/link_layer" 2>/dev/null\n'
    '  IFS= read -r np_ph < "$np_p/phys_state" 2>/dev/null\n'
    "  printf '%s|%s|%s|%s|%s\\n' "
    '"${np_p#/sys/class/infiniband/}" "$np_s" "$np_r" "$np_l" "$np_ph"\n'
    "done\n"
    "true"
)


def parse_rdma(text: str, rc: int) -> list[dict]:
    """[{device, port, state ('ACTIVE', 'DOWN', ...), rate_gbps, rate, link_layer, phys_state}]:
    `mlx5_0/ports/1|4: ACTIVE|100 Gb/sec (4X EDR)|InfiniBand|5: LinkUp`."""
    out = []
    for line in text.strip().splitlines():
        f = line.split("|")
        if len(f) != 5 or "/ports/" not in f[0]:
            continue
        dev, port = f[0].split("/ports/", 1)
        m = re.match(r"\s*([\d.]+)\s*Gb/sec", f[2])
        out.append(
            {
                "device": dev,
                "port": port,
                "state": f[1].split(":", 1)[-1].strip() or None,
                "rate_gbps": float(m.group(1)) if m else None,
                "rate": f[2].strip() or None,
                "link_layer": f[3].strip() or None,
                "phys_state": f[4].split(":", 1)[-1].strip() or None,
            }
        )
    return out


RDMA_PORTS = Fact("rdma_ports", lambda _v: RDMA_PROBE, parse_rdma)


# -- NET_LINKS: /sys/class/net -----------------------------------------------------------------

NET_PROBE = (
    "for np_d in /sys/class/net/*; do\n"
    "  np_n=${np_d##*/}\n"
    '  [ "$np_n" = lo ] && continue\n'
    "  np_sp=\n"
    "  np_m=\n"
    "  np_o=\n"
    '  IFS= read -r np_sp < "$np_d/speed" 2>/dev/null\n'
    '  IFS= read -r np_m < "$np_d/mtu" 2>/dev/null\n'
    '  IFS= read -r np_o < "$np_d/operstate" 2>/dev/null\n'
    '  printf \'%s|%s|%s|%s\\n\' "$np_n" "$np_sp" "$np_m" "$np_o"\n'
    "done\n"
    "true"
)


def parse_net(text: str, rc: int) -> dict:
    """{interface: {speed_mbps (None: not reported, e.g. virtual or down), mtu, state}}."""
    out = {}
    for line in text.strip().splitlines():
        f = line.split("|")
        if len(f) != 4:
            continue
        speed = int(f[1]) if re.fullmatch(r"\d+", f[1].strip()) else None  # -1 or empty: unknown
        out[f[0]] = {
            "speed_mbps": speed or None,
            "mtu": int(f[2]) if f[2].strip().isdigit() else None,
            "state": f[3].strip() or None,
        }
    return out


NET_LINKS = Fact("net_links", lambda _v: NET_PROBE, parse_net)
