"""nodeprep tasks: `invoke --list` shows them, `invoke --help TASK` shows each one's flags.

Argument parsing only; the work is in src/nodeprep/api.py.
"""
import shlex
import sys

from invoke import Collection, Exit, task

from nodeprep import api
from nodeprep.settings import Settings


def _settings(c, **overrides) -> Settings:
    return Settings.from_mapping(dict(c.config.get("nodeprep", {}))).with_(**overrides)


def _done(code: int) -> None:
    if code:
        raise Exit(code=code)


@task(help={"inventory": "inventory name under inventory/, a path, hostfile:F, slurm:[LIST] "
                         "or pbs:[F] (default: nodeprep.default_inventory, 'local')",
            "limit": "only these nodes: ranges (worker-[0-3]), globs, groups; !x excludes",
            "json": "print the report as JSON on stdout"})
def facts(c, inventory=None, limit=None, json=False):
    """Show each node's hostname, IP, OS, arch, kernel, python, login shell, GPUs, free disk."""
    _done(api.facts(inventory, limit, json, _settings(c)))


@task(help={"nodes": "how many emulated nodes (worker-0 .. worker-N-1)",
            "name": "lab name (<= 6 chars); 'local' writes inventory/local/",
            "slurm": "also run a real Slurm over the nodes (slurmctld + munged here, slurmd in "
                     "each node) for `train --launcher srun`; kept by later lab.up runs",
            "no_slurm": "stop the lab's Slurm"})
def lab_up(c, nodes=2, name="local", slurm=False, no_slurm=False):
    """Start (or resize) the emulated cluster: one netns, sshd and private home per node."""
    _done(api.lab_up(int(nodes), name, _settings(c), True if slurm else (False if no_slurm else None)))


@task(help={"name": "lab name", "purge": "also delete node homes and host keys"})
def lab_down(c, name="local", purge=False):
    """Stop the emulated cluster; leaves no process, namespace or mount behind."""
    _done(api.lab_down(name, purge, _settings(c)))


@task(help={"name": "lab name"})
def lab_status(c, name="local"):
    """List the lab's nodes and whether their sshd runs."""
    _done(api.lab_status(name, _settings(c)))


@task(help={"nodes": "node names or ranges whose pinned keys to drop",
            "inventory": "inventory (default: local)"})
def hosts_forget(c, nodes, inventory=None):
    """Forget pinned host keys after a deliberate node reinstall (next contact re-pins)."""
    _done(api.hosts_forget(inventory, nodes, _settings(c)))


@task(iterable=["set"],
      help={"inventory": "inventory name or path (default: nodeprep.default_inventory)",
            "roles": "comma list of roles to apply (default: all of roles/site.yml, in order)",
            "limit": "only these nodes: ranges, globs, groups; !x excludes",
            "check": "change nothing; list what would change",
            "diff": "show file diffs (secrets redacted)",
            "json": "print the report as JSON on stdout",
            "ask_pass": "log in with a password where the key is not installed yet (asked once, "
                        "kept in memory only)",
            "set": "KEY=VALUE variable override (YAML value), highest precedence; repeatable"})
def provision(c, inventory=None, roles=None, limit=None, check=False, diff=False, json=False,
              ask_pass=False, set=None):
    """Prepare every node the same way: the roles of roles/site.yml; idempotent."""
    _done(api.provision(inventory, limit, roles, check, diff, json, ask_pass, set, _settings(c)))


@task(help={"inventory": "inventory name or path (default: nodeprep.default_inventory)",
            "limit": "only these nodes: ranges, globs, groups; !x excludes",
            "json": "print {ok, drift, unreachable, checks} as JSON",
            "deep": "re-import torch on every node instead of using its cached answer",
            "workdir": "job directory that must exist on every node (the launchers cd into it)",
            "port": "master port that must be free on the head node (0: skip)",
            "baseline": "report what changed since this fingerprint file",
            "save_baseline": "write the fleet's fingerprint to this file",
            "mesh": "real ssh logins: full (every ordered pair), head (head -> every node), "
                    "auto (full up to 4 nodes, else head; default); every pair is also "
                    "checked on paper",
            "collective": "also run an all_reduce across the nodes via torchrun (gloo on CPU, "
                          "nccl on GPU) and report bus bandwidth per message size",
            "via": "auto (default): when only the head logs in to every node, the probes ride "
                   "those logins (one connection from here); direct: connect from here to "
                   "every node (also proves this machine reaches each one)"})
