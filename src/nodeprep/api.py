"""What the invoke tasks call. Each function returns an exit code; `cli` turns any
NodeprepError into one line on stderr with its exit code (2 = bad input, 1 = failed run)."""
from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

from . import facts as factmod
from . import gpus, inventory
from .errors import InputError, NodeprepError
from .executor import Fleet
from .report import Display
from .settings import Settings


def cli(fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw) -> int:
        try:
            return fn(*a, **kw) or 0
        except NodeprepError as e:
            print(f"error: {e}", file=sys.stderr)
            return e.exit_code
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:
            if not _stdout_gone():
                raise
            # `invoke verify-parity --json | head`: the reader left; no traceback, and none
            # from the interpreter's own flush of stdout at exit either.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
    return wrapper


def _stdout_gone() -> bool:
    """Is it OUR stdout whose reader went away (not some other pipe of the run)?"""
    import select
    try:
        p = select.poll()
        p.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in p.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _hosts(spec, limit, settings: Settings, extra_vars=None):
    inv = inventory.load(spec, extra_vars=extra_vars, default=settings.default_inventory)
    hosts = inv.select(limit)
    for h in hosts:
        # A missing key file would otherwise surface per node as a confusing auth failure.
        if h.key and not Path(h.key).expanduser().is_file():
            where = h.origin.get("key", "")
            file, _, line = where.rpartition(":")
            raise InputError(f"host {h.name}: key file {h.key} does not exist",
                             hint="fix `key:` or create the key (ssh-keygen -t ed25519)",
                             file=file or None, line=int(line) if line.isdigit() else None)
    return inv, hosts


@cli
def facts(spec=None, limit=None, json_mode=False, settings: Settings = Settings()) -> int:
    inv, hosts = _hosts(spec, limit, settings)
    names = factmod.node_facts()
    display = Display.auto(to_stderr=True, quiet=not json_mode)
    with Fleet(hosts, settings, "facts", display) as fleet:
        values = fleet.map(lambda s: factmod.gather(s, names, s.host.vars), "facts")
        for node, v in values.items():
            fleet.sessions[node].result.data["facts"] = v
        report = fleet.report(inventory=inv.name)
    if json_mode:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(facts_table(hosts, fleet.results))
        _footer(report)
    return 1 if report["failed"] or report["unreachable"] else 0


def facts_table(hosts, results) -> str:
    cols = ["node", "hostname", "ip", "os", "arch", "kernel", "python", "shell", "gpus", "free"]
    rows = []
    for h in hosts:
        r = results[h.name]
        f = r.data.get("facts")
        if not f:
            rows.append([h.name, r.status.upper(), r.message] + [""] * (len(cols) - 3))
            continue
        py = f["python"]
        rows.append([h.name, f["hostname"], factmod.primary_address(f["interfaces"]) or "-",
                     f["os"]["release"], f["os"]["arch"], f["os"]["kernel"],
                     f"{py['path']} {py['version']}" if py else "MISSING",
                     f["login_shell"] or "-", gpus.summary(f["gpus"]), _size(f["disk_free"])])
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]
    fmt = lambda row: "  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip()
    return "\n".join([fmt(cols)] + [fmt(r) for r in rows])


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _footer(report: dict) -> None:
    bad = {n: r for n, r in report["nodes"].items() if r["status"] in ("failed", "unreachable")}
    for n, r in bad.items():
        print(f"{r['status'].upper()}: {n}: {r.get('message', '')}", file=sys.stderr)
        if r.get("stderr_tail"):
            print("  " + r["stderr_tail"].replace("\n", "\n  "), file=sys.stderr)
    print(f"{len(report['nodes'])} nodes, {report['failed']} failed, "
          f"{report['unreachable']} unreachable; log: {report['run_dir']}", file=sys.stderr)


def parse_sets(items) -> dict:
    """--set KEY=VALUE (repeatable); values are YAML (`true`, `2`, `{a: 1}`)."""
    import yaml
    out = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            raise InputError(f"--set {key}: value is not valid YAML: {raw!r}") from None
    return out


