"""The ssh mesh as launchers need it: who logs in to whom (pdsh, mpirun and the DeepSpeed
runner log in from the head to every node), the sh that tries those logins for real, and
the reading of its answer. The on-paper check of every pair is meshcheck.py."""
from __future__ import annotations

import shlex

from nodeprep.engine.fanout import SSH_CLIENT


def mesh_start(peers: list[str]) -> str:
    """sh that starts one ssh login per peer in the background (in the calling shell, so a
    later mesh_collect can `wait` for them while other work runs meanwhile); the client's
    options are engine.fanout.SSH_CLIENT (BatchMode, pinned keys, nothing written)."""
    lines = ['_npm=$(mktemp -d "${TMPDIR:-/tmp}/nodeprep-mesh.XXXXXX") || exit 1']
    for i, p in enumerate(peers):
        q = shlex.quote(p)
        lines.append(f'( {SSH_CLIENT} -- {q} true </dev/null >/dev/null 2>"$_npm/e{i}"; '
                     f'printf \'%s %s\\n\' {q} "$?" > "$_npm/r{i}" ) &')
    return "\n".join(lines) + "\n"


def mesh_collect(peers: list[str]) -> str:
    """sh that waits for mesh_start's logins and prints `PEER RC` lines, then `PEER: error`."""
    out = ["wait"]
    for i, p in enumerate(peers):
        q = shlex.quote(p)
        out.append(f'cat "$_npm/r{i}" 2>/dev/null; [ -s "$_npm/e{i}" ] && '
                   f'printf \'%s: %s\\n\' {q} "$(tail -n 1 "$_npm/e{i}")"')
    out.append('rm -rf "$_npm"')
    return "\n".join(out) + "\n"


def mesh_script(peers: list[str]) -> str:
    """Every peer in parallel, then the results (see mesh_start)."""
    return mesh_start(peers) + mesh_collect(peers)


def mesh_pairs(names: list[str], mode: str = "auto") -> dict[str, list[str]]:
    """Who logs in to whom for real. full: every ordered pair (N*N handshakes); head: the head
    node to every node, itself included (what pdsh, mpirun and the DeepSpeed runner do; N);
    auto: full up to 4 nodes, head beyond. Every pair is also checked on paper
    (meshcheck), so the real logins stay O(N) on big fleets."""
    if mode == "full" or (mode == "auto" and len(names) <= 4):
        return {a: list(names) for a in names}
    return {a: (list(names) if a == names[0] else []) for a in names}


def fans_out(pairs: dict[str, list[str]], head: str, via: str) -> bool:
    """Do the probes ride the head's mesh logins? Only where the head alone logs in (mesh
    head, or auto beyond 4 nodes), unless --via direct."""
    return via != "direct" and all(not p for n, p in pairs.items() if n != head) and bool(pairs.get(head))


def parse_mesh(text: str) -> dict[str, tuple[int, str]]:
    out: dict[str, tuple[int, str]] = {}
    errs: dict[str, str] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) == 2 and f[1].isdigit():
            out[f[0]] = (int(f[1]), "")
        elif ": " in line:
            peer, _, msg = line.partition(": ")
            errs[peer] = msg
    return {p: (rc, errs.get(p, "")) for p, (rc, _m) in out.items()}
