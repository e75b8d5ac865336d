"""Text for people: each command's result as the tables and lines the user reads. JSON is
rendered in cli/__init__.py; nothing here decides exit codes."""

from __future__ import annotations

import sys

from nodeprep.engine import facts as factmod
from nodeprep.engine.facts import gpus
from nodeprep.engine.results import usable


# -- facts --------------------------------------------------------------------------------------
def facts_table(report: dict) -> str:
    cols = ["node", "hostname", "ip", "os", "arch", "kernel", "python", "shell", "gpus", "free"]
    rows = []
    for name, r in report["nodes"].items():
        f = r.get("facts")
        if not f:
            rows.append([name, r["status"].upper(), r.get("message", "")] + [""] * (len(cols) - 3))
            continue
        py = f["python"]
        rows.append(
            [
                name,
                f["hostname"],
                factmod.primary_address(f["interfaces"]) or "-",
                f["os"]["release"],
                f["os"]["arch"],
                f["os"]["kernel"],
                f"{py['path']} {py['version']}" if py else "MISSING",
                f["login_shell"] or "-",
                gpus.summary(f["gpus"]),
                size(f["disk_free"]),
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]
    fmt = lambda row: "  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip()
    return "\n".join([fmt(cols)] + [fmt(r) for r in rows])


def size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def footer(report: dict) -> None:
    bad = {n: r for n, r in report["nodes"].items() if not usable(r["status"])}
    for n, r in bad.items():
        print(f"{r['status'].upper()}: {n}: {r.get('message', '')}", file=sys.stderr)
        if r.get("stderr_tail"):
            print("  " + r["stderr_tail"].replace("\n", "\n  "), file=sys.stderr)
    print(
        f"{len(report['nodes'])} nodes, {report['failed']} failed, "
        f"{report['unreachable']} unreachable; log: {report['run_dir']}",
        file=sys.stderr,
    )


# -- provision ----------------------------------------------------------------------------------
def provision_summary(res) -> None:
    report = res.report
    redact = res.redact
    out = sys.stdout
    for c in res.controller:
        if c.status != "ok":
            print(
                f"controller  {c.name}: {c.status}" + (f"  {c.message}" if c.message else ""),
                file=out,
            )
    for n in res.notes:
        print(f"note: {n}", file=out)
    verb = "would change" if res.check_mode else "changed"
    width = max([len(n) for n in report["nodes"]] + [4])
    for node, r in report["nodes"].items():
        steps = r.get("steps", [])
        ok = sum(s["status"] == "ok" for s in steps)
        print(
            f"{node:<{width}}  {r['status']:<11} "
            f"ok={ok} {verb}={r['changed']} failed={r['failed']}",
            file=out,
        )
        for s in steps:
            if s["status"] in ("changed", "failed"):
                print(
                    redact(f"{'':<{width}}    {s['status']}: {s['step']}: {s['message']}"), file=out
                )
        if not usable(r["status"]):
            print(redact(f"{'':<{width}}    {r.get('message', '')}"), file=out)
            for line in (r.get("stderr_tail") or "").splitlines():
                print(redact(f"{'':<{width}}      | {line}"), file=out)
    total = report["changed"]
    if not total and not report["failed"] and not report["unreachable"]:
        print(
            f"{len(report['nodes'])} nodes: nothing to change, every step already matches", file=out
        )
    else:
        print(
            f"{len(report['nodes'])} nodes: {verb} {total} step(s), {report['failed']} failed, "
            f"{report['unreachable']} unreachable; log: {report['run_dir']}",
            file=out,
        )


# -- verify-parity ------------------------------------------------------------------------------
def collective(res: dict) -> str:
    head = f"collective all_reduce via {res['launcher']}"
    if res.get("error"):
        return f"{head}: FAILED: {res['error']}"
    lines = [
        f"{head}: {'OK' if res['ok'] else 'FAILED'} (world size {res['world_size']}, "
        f"{res['backend']})",
        f"  {'bytes':>10}  {'time/call':>12}  {'algbw':>11}  {'busbw':>11}",
    ]
    for r in res.get("sizes", []):
        lines.append(
            f"  {r['bytes']:>10}  {r['time_us']:>9.1f} us  {r['algbw_gbps']:>6.4g} GB/s  "
            f"{r['busbw_gbps']:>6.4g} GB/s" + ("" if r["correct"] else "  WRONG RESULT")
        )
    return "\n".join(lines + _nccl_logged(res.get("nccl") or {}))


def _nccl_logged(per_node: dict) -> list[str]:
    """What NCCL's own log said (nccl only): nodes with the same answer on one line."""
    from nodeprep.inventory.nodeset import fold

    groups: dict[tuple, list[str]] = {}
    for node, got in per_node.items():
        groups.setdefault(
            tuple(got.get(k) or "-" for k in ("net_plugin", "network", "transport")), []
        ).append(node)
    lines = [
        f"  NCCL on {fold(nodes)}: net plugin {p}, network {n}, transport {t}"
        for (p, n, t), nodes in groups.items()
    ]
    ran = sorted({got["version"] for got in per_node.values() if got.get("version")})
    return lines + ([f"  NCCL version (rank 0's log): {', '.join(ran)}"] if ran else [])


# -- torch-plan ---------------------------------------------------------------------------------
def _torch_build(plan, b, head: str) -> list[str]:
    lines = [
        head + (f" (CUDA {b.cuda})" if b.cuda else ""),
        f"  pip install {b.requirement}" + (f" --index-url {b.index_url}" if b.index_url else ""),
    ]
    if b.arch_list:
        lines.append("  compiled for: " + " ".join(b.arch_list))
    lines += [f"  PTX: {b.ptx}"] if b.ptx else []
    lines += [f"  note: {b.compat}"] if b.compat else []
    if plan.pypi_default and plan.pypi_default != b.variant and b.cpu_arch == "x86_64":
        # PEP 440: a local version sorts higher, so a bare torch==X may even resolve to +cpu.
        lines.append(
            f"  note: a bare torch=={plan.torch} from PyPI gives {plan.pypi_default}"
            + (" (or +cpu)" if plan.torch == "2.13.0" else "")
            + "; keep the pin"
        )
    return lines + (["  not chosen:"] + [f"    {r}" for r in b.reasons] if b.reasons else [])


def torch_plan(plan, explain: bool = False) -> str:
    """One block per CPU platform; the first line says the answer."""
    if len(plan.builds) == 1:
        lines = _torch_build(
            plan, plan.builds[0], f"torch {plan.torch} -> {plan.builds[0].variant}"
        )
    else:
        lines = [
            f"torch {plan.torch} -> " + ", ".join(f"{b.cpu_arch}: {b.variant}" for b in plan.builds)
        ]
        lines += [f"  warning: {plan.warning}"] if plan.warning else []
        for b in plan.builds:
            lines += _torch_build(plan, b, f"{b.cpu_arch} ({', '.join(b.nodes)}): {b.variant}")
    return "\n".join(lines + (["explain:"] + [f"  {w}" for w in plan.explain] if explain else []))


# -- train --------------------------------------------------------------------------------------
def _cause_line(cause: dict) -> str:
    """ "user (the script's own error): RuntimeError: bad batch": the class, and for the
    script's own error or a hardware sign the line that showed it."""
    if cause["klass"] not in ("user", "hardware"):
        return cause["line"]
    return f"{cause['line']}: {cause['why'].split(': ', 1)[-1]}"


def train(res) -> None:
    err = sys.stderr
    if not res.launched:
        for node, cmd in res.commands.items():
            print(f"{node}: {cmd}")
        if res.failure:  # a relaunch that too few nodes passed the health gate for
            print(f"train: job {res.job_id} not launched: {res.failure}", file=err)
            for line in _attempt_lines(res.attempts):
                print(line, file=err)
            if res.stop_reason and res.stop_reason != res.failure:
                print(f"  no further attempt: {res.stop_reason}", file=err)
        return
    if res.detached:
        print(
            f"train: job {res.job_id} started detached on {res.where}; run id {res.job_id}\n"
            f"  invoke train.status {res.job_id}   invoke train.logs {res.job_id} -f   "
            f"invoke train.stop {res.job_id}",
            file=err,
        )
        return
    o = res.outcome
    if o.failure is None:
        print(f"train: job {res.job_id} finished on {res.where}", file=err)
    else:
        # root cause first: the first failing node and rank, how it ended, its last lines
        print(f"train: job {res.job_id} FAILED: {o.failure}", file=err)
        if o.cause:
            print(f"  class: {_cause_line(o.cause)}", file=err)
        for who, lines in o.tails.items():
            print(f"--- last lines from {who}:", file=err)
            for line in lines[-10:]:
                print(f"    {line}", file=err)
        for line in o.others[:8]:
            print(f"  then: {line}", file=err)
        if o.stopped:
            print(
                f"  stopped by nodeprep: {', '.join(sorted(o.stopped)[:16])}"
                + (" ..." if len(o.stopped) > 16 else ""),
                file=err,
            )
        if o.stop_seconds is not None:
            print(f"  every rank gone {o.stop_seconds:.1f}s after the first failure", file=err)
    for line in o.warnings:
        print(f"  warning: {line}", file=err)
    for line in _attempt_lines(res.attempts):  # --restarts
        print(line, file=err)
    if res.attempts and res.stop_reason != "finished":
        print(f"  no further attempt: {res.stop_reason}", file=err)
    print(_leftover_line(o), file=err)
    print(f"  logs: {res.run_dir} (invoke train.logs {res.job_id})", file=err)


def _attempt_lines(attempts: list[dict]) -> list[str]:
    """ "  attempt 1 (job J) on worker-0, worker-1: FAILED, node on worker-1 (...); quarantined
    worker-1", one per attempt."""
    return [
        f"  attempt {a['attempt']} (job {a['job_id']}) on {', '.join(a['nodes'])}: "
        + (f"FAILED, {a['cause']['line']}" if a.get("cause") else "finished")
        + (f"; quarantined {', '.join(a['quarantined'])}" if a.get("quarantined") else "")
        for a in attempts
    ]


def _leftover_line(o) -> str:
    if not o.leftovers:
        return f"  0 processes left on {o.checked} node(s)"
    return "  LEFT RUNNING: " + "; ".join(
        f"{n}: {len(ps)} process(es) ({ps[0]['args'][:60]})" for n, ps in o.leftovers.items()
    )


def train_status(st) -> None:
    print(
        f"run {st.job_id}: {st.state}  {st.launcher} on {st.where}, {st.elapsed:.0f}s"
        + (
            ""
            if st.supervisor or st.state in ("finished", "failed", "stopped")
            else "  (no supervisor running)"
        )
    )
    if st.failure:
        print(f"  failure: {st.failure}")
    if st.cause:
        print(f"  class: {_cause_line(st.cause)}")
    if len(st.attempts) > 1:
        print("\n".join(_attempt_lines(st.attempts)))
    nodes = sorted(set(st.nodes) | set(st.processes) | set(st.unreachable))
    width = max([len(n) for n in nodes] + [4])
    for n in nodes:
        info = st.nodes.get(n, {})
        now = len(st.processes.get(n, [])) if n in st.processes else "?"
        line = (
            f"  {n:<{width}}  ranks {info.get('alive', 0)}/{info.get('ranks', 0)} alive  "
            f"processes now: {now}"
        )
        if n in st.unreachable:
            line += f"  unreachable: {st.unreachable[n]}"
        print(line + (f"  last: {info['last'][:80]}" if info.get("last") else ""))
    print(f"  logs: {st.path}")


def train_stop(res) -> None:
    print(f"run {res.job_id}: {res.how}" + (f" ({res.state})" if res.state else ""))
    for n, v in res.stopped.items():
        print(f"  {n}: {v}")


def train_release(res) -> None:
    from nodeprep.ops.train import quarantine

    for n in res.released:
        print(f"released {n}: back in service")
    for n, rec in res.held.items():
        print(quarantine.line(n, rec))
    if not res.released and not res.held:
        print("no node is quarantined")