def verify_parity(c, inventory=None, limit=None, json=False, deep=False, workdir=None, port=29500,
                  baseline=None, save_baseline=None, mesh="auto", collective=False, via="auto"):
    """Prove the nodes are the same where training cares; show drift grouped by value."""
    _done(api.verify_parity(inventory, limit, json, deep, workdir, int(port) or None, baseline,
                            save_baseline, mesh, _settings(c), collective, via))


@task(help={"inventory": "inventory name or path (default: nodeprep.default_inventory)",
            "limit": "only these nodes (the first one is the head node)",
            "launcher": "deepspeed (default), torchrun, mpirun or srun",
            "payload": "builtin health or ddp, or a script path (its directory is synced)",
            "timeout": "seconds before every rank is stopped (default: none)",
            "max_restarts": "torchrun --max-restarts (elastic restarts from the payload's snapshot)",
            "port": "master / rendezvous port on the head node",
            "ds_launcher": "DeepSpeed's multinode launcher: pdsh (default) or openmpi",
            "no_preflight": "skip the checks that catch hangs before launch",
            "dry_run": "print each node's command and stop",
            "emulate": "pretend the one selected machine is N nodes (ssh aliases emu-0.., its GPUs "
                       "split between them)",
            "emulate_network": "with --emulate: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 (traffic over "
                               "the network path)"})
def train(c, inventory=None, limit=None, launcher="deepspeed", payload="health", timeout=0,
          max_restarts=0, port=29500, ds_launcher="pdsh", no_preflight=False, dry_run=False,
          emulate=0, emulate_network=False):
    """Start the payload on every node; stop every rank everywhere if one fails. Payload
    arguments go after `--`: invoke train --payload ddp -- --epochs 3"""
    args = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    _done(api.train(inventory, limit, launcher, payload, args, int(timeout) or None,
                    int(max_restarts), int(port), ds_launcher, not no_preflight, dry_run, _settings(c),
                    int(emulate), emulate_network))


@task(iterable=["node"],
      help={"torch": "torch release, e.g. 2.5.1 or 2.13.0",
            "node": "NAME:driver=535.104.05,gpus=8x8.0 (or gpu=8.0+9.0, gpu=A100, arch=aarch64), "
                    "or NAME:cpu; repeatable",
            "arch": "CPU arch of nodes that do not say (default x86_64)",
            "index": "index URL template with {variant} (default the PyTorch index)",
            "json": "print the plan (or the error) as JSON"})
def torch_plan(c, torch, node=None, arch=None, index=None, json=False):
    """Which torch build fits a fleet (no node touched): the variant, the exact pin and index, or
    the node that blocks and how to fix it."""
    from nodeprep import torchplan
    _done(torchplan.cli(torch, node or [], arch, index, json))


@task(help={"nodes": "emulated nodes to start", "keep": "leave the lab running afterwards"})
def demo(c, nodes=2, keep=True):
    """The main job end to end on the embedded lab: lab.up, facts, provision (twice: the
    second run must change nothing), verify-parity, then train: the health payload with the
    DeepSpeed launcher and the ddp payload with torchrun."""
    s = _settings(c)
    _done(api.lab_up(int(nodes), "local", s))
    _done(api.facts("local", None, False, s))
    _done(api.provision("local", settings=s))
    _done(api.provision("local", settings=s))
    _done(api.verify_parity("local", settings=s))
    _done(api.train("local", launcher="deepspeed", payload="health", timeout=300, settings=s))
    _done(api.train("local", launcher="torchrun", payload="ddp", timeout=300,
                    args=["--epochs", "2", "--steps-per-epoch", "4"], settings=s))
    if not keep:
        _done(api.lab_down("local", False, s))


@task(help={"k": "only tests matching this expression (pytest -k)",
            "unit": "unit tests only (no root, no sshd needed)"})
def test(c, k=None, unit=False):
    """Run the test suite: unit tests, then integration tests against a real emulated lab."""
    args = ["tests/unit"] if unit else ["tests"]
    if k:
        args += ["-k", k]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"] + args
    c.run(" ".join(shlex.quote(a) for a in cmd), pty=False, env={"PYTHONDONTWRITEBYTECODE": "1"})


lab = Collection("lab")
lab.add_task(lab_up, "up")
lab.add_task(lab_down, "down")
lab.add_task(lab_status, "status")
hosts = Collection("hosts")
hosts.add_task(hosts_forget, "forget")
ns = Collection(facts, provision, verify_parity, train, torch_plan, demo, test, lab, hosts)
