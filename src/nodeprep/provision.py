"""`invoke provision`: validate, probe every node once, plan the steps of every role, apply
only what differs (one batched command per node, re-reading the facts it touched in the same
round trip), and report per node and per step.

A node with nothing to change costs one round trip. --check stops after the plan and lists
what would change (--diff: the file diffs, secrets redacted).
"""
from __future__ import annotations

import json
import secrets
import sys

from . import facts as factmod
from . import roles as rolemod
from .errors import NodeprepError
from .executor import Fleet
from .redact import Redactor, is_secret
from .report import Display, StepResult
from .steps import Step, action_for


def _redactor(run: rolemod.Run, steps: list[Step]) -> Redactor:
    """Secrets are the values of secret-looking names in the environment mappings that reach
    the ranks, plus what steps declare (e.g. the cluster private key). Inventory variables such
    as `key` or `controller_key` are paths, not secrets."""
    values = [str(v) for vs in run.vars.values() for m in ("deepspeed_env", "nccl_env")
              for k, v in (vs.get(m) or {}).items() if is_secret(k)]
    values += [s for st in steps for s in st.secrets]
    return Redactor(values)


def apply_script(changes: list[tuple[Step, str]], rereads: list, token: str) -> str:
    """Run the actions in order, stopping at the first failure, then re-read their facts."""
    parts = ["np_fail=0"]
    for i, (_step, action) in enumerate(changes):
        parts.append(
            f"echo '@@{token}:a{i}@@'\n"
            f"if [ $np_fail -eq 0 ]; then ( {action}\n) 2>&1 </dev/null; np_rc=$?\n"
            f"  [ $np_rc -eq 0 ] || np_fail=1\nelse echo '@@skipped@@'; np_rc=0; fi\n"
            f"echo \"@@{token}:rc=$np_rc@@\"")
    return "\n".join(parts) + "\n" + factmod.probe_script(rereads, {}, token)


def _plan_node(ctx: rolemod.Ctx, roles: list[rolemod.Role]) -> list[Step]:
    steps = []
    for role in roles:
        for st in role.call("steps", ctx, default=[]) or []:
            st.role = role.name
            steps.append(st)
    return steps


def _check_all(session, steps: list[Step], facts: dict, check_mode: bool):
    """Compare every step with the facts; returns [(step, Check)] of those that differ."""
    differ = []
    # Facts a role did not declare up front cost one more round trip, not a failure.
    missing = list(dict.fromkeys(r for st in steps for r in st.reads if factmod._key(r) not in facts))
    if missing:
        facts.update(factmod.gather(session, missing))
    for st in steps:
        c = st.check(facts)
        if c.ok:
            session.result.add_step(StepResult(f"{st.role}: {st.name}", "ok"))
        elif st.action is None:
            session.result.add_step(StepResult(f"{st.role}: {st.name}", "failed",
                                               c.why + (f"; {st.hint}" if st.hint else "")))
        else:
            differ.append((st, c))
            if check_mode:
                session.result.add_step(StepResult(f"{st.role}: {st.name}", "changed",
                                                   "would change: " + c.why))
    return differ


def _apply(session, differ, facts: dict, redact: Redactor) -> None:
    if session.result.status == "failed":   # a step nodeprep cannot fix already failed
        for st, _c in differ:
            session.result.add_step(StepResult(f"{st.role}: {st.name}", "skipped",
                                               "not applied: an earlier step failed"))
        return
    for i, (st, _c) in enumerate(differ):
        if st.before is None:
            continue
        session.display.status(session.name, "apply", "running", f"upload for {st.role}: {st.name}")
        try:
            st.before(session, facts)
        except (OSError, NodeprepError) as e:   # an upload failed: nothing after it runs
            session.result.add_step(StepResult(f"{st.role}: {st.name}", "failed", str(e)))
            for later, _ in differ[i + 1:]:
                session.result.add_step(StepResult(f"{later.role}: {later.name}", "skipped",
                                                   "an earlier step failed"))
            differ = differ[:i]
            break
    if not differ:
        return
    token = secrets.token_hex(6)
    changes, view = [], dict(facts)
    for st, _c in differ:     # each action planned on the node as the earlier ones leave it
        changes.append((st, action_for(st, view)))
        if st.after:
            view.update(st.after(view))
    rereads = list(dict.fromkeys(r for st, _c in differ for r in st.reads))
    names = [f"{st.role}: {st.name}" for st, _ in changes]
    marks = {f"@@{token}:a{i}@@": i for i in range(len(changes))}

    def progress(line: str):   # the live display shows the step the node is in now
        i = marks.get(line)
        if i is not None:
            session.display.status(session.name, "apply", "running",
                                   f"step {i + 1}/{len(names)}: {names[i]}")
    r = session.run(apply_script(changes, rereads, token),
                    label=f"apply {len(changes)} step(s): " + ", ".join(s.name for s, _ in changes)[:250],
                    log_output=False, on_line=progress)
    sections = factmod.split_sections(r.stdout, token)
    after = facts          # updated in place: reports and later stages see the node as it is now
    if all(t in sections for t in factmod.section_tags(rereads)):
        after.update(factmod.parse_sections(session.name, rereads, r.stdout, token, r.rc))
    for i, (st, c) in enumerate(differ):
        label = f"{st.role}: {st.name}"
        out, rc = sections.get(f"a{i}", ("", None))
        if rc is None:
            session.result.add_step(StepResult(label, "failed", f"no result (exit {r.rc})"),
                                    redact(r.tail()))
        elif out.strip() == "@@skipped@@":
            session.result.add_step(StepResult(label, "skipped", "an earlier step failed"))
        elif rc != 0:
            tail = "\n".join(out.strip().splitlines()[-12:])
            session.result.add_step(StepResult(label, "failed", f"exit {rc}" + (
                f"; {st.hint}" if st.hint else "")), redact(tail))
        else:
            again = st.check(after)
            status, msg = ("changed", c.why) if again.ok else ("failed", "still differs after "
                                                                f"applying: {again.why}")
            session.result.add_step(StepResult(label, status, msg))


