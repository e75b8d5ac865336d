"""The launch contract `train` checks before it starts anything, each failure naming the node
and the fix:

- the launcher's programs on a NON-INTERACTIVE ssh PATH (what pdsh and mpirun get): `pdsh` or
  `mpirun` on the head, Open MPI's `orted` on every node, `srun` on the head, the venv's
  `deepspeed` entry point;
- the rendezvous port reachable from every node to the head (a listener on the head, a
  connect from each node), not only free on the head;
- `~/.deepspeed_env` readable the way DeepSpeed's runner reads it (ops/launchenv/dsenv.py), and the
  variables nodeprep's env file exports that the runner would not forward;
- every module the inventory names loaded in that non-interactive shell (issue 46).
"""

from __future__ import annotations

import re
import shlex

from nodeprep.ops.launchenv import dsenv


def needed(launcher: str, ds_launcher: str) -> tuple[list[str], list[str]]:
    """(programs the head needs, programs every node needs) on its non-interactive PATH."""
    if launcher == "deepspeed":
        return (["pdsh"], []) if ds_launcher == "pdsh" else (["mpirun"], ["orted"])
    if launcher == "mpirun":
        return ["mpirun"], ["orted"]
    if launcher == "srun":
        return ["srun"], []
    return [], []


def missing_programs(launcher: str, ds_launcher: str, have: dict[str, set], head: str) -> list[str]:
    head_needs, all_need = needed(launcher, ds_launcher)
    out = []
    for node, progs in have.items():
        wants = all_need + (head_needs if node == head else [])
        for p in wants:
            if p not in progs:
                out.append(
                    f"{node}: `{p}` is not on the PATH a non-interactive ssh login gets "
                    f"({launcher} needs it there): install it, or add its directory to PATH "
                    "in the login shell's non-interactive startup file"
                )
    return out


def listen_script(python: str, port: int, accepts: int, seconds: int = 15) -> str:
    """sh: listen on PORT in the background (accepting and closing) until ACCEPTS connections
    came or SECONDS passed; says 'pid N' and 'ready'. When every node connected it has let the
    port go by itself; otherwise stop it with `kill N`."""
    py = (
        "import socket,sys,time\n"
        "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('', {int(port)})); s.listen(128); s.settimeout(0.5)\n"
        "print('ready', flush=True); sys.stdout.close()\n"
        f"end=time.time()+{int(seconds)}; n={int(accepts)}\n"
        "while n>0 and time.time()<end:\n"
        "    try: s.accept()[0].close(); n-=1\n"
        "    except OSError: pass\n"
    )
    return (
        f"setsid {shlex.quote(python)} -c {shlex.quote(py)} "
        '> "$HOME/.nodeprep/listen.$$" 2>&1 < /dev/null &\n'
        'echo "pid $!"\n'
        "i=0\n"
        "while [ $i -lt 50 ]; do\n"
        '  grep -q ready "$HOME/.nodeprep/listen.$$" 2>/dev/null && break\n'
        "  sleep 0.1\n"
        "  i=$((i+1))\n"
        "done\n"
        'cat "$HOME/.nodeprep/listen.$$"\n'
        'rm -f "$HOME/.nodeprep/listen.$$"'
    )


def connect_script(python: str, address: str, port: int) -> str:
    py = (
        "import socket\ntry:\n"
        f"    socket.create_connection(({address!r}, {int(port)}), 3).close(); print('ok')\n"
        "except OSError as e:\n    print('fail', e)\n"
    )
    return f"{shlex.quote(python)} -c {shlex.quote(py)}"


def env_exports(text: str) -> dict[str, str]:
    """`export NAME=VALUE` lines of nodeprep's env file (what the head's shell sets)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"\s*export\s+([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def deepspeed_env_problems(
    head: str, ds_file: dict | None, env_file: dict | None, ds_launcher: str, gpus: int
) -> list[str]:
    """~/.deepspeed_env as DeepSpeed parses it, and the exported variables it would drop."""
    files = []
    if ds_file and ds_file.get("exists") and ds_file.get("content") is not None:
        files.append(
            dsenv.parse(
                ds_file["content"],
                f"{head}:~/.deepspeed_env",
                "openmpi" if ds_launcher == "openmpi" else "pdsh",
            )
        )
    problems = [p for f in files for p in f.problems]
    exported = env_exports((env_file or {}).get("content") or "")
    exported.pop("PATH", None)  # the runner starts each rank with the head's interpreter
    problems += [
        f"{head}: {line}"
        for line in dsenv.dropped(exported, list(exported), files, "cuda" if gpus else "cpu")
    ]
    return problems


def module_problems(named: dict[str, list], loaded: dict[str, list]) -> list[str]:
    """One line per node whose non-interactive ssh shell (what the ranks start from) lacks a
    module NAMED for it (as the node's module system resolves the inventory's names: the
    MODULES fact's loaded list, cuda/12.6 -> cuda/12.6.3); LOADED: what that shell has loaded
    (RANK_MODULES). A name without a version (cuda) is loaded by any version of it."""
    out = []
    for node, mods in named.items():
        have = loaded.get(node) or []
        lack = [m for m in mods if not any(h == m or h.startswith(m + "/") for h in have)]
        if lack:
            out.append(
                f"{node}: ranks would run without module {', '.join(lack)} (a non-interactive "
                f"ssh shell there has {', '.join(have) or 'no module'} loaded): run `invoke "
                "provision` (the modules role's block in the env file loads them; the shell "
                "role makes every shell read that file)"
            )
    return out
