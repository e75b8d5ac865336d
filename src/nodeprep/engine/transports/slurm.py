"""A transport: the per-node scripts of one stage run as ONE Slurm step (srun) over the nodes.

The controller holds ONE ssh connection, to the head (a node that can run srun, as a login
node can). Per batch it hands the head a single script; the head broadcasts the batch's
bundle to the nodes with `sbcast` (Slurm's tree), then `srun --ntasks-per-node=1 --label`
runs the bundle once on every node, and each task picks ITS node's script from the bundle by
the node name slurmd gave it (SLURMD_NODENAME, set before any of our code runs).

This module is pure (text in, text out): the bundle, the head's script, the parsing of the
answer, the mapping of inventory nodes to Slurm nodes. engine/transports/slurmrun.py runs it.

What crosses the wire per batch is O(N): the distinct scripts once each (scripts that differ
only by their random fence tokens are ONE script; each node's tokens travel in its line of
the bundle's table) plus a line per node. Each task's stdout and stderr come back
base64-encoded between the markers, so nothing a node prints can forge a marker; srun's
--label puts every line under its task, so nothing a node prints can pass for another node's.
A node's task that never printed its last marker (died, killed, node down) is that node's
failure, with srun's last words; it never hangs the others (each task's script is bounded by
`timeout` on its node, the whole step by the head's own limit).
"""

from __future__ import annotations

import base64
import re
import shlex
from collections import Counter
from dataclasses import dataclass

from nodeprep.errors import InputError

# fence tokens the engine's scripts carry (facts/probe.py, fanout.py, provision's apply):
# `@@<hex>:`; the same script with other tokens is the same script
_TOKEN = re.compile(r"@@([0-9a-f]{8,64}):")
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
SINFO = "sinfo -h -N -o '%N|%o|%n'"  # NodeName | NodeAddr | NodeHostname
TOOLS = ("srun", "sbcast", "salloc", "sinfo")


@dataclass
class Answer:
    """One node's result, as Session.run returns it (engine.session.CmdResult's fields)."""

    rc: int
    stdout: str
    stderr: str
    timed_out: bool = False


def templated(script: str) -> tuple[str, list[str]]:
    """(SCRIPT with its fence tokens replaced by placeholders, the tokens in order)."""
    tokens = list(dict.fromkeys(_TOKEN.findall(script)))
    for i, t in enumerate(tokens):
        script = script.replace(t, f"__NPK{i}__")
    return script, tokens


def step_file(token: str) -> str:
    """Where sbcast puts a step's bundle on every node."""
    return f"/tmp/nodeprep-step-{token}.sh"


def bundle(items: list[tuple[str, str, int]], token: str, prev: str | None = None) -> str:
    """The script every task runs; ITEMS: (Slurm node name, script, timeout s). Distinct
    scripts (modulo their tokens) are written once, as shell functions; a table maps each
    node to its script, its tokens (hex) and its timeout. The task leaves its own file (a
    /tmp shared by the nodes would lose it under the others' feet) and removes the one of
    the step before (PREV: its token), which every task has finished reading."""
    funcs: dict[str, int] = {}
    table = []
    for node, script, limit in items:
        body, tokens = templated(script)
        k = funcs.setdefault(body, len(funcs))
        subst = ";".join(f"s/__NPK{i}__/{t}/g" for i, t in enumerate(tokens)) or "p;d"
        table.append(f"{shlex.quote(node)}) s={k}; x='{subst}'; l={int(limit)};;")
    end = f"NP_{token}"
    parts = [
        f"rm -f {step_file(prev)} 2>/dev/null" if prev else ":",
        "umask 077",
        f"T={token}",
        'n="$SLURMD_NODENAME"',
    ]
    for body, k in funcs.items():
        parts.append(f"p{k}() {{ cat <<'{end}_{k}'\n{body.rstrip(chr(10))}\n{end}_{k}\n}}")
    parts.append(
        'case "$n" in\n'
        + "\n".join(table)
        + '\n*) echo "@@$T:node=$n@@"; echo "@@$T:rc=253:0@@"; exit 0;;\nesac'
    )
    # the work in a subshell: whatever kills it, the task itself ends normally (a task killed
    # by a signal makes srun end the whole step, the other nodes' answers with it) and still
    # removes the task's temp directory
    parts.append(
        'd=$(mktemp -d "${TMPDIR:-/tmp}/nodeprep-task.XXXXXX") || '
        '{ echo "@@$T:node=$n@@"; echo "@@$T:rc=252:0@@"; exit 0; }\n'
        "trap 'rm -rf \"$d\"' EXIT\ntrap 'exit 143' HUP INT TERM\n"
        '(p$s | sed "$x" > "$d/s"\nt0=$(date +%s)\n'
        'timeout -k 5 "$l" /bin/sh "$d/s" </dev/null >"$d/o" 2>"$d/e"; r=$?\n'
        'echo "@@$T:node=$n@@"; base64 < "$d/o"; echo "@@$T:e@@"; base64 < "$d/e"\n'
        'echo "@@$T:rc=$r:$(( $(date +%s) - t0 ))@@")\nexit 0'
    )
    return "\n".join(parts) + "\n"


