"""The checks of one node besides its GPUs: free space where nodeprep and jobs write, memory,
/dev/shm, the user's limits, the clock. Each returns [(code, verdict, reason, fix)]."""

from __future__ import annotations

from nodeprep.engine.facts import ROOM
from nodeprep.engine.facts.modules import MODULES, problem
from nodeprep.engine.facts.nodehealth import CLOCK, LIMITS, RDMA_PORTS
from nodeprep.ops.health.findings import Context, Verdict

OK = Verdict.OK
WARN = Verdict.WARN
UNKNOWN = Verdict.UNKNOWN
CRITICAL = Verdict.CRITICAL
GIB = 1 << 30

# Where a run writes: the home (caches, the job directory), /tmp, and nodeprep's own tree (the
# wheelhouse and the venv), which may be a file system of its own.
PLACES = (("home", "~"), ("/tmp", "/tmp"), ("~/.nodeprep", "~/.nodeprep"))
ROOMS = tuple(ROOM(path) for _name, path in PLACES)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / (1 << 20):.0f} MiB"


def disk(f, ctx: Context) -> list:
    t = ctx.thresholds
    out = []
    seen = set()
    for (name, path), req in zip(PLACES, ROOMS):
        r = f[req]
        if r["mount"] in seen:
            continue
        seen.add(r["mount"])
        where = f"{name} ({r['mount']})" if r["mount"] not in (path, name) else name
        used = 100.0 * (1 - r["free"] / r["size"]) if r["size"] else 0.0
        if r["readonly"] or not r["writable"]:
            out.append(
                (
                    "DISK_READONLY",
                    CRITICAL,
                    f"{where} is {'read-only' if r['readonly'] else 'not writable'}",
                    f"remount {r['mount']} read-write, or fix the permissions of {r['dir']}",
                )
            )
        elif r["free"] < t.disk_free_critical_gib * GIB or r["inodes_free"] == 0:
            what = (
                "no inodes left"
                if r["inodes_free"] == 0
                else f"{_gib(r['free'])} free of {_gib(r['size'])}"
            )
            out.append(
                (
                    "DISK_FULL",
                    CRITICAL,
                    f"{where}: {what}",
                    f"free space on {r['mount']} "
                    "(old runs: `invoke train.status`; pip's cache: ~/.cache/pip)",
                )
            )
        elif r["free"] < t.disk_free_warn_gib * GIB or used >= t.disk_used_warn_pct:
            out.append(
                (
                    "DISK_LOW",
                    WARN,
                    f"{where}: {_gib(r['free'])} free ({used:.0f}% used)",
                    f"free space on {r['mount']}",
                )
            )
    return out


def memory(f, ctx: Context) -> list:
    lim, t = f[LIMITS], ctx.thresholds
    avail, total = lim["mem_available_kib"] * 1024, lim["mem_total_kib"] * 1024
    if avail < t.mem_available_critical_gib * GIB:
        return [
            (
                "MEM_LOW",
                CRITICAL,
                f"{_gib(avail)} of {_gib(total)} memory available",
                "stop what holds the memory (`ps aux --sort=-rss | head`)",
            )
        ]
    if avail < total * t.mem_available_warn_pct / 100:
        return [
            (
                "MEM_LOW",
                WARN,
                f"{_gib(avail)} of {_gib(total)} memory available "
                f"(under {t.mem_available_warn_pct:.0f}%)",
                "stop what holds the memory (`ps aux --sort=-rss | head`)",
            )
        ]
    return []


def shm(f, ctx: Context) -> list:
    lim, want = f[LIMITS], ctx.thresholds.shm_min_mib
    if lim["shm_kib"] is None:
        return [
            (
                "SHM_MISSING",
                CRITICAL,
                "no /dev/shm: NCCL and DataLoader workers need it",
                "mount a tmpfs on /dev/shm (containers: --shm-size or --ipc=host)",
            )
        ]
    if lim["shm_kib"] < want * 1024:
        return [
            (
                "SHM_SMALL",
                CRITICAL,
                f"/dev/shm is {lim['shm_kib'] // 1024} MiB (under {want} MiB): NCCL's "
                "shared-memory transport and DataLoader workers fail",
                "sudo mount -o remount,size=50% /dev/shm "
                "(containers: --shm-size=16g or --ipc=host)",
            )
        ]
    return []


