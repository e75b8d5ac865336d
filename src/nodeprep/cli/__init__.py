"""The only layer that talks to the user: runs a command with its options, renders the result
(text, JSON, the live table: render.py, display.py), writes errors as one line, and returns
the exit code. Every entry point here goes through `guarded`, so a NodeprepError is one line
on stderr with its exit code (2 = bad input, 1 = failed run) and Ctrl-C is 130, the same for
every command.

A closed stdout (`| head -1`, a pager quit early) or stderr is no error and no traceback, for
every task and for Invoke's own output (`--list`, `--help`): importing this package guards
both (stdio.py), so the command goes on with its output discarded and exits with the code it
would have had (not 141: provision still changed the nodes, a training run still ran to its
end, and `set -o pipefail` scripts should see that result). Only `train.logs --follow`, which
shows and changes nothing, stops following once stdout's reader is gone.

Every `invoke` (`--list` and `--help` too) imports this package: at its top it imports only
what every task needs; each entry point imports its command and renderers when it runs, so
fabric and paramiko load only for a task that reaches nodes (tests/unit/test_startup_imports.py).

  __init__.py        one entry point per task (tasks.py calls them): run, render, exit code
  guard.py           what every entry point shares: errors as one line, Ctrl-C as 130, JSON
  training.py        the entry points of train, train.status/stop/release/logs
  staging.py         `invoke stage`: its entry point and its result as text
  timeline.py        a training job's attempts drawn as a PNG (train --png)
  display.py         the live table / plain progress lines (engine events rendered)
  render.py          results as text: facts, provision summary, train, torch-plan, collective
  parity_text.py     a parity report as text, clubak style (values grouped under node sets)
  doctor_text.py     `invoke doctor`: one line per check, findings with their fixes
  health_text.py     `invoke health`: verdicts per node, findings with fixes, the check list;
                     `invoke bandwidth`: the matrix, the flagged nodes, the heatmap PNG
  inventory_text.py  `invoke inventory`: hosts, the group graph, one host's variables
  stdio.py           a closed stdout or stderr is no error and no traceback
  detached.py        `train --detach`: the supervisor started in the background, and its main
"""

from __future__ import annotations

import json
import sys

from nodeprep.cli import stdio
from nodeprep.cli.display import Display
from nodeprep.cli.guard import guarded, need_matplotlib, print_json
from nodeprep.cli.staging import stage
from nodeprep.cli.training import train, train_logs, train_release, train_status, train_stop
from nodeprep.commands.options import (
    BandwidthOptions,
    DoctorOptions,
    FactsOptions,
    ForgetOptions,
    HealthOptions,
    InitOptions,
    InventoryOptions,
    ProvisionOptions,
    PruneOptions,
    TorchPlanOptions,
    VerifyOptions,
)
from nodeprep.settings import Settings

stdio.install()

__all__ = ["stage", "train", "train_logs", "train_release", "train_status", "train_stop"]


@guarded
def init(opts: InitOptions, settings: Settings = Settings()) -> int:
    from nodeprep.commands import init as init_cmd

    res = init_cmd.init(opts, settings, Display.auto(to_stderr=True, quiet=True))
    if opts.dry_run:
        print(res.text, end="")
    else:
        print(f"wrote {res.path}")
    for node, why in res.unreached.items():
        print(
            f"not reached: {node}: {why} "
            "(written with a note; fix it, then init again with --force)"
        )
    print("next:")
    for step in res.next_steps:
        print(f"  {step}")
    return res.exit_code


@guarded
def facts(opts: FactsOptions, settings: Settings = Settings()) -> int:
    from nodeprep.cli import render
    from nodeprep.commands import facts as facts_cmd

    res = facts_cmd.facts(opts, settings, Display.auto(to_stderr=True, quiet=not opts.json))
    if opts.json:
        print_json(res.report)
    else:
        print(render.facts_table(res.report))
        render.footer(res.report)
    return res.exit_code


@guarded
def health(opts: HealthOptions, settings: Settings = Settings(), list_checks: bool = False) -> int:
    from nodeprep.cli import health_text

    if list_checks:
        from nodeprep.ops.health import catalogue

        checks = catalogue.select(opts.checks, deep=True)
        print(health_text.catalogue(checks, catalogue.COMMAND_CODES))
        return 0
    from nodeprep.commands import health as health_cmd

    res = health_cmd.health(opts, settings, Display.auto(to_stderr=True, quiet=True))
    if opts.json:
        print_json(res.as_dict())
    else:
        print(health_text.findings(res))
    return res.exit_code


@guarded
def doctor(opts: DoctorOptions, settings: Settings = Settings(), list_checks: bool = False) -> int:
    from nodeprep.cli import doctor_text
    from nodeprep.ops.doctor import catalogue

    if list_checks:
        print(doctor_text.catalogue(catalogue.select(opts.checks), catalogue.COMMON))
        return 0
    from nodeprep import lab
    from nodeprep.commands import doctor as doctor_cmd

    res = doctor_cmd.doctor(
        opts,
        settings,
        Display.auto(to_stderr=True, quiet=True),
        labs=lambda: lab.leftovers(settings),
    )
    if opts.json:
        print_json(res.as_dict())
    else:
        print(doctor_text.render(res, opts.verbose))
    return res.exit_code


@guarded
def ssh_prune(opts: PruneOptions, settings: Settings = Settings()) -> int:
    from nodeprep.commands import ssh_prune as prune_cmd

    res = prune_cmd.prune(opts, settings)
    verb = "would remove" if opts.dry_run else "removed"
    for name in res.removed:
        print(f"{res.path}: {verb} the block of inventory '{name}' (it no longer exists)")
    print(
        f"{res.path}: "
        + (f"{len(res.removed)} stale block(s) {verb}" if res.removed else "no stale block")
        + (f"; kept {len(res.kept)}: {', '.join(res.kept)}" if res.kept else "")
    )
    return 0