def head_script(
    nodes: list[str], token: str, limit: int, jobid: str | None, bundle_path: str
) -> str:
    """sh for the head: the step over NODES (Slurm names) running the bundle at BUNDLE_PATH
    (already on the head); inside job JOBID, else in an allocation of its own for this step
    (salloc: released when the step ends, at the latest after LIMIT); --overlap: a step
    inside a job whose CPUs a running step holds (training) still starts. Prints srun's labelled
    lines, then the head's own fenced lines: `@@T:head=RC@@` and srun's last stderr lines."""
    q = shlex.quote
    dest = step_file(token)
    listing = "\n".join(nodes)
    step = (
        f'sbcast -f {q(bundle_path)} {dest} 2>>"$h/err" || exit 3\n'
        f'srun -N {len(nodes)} --nodelist="$h/nodes" --ntasks-per-node=1 --label --input=none '
        f'--overlap --kill-on-bad-exit=0 --job-name=nodeprep /bin/sh {dest} 2>>"$h/err"\n'
    )
    if jobid:
        run = f'SLURM_JOB_ID={q(jobid)} SLURM_JOBID={q(jobid)} /bin/sh "$h/job"'
    else:
        minutes = max(1, -(-int(limit) // 60) + 1)
        run = (
            f'salloc -N {len(nodes)} --nodelist="$h/nodes" --immediate=30 --quiet -t {minutes} '
            f'--job-name=nodeprep /bin/sh "$h/job" 2>>"$h/err"'
        )
    return (
        "\n".join(
            [
                "umask 077",
                'h=$(mktemp -d "${TMPDIR:-/tmp}/nodeprep-slurm.XXXXXX") || exit 1',
                f"trap 'rm -rf \"$h\" {q(bundle_path)}' EXIT",
                "trap 'exit 143' HUP INT TERM",
                "export h",
                f"cat > \"$h/nodes\" <<'NP_{token}_nodes'\n{listing}\nNP_{token}_nodes",
                f"cat > \"$h/job\" <<'NP_{token}_job'\n{step.rstrip()}\nNP_{token}_job",
                run,
                "r=$?",
                f'echo "@@{token}:head=$r@@"',
                f'tail -n 20 "$h/err" 2>/dev/null | sed "s/^/@@{token}:err@@ /"',
                "exit 0",
            ]
        )
        + "\n"
    )


def cleanup_script(nodes: list[str], token: str, jobid: str | None) -> str:
    """sh for the head: the step file of TOKEN off NODES, in the background (setsid: it
    outlives the ssh session, which returns at once), in job JOBID or a one-step allocation."""
    q = shlex.quote
    env = f"SLURM_JOB_ID={q(jobid)} SLURM_JOBID={q(jobid)} " if jobid else ""
    listing = "\n".join(nodes)
    return (
        "\n".join(
            [
                "umask 077",
                'f=$(mktemp "${TMPDIR:-/tmp}/nodeprep-clean.XXXXXX") || exit 1',
                f"cat > \"$f\" <<'NP_{token}_nodes'\n{listing}\nNP_{token}_nodes",
                f"{env}setsid sh -c 'srun -N {len(nodes)} "
                '--nodelist="$1" --ntasks-per-node=1 --input=none --overlap '
                "--immediate=30 --time=1 --job-name=nodeprep "
                f'rm -f {step_file(token)}; rm -f "$1"\' sh "$f" '
                ">/dev/null 2>&1 </dev/null &",
                "exit 0",
            ]
        )
        + "\n"
    )


def _decode(lines: list[str]) -> str:
    return base64.b64decode("".join(lines).encode(), validate=False).decode(errors="replace")


def _task(lines: list[str], token: str) -> tuple[str, Answer] | None:
    """One task's labelled lines -> (its Slurm node, its answer); None if it did not finish."""
    if not lines or not (lines[0].startswith(f"@@{token}:node=") and lines[0].endswith("@@")):
        return None
    node = lines[0][len(token) + 8 : -2]
    last = lines[-1]
    m = re.fullmatch(rf"@@{token}:rc=(\d+):(\d+)@@", last)
    if m is None or f"@@{token}:e@@" not in lines:
        return None
    e = lines.index(f"@@{token}:e@@")
    rc = int(m.group(1))
    return node, Answer(
        rc, _decode(lines[1:e]), _decode(lines[e + 1 : -1]), timed_out=rc in (124, 137)
    )


def parse(output: str, token: str, nodes: list[str], limits: dict[str, int]) -> dict[str, Answer]:
    """The head's answer -> {Slurm node: Answer} for every node of NODES. A node whose task
    left no whole answer gets rc 255 and srun's last words naming it (or all of them)."""
    by_task: dict[int, list[str]] = {}
    head_rc, errs = None, []
    for line in output.splitlines():
        if line.startswith(f"@@{token}:head=") and line.endswith("@@"):
            head_rc = int(line[len(token) + 8 : -2] or -1)
        elif line.startswith(f"@@{token}:err@@ "):
            errs.append(line[len(token) + 8 :])
        else:
            m = _LABEL.match(line)
            if m:
                by_task.setdefault(int(m.group(1)), []).append(m.group(2))
    out: dict[str, Answer] = {}
    for lines in by_task.values():
        got = _task(lines, token)
        if got and got[0] in nodes and got[0] not in out:
            out[got[0]] = got[1]
    for n, a in out.items():
        if a.timed_out:
            a.stderr += f"\n(timed out after {limits.get(n, 0)}s)"
    for n in nodes:
        if n not in out:
            said = [e for e in errs if n in e] or errs[-3:]
            why = "; ".join(said) or ("the step did not start" if head_rc else "no answer")
            out[n] = Answer(
                255, "", f"slurm task on {n} ended without a result (srun exit {head_rc}): {why}"
            )
    return out


def node_map(hosts, sinfo: str, head: str, allocation: list[str] | None = None) -> dict[str, str]:
    """{inventory node: Slurm node}. SINFO: `sinfo -h -N -o '%N|%o|%n'` as the head printed
    it. A node is Slurm's if its name, its address or its short name is a Slurm NodeName,
    NodeAddr or NodeHostname (in that order). ALLOCATION: the job's nodes, when inside one.
    A node Slurm does not know (or the job does not hold) is an InputError naming it."""
    names = set()
    by_addr = {}
    by_host = {}
    for line in sinfo.splitlines():
        f = line.strip().split("|")
        if len(f) == 3 and f[0]:
            names.add(f[0])
            by_addr.setdefault(f[1], f[0])
            by_host.setdefault(f[2], f[0])
    out, missing = {}, []
    for h in hosts:
        short = h.name.split(".")[0]
        got = next(
            (
                x
                for x in (
                    h.name if h.name in names else None,
                    by_addr.get(h.address or ""),
                    by_host.get(h.name),
                    short if short in names else None,
                    by_host.get(short),
                )
                if x
            ),
            None,
        )
        if got is None or (allocation is not None and got not in allocation):
            missing.append(h.name)
        else:
            out[h.name] = got
    if missing:
        where = (
            "this job's allocation" if allocation is not None else f"the Slurm cluster {head} sees"
        )
        raise InputError(
            f"--via slurm: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} "
            f"not in {where} ({len(missing)} of {len(out) + len(missing)} nodes)",
            hint=f"check `sinfo -N` on {head}; a node's Slurm NodeName, NodeAddr or "
            "NodeHostname must be its inventory name or address; or use --via ssh",
        )
    dup = [s for s, k in Counter(out.values()).items() if k > 1]
    if dup:
        raise InputError(
            f"--via slurm: two inventory nodes are the same Slurm node {sorted(dup)[0]}",
            hint="one inventory entry per machine, or use --via ssh",
        )
    return out