MEMLOCK_FIX = (
    "`* - memlock unlimited` in /etc/security/limits.d/ (and LimitMEMLOCK=infinity for "
    "sshd/slurmd), then log in again"
)


def limits(f, ctx: Context) -> list:
    """Locked memory matters where RDMA pins buffers (InfiniBand, RoCE, EFA: NCCL's net plugins
    register memory with the NIC); without RDMA ports a limit is no finding here (fleet.py's
    limits_equal still names a node below the others)."""
    lim = f[LIMITS]
    t = ctx.thresholds
    out = []
    mem = lim["memlock_kib"]
    if f[RDMA_PORTS] and mem is not None and (t.memlock_min_kib is None or mem < t.memlock_min_kib):
        need = "unlimited" if t.memlock_min_kib is None else f"{t.memlock_min_kib} KiB"
        out.append(
            (
                "MEMLOCK_LOW",
                CRITICAL,
                f"locked memory limited to {mem} KiB (want {need}) on a node with "
                f"RDMA ports: NCCL cannot register its buffers with the NIC",
                MEMLOCK_FIX,
            )
        )
    if lim["nofile"] is not None and lim["nofile"] < t.nofile_min:
        out.append(
            (
                "NOFILE_LOW",
                WARN,
                f"open files limited to {lim['nofile']} (want {t.nofile_min} or more)",
                "`* - nofile 1048576` in /etc/security/limits.d/, then log in again",
            )
        )
    return out


def clock(f, ctx: Context) -> list:
    c = f[CLOCK]
    t = ctx.thresholds
    out = []
    if c["now"] is None or ctx.clock_window is None:
        out.append(
            (
                "CLOCK_UNKNOWN",
                UNKNOWN,
                "the node's time could not be read",
                "check `date` on the node",
            )
        )
    else:
        lo, hi = ctx.clock_window
        off = c["now"] - lo if c["now"] < lo else c["now"] - hi if c["now"] > hi else 0.0
        slack = hi - lo
        if abs(off) > t.clock_critical_s:
            out.append(
                ("CLOCK_OFFSET", CRITICAL, f"clock {off:+.1f} s from the controller's", _SYNC_FIX)
            )
        elif abs(off) > t.clock_warn_s:
            out.append(
                (
                    "CLOCK_OFFSET",
                    WARN,
                    f"clock {off:+.1f} s from the controller's (measured within "
                    f"{slack:.2f} s): failures are ordered by the nodes' clocks",
                    _SYNC_FIX,
                )
            )
    if not c["sync"]:
        out.append(
            (
                "TIME_SYNC",
                WARN,
                "no time-sync daemon runs (chronyd, ntpd, systemd-timesyncd, ptp4l)",
                _SYNC_FIX,
            )
        )
    return out


_SYNC_FIX = "run a time-sync daemon: sudo apt install chrony (or systemctl enable --now chronyd)"

FACTS = (LIMITS, CLOCK, RDMA_PORTS) + ROOMS


def modules(f, ctx: Context) -> list:
    """The node's named `modules` load (the MODULES fact, read as the ranks' shells will); a
    node that names none has nothing to say."""
    m = f.get(MODULES)
    if not m or m.get("unused"):
        return []
    names = list(m.get("modules") or {})
    bad = problem(m, {"modules": names})
    if bad is None:
        return [("MODULES_OK", OK, f"{', '.join(m.get('loaded') or names)} load", "")]
    code = "MODULES_NO_SYSTEM" if m.get("system") is None else "MODULE_NOT_LOADED"
    return [(code, CRITICAL, bad[0], bad[1])]