@guarded
def bandwidth(opts: BandwidthOptions, settings: Settings = Settings()) -> int:
    need_matplotlib(opts.png)
    from nodeprep.cli import health_text
    from nodeprep.commands import bandwidth as bandwidth_cmd

    res = bandwidth_cmd.bandwidth(opts, settings, Display.auto(to_stderr=True, quiet=True))
    if opts.json:
        print_json(res.as_dict())
    else:
        print(health_text.bandwidth(res))
    if opts.png:
        health_text.heatmap_png(res, opts.png)
    return res.exit_code


def _password(ask: bool) -> str | None:
    """--ask-pass: asked once (from the terminal, or one line of stdin when piped), kept in
    memory only."""
    if not ask:
        return None
    if sys.stdin.isatty():
        import getpass

        return getpass.getpass("SSH password (first contact only): ")
    return sys.stdin.readline().rstrip("\n")


@guarded
def provision(
    opts: ProvisionOptions, settings: Settings = Settings(), ask_pass: bool = False
) -> int:
    if ask_pass:
        from dataclasses import replace

        opts = replace(opts, password=_password(True))
    from nodeprep.cli import render
    from nodeprep.commands import provision as provision_cmd

    res = provision_cmd.provision(opts, settings, Display.auto(to_stderr=opts.json))
    for text in res.diffs:
        print(text, file=sys.stderr if opts.json else sys.stdout)
    if opts.json:
        print(res.redact(json.dumps(res.report, indent=2, default=str)))
    else:
        render.provision_summary(res)
    return res.exit_code


@guarded
def verify_parity(opts: VerifyOptions, settings: Settings = Settings()) -> int:
    from nodeprep.cli import parity_text, render
    from nodeprep.commands import verify as verify_cmd

    res = verify_cmd.verify(opts, settings, Display.auto(to_stderr=True, quiet=True))
    if opts.json:
        out = res.report.as_dict()
        if res.collective is not None:
            out["collective"] = res.collective
        print_json(out)
    else:
        print(parity_text.render(res.report, color=sys.stdout.isatty()).rstrip("\n"))
        if res.collective is not None:
            print(render.collective(res.collective))
        for note in res.notes:
            print(note)
    return res.exit_code


@guarded
def torch_plan(opts: TorchPlanOptions) -> int:
    from nodeprep.cli import render
    from nodeprep.commands import torch_plan as torch_plan_cmd

    res = torch_plan_cmd.torch_plan(opts)
    e = res.error
    if opts.json:
        print_json(
            {
                "ok": False,
                "error": {
                    "node": getattr(e, "node", None),
                    "reason": getattr(e, "reason", e.message),
                    "fix": getattr(e, "fix", e.hint),
                    "exit_code": e.exit_code,
                    "explain": getattr(e, "explain", []),
                },
            }
            if e
            else {"ok": True, "plan": res.plan.as_dict()}
        )
    elif e:
        print(f"error: {e}", file=sys.stderr)
        if opts.explain and getattr(e, "explain", None):
            print("\n".join(["explain:"] + [f"  {w}" for w in e.explain]), file=sys.stderr)
    else:
        print(render.torch_plan(res.plan, opts.explain))
    return res.exit_code


@guarded
def inventory(opts: InventoryOptions, settings: Settings = Settings()) -> int:
    """What nodeprep read from an inventory; no node is contacted."""
    from nodeprep.cli import inventory_text
    from nodeprep.commands import inventory as inventory_cmd

    view = inventory_cmd.inventory(opts, settings)
    if opts.json:
        print_json(view.as_dict() if not opts.graph else view.as_dict()["groups"])
        return 0
    for text in view.inventory.warnings:
        print(f"warning: {text}", file=sys.stderr)
    if opts.host:
        print(inventory_text.host(view))
    elif opts.graph:
        print(inventory_text.graph(view))
    else:
        print(inventory_text.hosts(view))
    return 0


@guarded
def hosts_forget(opts: ForgetOptions, settings: Settings = Settings()) -> int:
    """Drop the pinned host keys of some nodes (after a deliberate reinstall)."""
    from nodeprep.commands import hosts

    for name, n, entry in hosts.forget(opts, settings):
        print(f"{name}: removed {n} pinned key(s) for {entry}")


# -- lab ----------------------------------------------------------------------------------------


@guarded
def lab_up(nodes: int, name: str = "local", settings: Settings = Settings(), **shape) -> int:
    """SHAPE: fields of lab.UpOptions (slurm, shared_home, aliases, nic_names)."""
    from nodeprep import lab

    lab.up(nodes, name=name, settings=settings, options=lab.UpOptions(**shape))


@guarded
def lab_down(name: str = "local", purge: bool = False, settings: Settings = Settings()) -> int:
    from nodeprep import lab

    lab.down(name, settings=settings, purge=purge)


@guarded
def lab_status(name: str = "local", settings: Settings = Settings()) -> int:
    from nodeprep import lab

    info = lab.status(name, settings=settings)
    if info is None:
        print(f"lab {name}: not up")
        return 1
    for n in info.nodes + ([info.bastion] if info.bastion else []):
        state = f"sshd pid {n.sshd_pid}" if n.sshd_pid else "DOWN"
        print(f"{n.name:<10} {n.address}:{n.port:<6} {state}" + (f" ({n.arch})" if n.arch else ""))
