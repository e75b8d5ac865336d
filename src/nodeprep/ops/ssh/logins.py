"""The ssh mesh as launchers need it: who logs in to whom (pdsh, mpirun and the DeepSpeed
runner log in from the head to every node), the sh that tries those logins for real, and
the reading of its answer. The on-paper check of every pair is meshcheck.py."""

from __future__ import annotations

import shlex

from nodeprep.engine.transports.fanout import SSH_CLIENT


def mesh_start(peers: list[str]) -> str:
    """sh that starts one ssh login per peer in the background (in the calling shell, so a
    later mesh_collect can `wait` for them while other work runs meanwhile); the client's
    options are engine.fanout.SSH_CLIENT (BatchMode, pinned keys, nothing written). The peers
    go as a list that a loop walks (~20 bytes a peer: a command line each capped the head's
    command near 500 peers)."""
    for p in peers:  # read -r takes the words as they are: inventory names (fields.py)
        if shlex.quote(p) != p:
            raise ValueError(f"mesh peer {p!r} is not a plain host name")
    listing = "".join(f"{i} {p}\n" for i, p in enumerate(peers))
    return (
        '_npm=$(mktemp -d "${TMPDIR:-/tmp}/nodeprep-mesh.XXXXXX") || exit 1\n'
        f"cat > \"$_npm/list\" <<'NODEPREP_MESH_LIST'\n{listing}NODEPREP_MESH_LIST\n"
        f'while read -r i p; do ( {SSH_CLIENT} -- "$p" true </dev/null >/dev/null 2>"$_npm/e$i"; '
        'printf \'%s %s\\n\' "$p" "$?" > "$_npm/r$i" ) & done < "$_npm/list"\n'
    )


def mesh_collect(peers: list[str]) -> str:
    """sh that waits for mesh_start's logins and prints `PEER RC` lines, then `PEER: error`."""
    return (
        'wait\nwhile read -r i p; do cat "$_npm/r$i" 2>/dev/null; [ -s "$_npm/e$i" ] && '
        'printf \'%s: %s\\n\' "$p" "$(tail -n 1 "$_npm/e$i")"; done < "$_npm/list"\n'
        'rm -rf "$_npm"\n'
    )


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
    return (
        via != "direct"
        and all(not p for n, p in pairs.items() if n != head)
        and bool(pairs.get(head))
    )


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