def _password(ask: bool) -> str | None:
    """--ask-pass: asked once (from the terminal, or one line of stdin when piped), kept in
    memory only."""
    if not ask:
        return None
    if sys.stdin.isatty():
        import getpass
        return getpass.getpass("SSH password (first contact only): ")
    return sys.stdin.readline().rstrip("\n")


@cli
def provision(spec=None, limit=None, roles=None, check=False, diff=False, json_mode=False,
              ask_pass=False, sets=None, settings: Settings = Settings()) -> int:
    from .provision import provision as run
    inv, hosts = _hosts(spec, limit, settings, parse_sets(sets))
    return run(inv, hosts, settings, roles, check, diff, json_mode, _password(ask_pass))


@cli
def verify_parity(spec=None, limit=None, json_mode=False, deep=False, workdir=None, port=29500,
                  baseline=None, save_baseline=None, mesh="auto", settings: Settings = Settings(),
                  collective=False, via="auto") -> int:
    from . import verify
    if mesh not in ("auto", "full", "head"):
        raise InputError(f"--mesh {mesh!r}: expected auto, full or head")
    if via not in ("auto", "direct"):
        raise InputError(f"--via {via!r}: expected auto or direct")
    inv, hosts = _hosts(spec, limit, settings)
    return verify.run(inv, hosts, settings, json_mode, deep, workdir, port, baseline, save_baseline, mesh,
                      collective, via)


LAUNCHERS = ("deepspeed", "torchrun", "mpirun", "srun")


@cli
def train(spec=None, limit=None, launcher="deepspeed", payload="health", args=(), timeout=None,
          max_restarts=0, port=29500, ds_launcher="pdsh", preflight=True, dry_run=False,
          settings: Settings = Settings(), emulate=0, emulate_network=False) -> int:
    from . import train as trainmod
    if launcher not in LAUNCHERS:
        raise InputError(f"--launcher {launcher!r}: expected one of {', '.join(LAUNCHERS)}")
    if ds_launcher not in ("pdsh", "openmpi"):
        raise InputError(f"--ds-launcher {ds_launcher!r}: expected pdsh or openmpi")
    inv, hosts = _hosts(spec, limit, settings)
    if emulate_network and not emulate:
        raise InputError("--emulate-network only applies with --emulate N")
    return trainmod.run(inv, hosts, settings, launcher, payload, args, timeout, max_restarts, port,
                        ds_launcher, preflight, dry_run, emulate, emulate_network)


# -- lab ----------------------------------------------------------------------------------------

@cli
def lab_up(nodes: int, name: str = "local", settings: Settings = Settings(),
           slurm: bool | None = None) -> int:
    from . import lab
    lab.up(nodes, name=name, settings=settings, slurm=slurm)


@cli
def lab_down(name: str = "local", purge: bool = False, settings: Settings = Settings()) -> int:
    from . import lab
    lab.down(name, settings=settings, purge=purge)


@cli
def lab_status(name: str = "local", settings: Settings = Settings()) -> int:
    from . import lab
    info = lab.status(name, settings=settings)
    if info is None:
        print(f"lab {name}: not up")
        return 1
    for n in info.nodes:
        state = f"sshd pid {n.sshd_pid}" if n.sshd_pid else "DOWN"
        print(f"{n.name:<10} {n.address}:{n.port:<6} {state}")


@cli
def hosts_forget(spec, names: str, settings: Settings = Settings()) -> int:
    """Drop the pinned host keys of some nodes (after a deliberate reinstall)."""
    from .hostkeys import KnownHosts, host_entry
    inv = inventory.load(spec, default=settings.default_inventory)
    store = KnownHosts(settings.known_hosts)
    for h in inv.select(names):
        n = store.forget(host_entry(h.address, h.port))
        print(f"{h.name}: removed {n} pinned key(s) for {host_entry(h.address, h.port)}")
