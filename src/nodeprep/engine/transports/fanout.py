"""A transport: probes that ride the head node's OpenSSH logins to the other nodes.

The controller opens ONE connection (to the head); the head logs in to every peer exactly as
pdsh or mpirun would (BatchMode, pinned host keys) and each login carries that peer's fact
probe on stdin. N logins in all instead of N connections from here plus N mesh logins, and
the controller's work stays flat as the fleet grows. A node whose answer does not come back
whole is left out of the answer; the caller probes it over its own connection."""

from __future__ import annotations

import ipaddress
import secrets
import shlex

from nodeprep.engine.facts import parse_sections, probe_script, split_sections

# The OpenSSH client as launchers use it. BatchMode + StrictHostKeyChecking=yes: a prompt or
# an unknown key counts as a failure, exactly what pdsh/mpirun would hit. UpdateHostKeys=no:
# a check writes nothing (OpenSSH would otherwise add the peer's other host key types to
# known_hosts). curve25519: OpenSSH 9.2's default post-quantum hybrid kex costs ~70 ms more
# per handshake, which is all a login check pays for.
SSH_CLIENT = (
    "ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o UpdateHostKeys=no -o ConnectTimeout=5 "
    "-o ServerAliveInterval=5 -o ServerAliveCountMax=3 "
    "-o KexAlgorithms=curve25519-sha256,curve25519-sha256@libssh.org,ecdh-sha2-nistp256,"
    "diffie-hellman-group14-sha256"
)

FANOUT_MAX = 100_000  # bytes of head script: posix() passes it as ONE argument (128 KiB cap)
PARALLEL = 128  # logins in flight at once on the head (pdsh's default fanout is 32)


def fanout_script(peers: list[str], probes: dict[str, str], timeout: int, token: str) -> str:
    """sh for the head node: one ssh login per peer, PARALLEL at a time, each carrying that
    peer's fact probe (PROBES: name -> probe script, fed on stdin; peers without one run
    `true`). Prints every login's output fenced by TOKEN (`n<i>` sections whose rc is ssh's
    exit status: 255 = the login failed) and the last lines of each login's stderr (`e<i>`).
    A probe cannot forge another node's section: TOKEN is only ever sent to the head.
    Identical probes are written once, and the peers are a list of words (inventory names are
    host names or addresses: fields.py) that one loop walks, so the script grows by ~20 bytes
    a peer, not by a command line each (that capped the fan-out near 200 peers).
    Each login is bounded on the head (TIMEOUT + 20 s; keepalives catch a peer that dies
    mid-session) and each probe on its node (TIMEOUT), so one stuck node costs its own
    answer, not everyone's; the caller gives the whole script TIMEOUT + 40 s."""
    # The answers (env files included) wait in a 0700 directory, files 0600, that goes on
    # TERM and on a closed pipe (the controller went away) too.
    lines = [
        "umask 077",
        '_npf=$(mktemp -d "${TMPDIR:-/tmp}/nodeprep-fan.XXXXXX") || exit 1',
        "trap 'rm -rf \"$_npf\"' EXIT",
        "trap 'exit 143' HUP INT TERM",
        "trap 'exit 141' PIPE",
        "export _npf",
    ]
    files: dict[str, str] = {}
    for script in dict.fromkeys(probes.values()):
        f = files[script] = f"p{len(files)}"
        end = f"NODEPREP_{token}_{f}"
        lines.append(f"cat > \"$_npf/{f}\" <<'{end}'\n{script.rstrip(chr(10))}\n{end}")
    listing = "\n".join(
        f"{i} {shlex.quote(p)} {files[probes[p]] if p in probes else '-'}"
        for i, p in enumerate(peers)
    )
    lines.append(
        f"cat > \"$_npf/list\" <<'NODEPREP_{token}_list'\n{listing}\nNODEPREP_{token}_list"
    )
    ssh = f"timeout -k 5 {int(timeout) + 20} {SSH_CLIENT}"
    # one login: $1 index, $2 peer, $3 its probe file (- = none); no ' inside (quoted below)
    one = (
        f'{{ echo "@@{token}:n$1@@"; if [ "$3" = - ]; then {ssh} -- "$2" true </dev/null; '
        f'else {ssh} -- "$2" "timeout -k 5 {int(timeout)} /bin/sh" < "$_npf/$3"; fi '
        f'2>"$_npf/e$1"; r=$?; echo; echo "@@{token}:rc=$r@@"; }} > "$_npf/o$1"'
    )
    # xargs in the background, then `wait`: a TERM interrupts `wait` at once (it would wait
    # for a foreground child first), so the answers go with the run
    lines += [
        f"xargs -n 3 -P {PARALLEL} sh -c '{one}' sh < \"$_npf/list\" &",
        "wait $!",
        'cat "$_npf"/o*',
        f'for f in "$_npf"/e*; do [ -s "$f" ] && {{ echo "@@{token}:${{f##*/}}@@"; '
        f'tail -n 3 "$f"; echo "@@{token}:rc=0@@"; }}; done',
        "exit 0",
    ]
    return "\n".join(lines) + "\n"