def provision(inv, hosts, settings, role_names=None, check=False, diff=False, json_mode=False,
              password=None) -> int:
    roles = rolemod.load(role_names)
    run = rolemod.Run(inv, hosts, settings, check)
    run.vars = {h.name: {n: inv.var(h, n) for n in inv.schema} for h in hosts}
    for role in roles:
        role.call("validate", run)          # InputError here: nothing touched yet
    display = Display.auto(to_stderr=json_mode)
    plans: dict[str, list[Step]] = {}
    with Fleet(hosts, settings, "provision", display, password=password) as fleet:
        def probe(s):
            ctx = rolemod.Ctx(s.host, run)
            reqs = ["hostname"] + [f for r in roles for f in r.facts()]
            reqs += [q for r in roles for q in r.reads(ctx)]
            return factmod.gather(s, list(dict.fromkeys(reqs)), run.vars[s.name])
        run.facts = fleet.map(probe, "facts")
        controller = [res for role in roles for res in (role.call("controller", run) or [])]

        def plan(s):
            plans[s.name] = _plan_node(rolemod.Ctx(s.host, run), roles)
            return _check_all(s, plans[s.name], run.facts[s.name], check)
        differ = fleet.map(plan, "plan")
        redact = _redactor(run, [st for p in plans.values() for st in p])
        if not check:
            fleet.map(lambda s: _apply(s, differ[s.name], run.facts[s.name], redact)
                      if differ.get(s.name) else None, "apply")
        for s in fleet.usable():
            ctx = rolemod.Ctx(s.host, run)
            for role in roles:
                s.result.data.update(role.call("report", ctx) or {})
        report = fleet.report(inventory=inv.name, check=check,
                              controller=[c.as_dict() for c in controller], notes=run.notes)
    if diff:
        for node, items in differ.items():
            for st, c in items:
                if c.diff:
                    print(redact(f"--- {node}: {st.role}: {st.name}\n{c.diff}"), file=sys.stderr if json_mode else sys.stdout)
    if json_mode:
        print(redact(json.dumps(report, indent=2, default=str)))
    else:
        _summary(report, controller, run.notes, check, redact)
    return 1 if report["failed"] or report["unreachable"] else 0


def _summary(report, controller, notes, check, redact) -> None:
    out = sys.stdout
    for c in controller:
        if c.status != "ok":
            print(f"controller  {c.name}: {c.status}" + (f"  {c.message}" if c.message else ""), file=out)
    for n in notes:
        print(f"note: {n}", file=out)
    verb = "would change" if check else "changed"
    width = max([len(n) for n in report["nodes"]] + [4])
    for node, r in report["nodes"].items():
        steps = r.get("steps", [])
        ok = sum(s["status"] == "ok" for s in steps)
        print(f"{node:<{width}}  {r['status']:<11} ok={ok} {verb}={r['changed']} failed={r['failed']}", file=out)
        for s in steps:
            if s["status"] in ("changed", "failed"):
                print(redact(f"{'':<{width}}    {s['status']}: {s['step']}: {s['message']}"), file=out)
        if r["status"] in ("failed", "unreachable"):
            print(redact(f"{'':<{width}}    {r.get('message', '')}"), file=out)
            for line in (r.get("stderr_tail") or "").splitlines():
                print(redact(f"{'':<{width}}      | {line}"), file=out)
    total = report["changed"]
    if not total and not report["failed"] and not report["unreachable"]:
        print(f"{len(report['nodes'])} nodes: nothing to change, every step already matches", file=out)
    else:
        print(f"{len(report['nodes'])} nodes: {verb} {total} step(s), {report['failed']} failed, "
              f"{report['unreachable']} unreachable; log: {report['run_dir']}", file=out)