def _address_mismatch(host, facts, head: str) -> str | None:
    """The head dialled the NAME; the answer counts only if it came from the machine the
    inventory means (stale DNS or a hand-made alias would credit the wrong one)."""
    try:
        ip = str(ipaddress.ip_address(host.address or ""))
    except ValueError:
        return None
    seen = facts.get("interfaces")
    if seen is not None and ip not in {a for addrs in seen.values() for a in addrs}:
        return (
            f"the login reached a machine without {host.name}'s address {ip} "
            f"(what does {host.name} resolve to on {head}?)"
        )
    return None


def probe_via_head(
    session, hosts, requests: dict, host_vars: dict, peers: list[str], timeout: int
) -> tuple[dict, dict] | None:
    """The head's ONE command: a login to every peer (the mesh check), each carrying the
    peer's probe (REQUESTS: {node: fact requests}; HOST_VARS: {node: vars}). Returns
    ({node: FactValues} for the nodes whose probe came back whole, {peer: (rc, error)} for
    the head's logins). None when the fan-out itself failed (script too big, no temp dir,
    killed): the caller then does it all the direct way."""
    head = session.name
    token, inner = secrets.token_hex(6), secrets.token_hex(6)
    probes = {n: probe_script(r, host_vars[n], inner) for n, r in requests.items()}
    script = fanout_script(peers, probes, timeout, token)
    if len(script) * 4 // 3 > FANOUT_MAX:
        session.log(
            f"fan-out script of {len(script)} bytes: too big for one command; direct probes\n"
        )
        return None
    r = session.run(
        script,
        timeout=timeout + 40,
        label=f"probes of {len(probes)} node(s) over the ssh mesh from {head} "
        f"({len(peers)} logins)",
        log_output=False,
    )
    sections = split_sections(r.stdout, token)
    if r.rc != 0 or not any(f"n{i}" in sections for i in range(len(peers))):
        session.log(f"fan-out failed (exit {r.rc}): {r.tail(2)}; direct probes\n")
        return None
    by_name = {h.name: h for h in hosts}
    mesh, got = {}, {}
    for i, p in enumerate(peers):
        text, rc = sections.get(f"n{i}", ("", -1))
        err = sections.get(f"e{i}", ("", 0))[0].strip().splitlines()
        # logged in: `true` said 0, or the probe started (its first marker came back); a shell
        # that refuses commands (nologin) fails the pair, as it would fail pdsh
        if not (rc == 0 or (p in probes and f"@@{inner}:" in text)):
            mesh[p] = (
                rc,
                err[-1] if err else ("no answer from the mesh check" if rc == -1 else ""),
            )
            continue
        mesh[p] = (0, "")
        if p in probes:
            try:
                f = parse_sections(p, requests[p], text, inner, rc, "\n".join(err[-2:]))
            except Exception:  # noqa: BLE001 -- the direct probe will tell what is wrong
                continue
            wrong = _address_mismatch(by_name[p], f, head)
            if wrong:
                mesh[p] = (1, wrong)
                continue
            got[p] = f
    return got, mesh
