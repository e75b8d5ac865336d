"""Wheel fan-out node to node: the controller sends a platform's missing wheels ONCE, as one
tar stream, into the first node of a chain; every node of the chain stores the stream and
passes it on to the next as it arrives (`tee` into an ssh to the next node, over the cluster
key and the mesh's pinned host keys), so the controller's link carries one copy and the
fan-out takes about the time of one send plus a login per hop. A node that already holds
the platform's wheels heads the chain instead of the controller (the controller sends none).

Why a pipelined chain and not a tree: with every node's link limited, a doubling tree needs
log2(N) rounds of a whole send each (5 sends for 32 nodes), and a tree of fan-out k divides
each node's uplink by k; a chain keeps every link at full rate and costs only its logins.

Each hop is nodeside/relay_hop.py run by the node's python3 (one read, two writes and a hash per
byte, the hash listed in `.relay/.sha256`), or `tee | tar -x` where a node has no python3.
What arrives lands in `<wheelhouse>/.relay/` on each node. Nothing there is used until the
controller, over its own connection, has checked each file against ITS manifest's sha256
(finalize_script) and renamed it into place; `.relay/` is then removed. A node whose copy is
missing or wrong gets those wheels pushed directly by the controller (the fallback), and the
run's notes and report say so. Which node feeds which is pure: see chains_for(). Running a
pass's chains over the fleet is relay_run.py.
"""

from __future__ import annotations

import secrets
import shlex
import threading
from dataclasses import dataclass, field
from pathlib import Path

from nodeprep import nodeside
from nodeprep.engine.remote import SHA256_SH
from nodeprep.engine.transports.fanout import SSH_CLIENT
from nodeprep.ops.ssh import CLUSTER_KEY_SH

STAGE, HOP_SUMS = ".relay", ".sha256"  # the relay hop's directory; its sums there (relay_hop.SUMS)
# Ciphers that cost the least CPU per byte where the CPU has AES instructions; every one has
# been in OpenSSH since 6.5, so a node refusing them all is an odd one (its relay fails over).
CIPHERS = (
    "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
    "aes128-ctr,aes256-ctr"
)
MIN_RATE = 2_000_000  # bytes/s a chain may not fall below before it is given up


@dataclass(frozen=True)
class Want:
    """A node that lacks wheels of its platform."""

    node: str
    platform: str  # the wheelhouse platform key
    dest: str  # the node's wheelhouse directory, absolute
    missing: tuple[str, ...]  # wheel file names it lacks


@dataclass(frozen=True)
class MeshLogin:
    """How a node's peers log in to it over the mesh (values from the inventory)."""

    address: str
    port: int
    user: str | None


@dataclass
class Chain:
    platform: str
    source: str | None  # a node holding every wheel of the platform; None: the controller
    nodes: list[str]  # source -> nodes[0] -> nodes[1] -> ...
    files: list[str]  # what the stream carries: every wheel one of the nodes lacks


def chains_for(wants: list[Want], holders: dict[str, list[str]], order: list[str]) -> list[Chain]:
    """One chain per platform over the nodes that lack its wheels, in inventory ORDER, headed
    by the first node of HOLDERS[platform] (nodes that hold all of them) or the controller.
    The stream carries the union of what they lack: a node receiving a wheel it has already
    just replaces it with the same bytes."""
    rank = {n: i for i, n in enumerate(order)}
    chains: dict[str, Chain] = {}
    for w in sorted(wants, key=lambda w: (rank.get(w.node, len(rank)), w.node)):
        if not w.missing:
            continue
        src = next((h for h in holders.get(w.platform, []) if h != w.node), None)
        c = chains.setdefault(w.platform, Chain(w.platform, src, [], []))
        c.nodes.append(w.node)
        c.files += [f for f in w.missing if f not in c.files]
    for c in chains.values():
        c.files.sort()
    return [chains[p] for p in sorted(chains)]


def fallback(
    missing: list[str], verified: set[str], bad: set[str], error: str | None
) -> tuple[list[str], str]:
    """(wheels the controller must push itself, why; "" when the relay delivered them all)."""
    lack = [n for n in missing if n not in verified]
    if not lack:
        return [], ""
    if bad & set(lack):
        why = f"sha256 mismatch on {len(bad & set(lack))} relayed wheel(s)"
    else:
        why = f"{len(lack)} wheel(s) not received by relay"
    return lack, why + (f" ({error})" if error else "")


def _client(login: MeshLogin) -> str:
    """The ssh words to a peer over the mesh, up to its address: pinned keys only
    (StrictHostKeyChecking=yes, BatchMode), the cluster key, every value quoted."""
    user = f"-l {shlex.quote(login.user)} " if login.user else ""
    return (
        f'{SSH_CLIENT} -o IdentitiesOnly=yes -o Ciphers={CIPHERS} -i "{CLUSTER_KEY_SH}" '
        f"-p {int(login.port)} {user}"
    )


def peer_ssh(login: MeshLogin, remote: str, timeout: int, token: str | None = None) -> str:
    """A login running REMOTE on the peer; with TOKEN through the master connection
    master_command opened beforehand (ssh goes on without it when there is none)."""
    mux = f'-o ControlMaster=no -S "$HOME/{socket_path(token)}" ' if token else ""
    return (
        f"timeout -k 5 {int(timeout)} {_client(login)}{mux}-- {shlex.quote(login.address)} "
        f"{shlex.quote(remote)}"
    )


def master_command(login: MeshLogin, token: str, timeout: int) -> str:
    """A background master connection to the next node (ControlMaster), opened by every node
    of a chain at once before the stream starts: the chain's logins then cost one login, not
    one per hop in a row (~0.16 s each here, 5 s at 32 nodes). Its output goes nowhere (the
    controller's command must not wait on it); it exits with the hop script or when idle."""
    return (
        f"{_client(login)}-o ControlMaster=yes -o ControlPersist={int(timeout)} "
        f'-S "$HOME/{socket_path(token)}" -f -N -- {shlex.quote(login.address)} '
        f"</dev/null >/dev/null 2>&1 || true"
    )


def script_path(token: str) -> str:
    return f".nodeprep/relay-{token}.sh"


def socket_path(token: str) -> str:
    return f".nodeprep/relay-{token}.sock"


def _hop_program() -> str:
    """relay_hop.py as sent: its source without the module docstring (no single quote in it,
    so it goes in one single-quoted word)."""
    text = nodeside.RELAY_HOP.read_text()
    text = text[text.index('"""', 3) + 3 :].lstrip("\n")
    assert "'" not in text, "relay_hop.py must hold no single quote outside its docstring"
    return text


HOP_PROGRAM = _hop_program()


def _store(s: str, fifo: str | None) -> str:
    """sh storing stdin in the stage S (and passing it into FIFO): the python hop, or tee and
    tar where the node has no python3 (-I: no PYTHON* variable or user site; -S: no site)."""
    py = f"python3 -I -S -c '{HOP_PROGRAM}' {s}" + (f" {fifo}" if fifo else "")
    sh = f"tee -p -- {fifo} | tar -xf - -C {s}" if fifo else f"tar -xf - -C {s}"
    return f"if command -v python3 >/dev/null 2>&1; then {py}\nelse {sh}; fi"


def hop_script(
    node: str, dest: str, nxt: tuple[str, MeshLogin] | None, token: str, timeout: int
) -> str:
    """sh for a node of a chain, run with the stream on stdin: store it under DEST/.relay
    and, as it arrives, pass it to NXT (name, login) running its own hop script. A next node
    that fails does not stop this one. Waits for the rest of the chain to finish."""
    d, s = shlex.quote(dest), shlex.quote(f"{dest}/{STAGE}")
    make = (
        f"rm -rf -- {s} && mkdir -p -- {d} && mkdir -- {s} || "
        f"{{ echo {shlex.quote(f'relay {node}: cannot make {dest}/{STAGE}')} >&2; exit 1; }}"
    )
    return chain_hop(node, (make, s), lambda fifo: _store(s, fifo), nxt, token, timeout)


def chain_hop(node: str, work: tuple[str, str], store, nxt, token: str, timeout: int) -> str:
    """sh for a node of any chain (the wheel relay's, a stage's): WORK is (sh making the
    directory, that directory quoted) where the fifo to the next node lives, STORE(fifo or
    None) the sh keeping the stream on this node (and writing it into the fifo), NXT the next
    node (name, login[, its token]). TOKEN names this node's script and master socket; the
    next node's script is named by its own token where NXT gives one (nodes sharing a home, an
    NFS home staging to local disks, need names of their own), else by TOKEN too."""
    make, s = work
    lines = ["umask 077", 'rm -f -- "$0"', make]
    if nxt is None:
        lines.append(store(None))
        return "\n".join(lines) + "\n"
    name, login = nxt[:2]
    remote = f"timeout -k 5 {int(timeout)} /bin/sh {script_path((nxt[2:] or (token,))[0])}"
    # No open() of the fifo may wait for ever, whatever runs first. This shell holds a write end
    # (fd 4, opened via fd 3 read-write, closed at once) from before the reader starts until the
    # store ends: the reader's open() returns at once, its end of file comes even where the store
    # died unopened (a writer coming and going after the store missed a reader not yet in open).
    # The reader keeps its end, draining what its ssh left, until then: a store opening after the
    # ssh failed, or writing after it stopped reading, never blocks. No child keeps fd 4.
    lines += [
        f"mkfifo -- {s}/.fifo || exit 1",
        f"exec 3<> {s}/.fifo 4> {s}/.fifo 3<&-",
        f"{{ {peer_ssh(login, remote, timeout + 10, token)}; np_x=$?; cat >/dev/null; "
        f"exit $np_x; }} < {s}/.fifo 4>&- >&2 &",
        "np_next=$!",
        store(f"{s}/.fifo") + " 4>&-; np_rc=$?",
        "exec 4>&-",
        "wait $np_next; np_nrc=$?",
        f"rm -f -- {s}/.fifo",
        f'ssh -S "$HOME/{socket_path(token)}" -O exit -- {shlex.quote(login.address)} '
        ">/dev/null 2>&1",
        f'[ $np_nrc -eq 0 ] || echo {shlex.quote(f"relay {node} -> {name}: ")}"exit $np_nrc" >&2',
        "exit $np_rc",
    ]
    return "\n".join(lines) + "\n"


def source_script(
    dest: str, files: list[str], nxt: tuple[str, MeshLogin], token: str, timeout: int
) -> str:
    """sh for a node that holds the wheels and heads a chain: its copy, as a tar stream, into
    the first node's hop script."""
    names = " ".join(shlex.quote(f) for f in files)
    remote = f"timeout -k 5 {int(timeout)} /bin/sh {script_path(token)}"
    return (
        f"cd -- {shlex.quote(dest)} && tar -cf - -- {names} | "
        f"{peer_ssh(nxt[1], remote, timeout + 10)}\n"
    )


def finalize_script(dest: str, sums: dict[str, str]) -> str:
    """sh (run by the controller over its own connection): each relayed wheel whose sha256 is
    the controller's moves into place (`@@ok NAME`), a wrong one is dropped (`@@bad NAME`);
    .relay goes in any case, so nothing half-written stays. A file the python hop hashed as
    it wrote it is taken at the sum it listed in .relay/.sha256 when that is the controller's
    (the node's own python, as trusted as its sha256sum); any other is hashed here."""
    s = f"{dest}/{STAGE}"
    lines = [
        f"cd -- {shlex.quote(dest)} 2>/dev/null || exit 0",
        f"[ -d {shlex.quote(STAGE)} ] || exit 0",
        SHA256_SH,
        "np_nl='\n'",
        f'np_sums="$np_nl$(cat -- {shlex.quote(f"{STAGE}/{HOP_SUMS}")} 2>/dev/null)$np_nl"',
    ]
    for name, sha in sorted(sums.items()):
        p, q = shlex.quote(f"{STAGE}/{name}"), shlex.quote(name)
        listed = f'*"$np_nl"{shlex.quote(f"{sha} {name}")}"$np_nl"*'
        lines.append(
            f'if [ -f {p} ]; then case "$np_sums" in {listed}) np_h={shlex.quote(sha)};; '
            f'*) np_h=$(np_sha256 < {p});; esac; if [ "$np_h" = {shlex.quote(sha)} ]; '
            f"then mv -f -- {p} {q} && echo @@ok {q}; else echo @@bad {q}; fi; fi"
        )
    # and a hop script the chain never reached (the home's lock keeps other runs out)
    lines.append(f'rm -rf -- {shlex.quote(s)}; rm -f -- "$HOME"/.nodeprep/relay-*.sh')
    lines.append(
        'for np_s in "$HOME"/.nodeprep/relay-*.sock; do [ -S "$np_s" ] && '
        'ssh -S "$np_s" -O exit -- peer >/dev/null 2>&1; rm -f -- "$np_s"; done; true'
    )
    return "\n".join(lines) + "\n"


def parse_finalize(out: str) -> tuple[set[str], set[str]]:
    ok, bad = set(), set()
    for line in out.splitlines():
        tag, _, name = line.partition(" ")
        if tag == "@@ok":
            ok.add(name.strip())
        elif tag == "@@bad":
            bad.add(name.strip())
    return ok, bad


def over_mesh(ctx) -> bool:
    """Whether CTX's node can take part in an ssh relay of this run: the mesh is on and put in
    place by this very run (the ssh_keys role is in it: it set the cluster key; without it a
    relay could only hope the mesh is there, and the pushes go direct), and the node is reached
    over ssh (not the controller itself)."""
    on = ctx.vars.get("ssh_mesh") and ctx.prov.shared.cluster_key is not None
    return bool(on) and getattr(ctx.host, "connection", "ssh") != "local"


@dataclass
class Relay:
    """One run's relay: what each node lacks or holds (registered by the wheelhouse role's
    steps(), possibly from several threads), what each got from whom, the controller's bytes."""

    order: list[str] = field(default_factory=list)
    wants: dict[str, Want] = field(default_factory=dict)
    holders: dict[str, dict[str, str]] = field(default_factory=dict)  # platform -> {node: dest}
    logins: dict[str, MeshLogin] = field(default_factory=dict)
    local: dict[str, Path] = field(default_factory=dict)  # platform -> controller dir
    source: dict[str, str] = field(default_factory=dict)  # node -> "controller" | a node's name
    errors: dict[str, str] = field(default_factory=dict)  # node -> why its relay failed
    verified: dict[str, set] = field(default_factory=dict)  # node -> wheels checked on arrival
    sent: dict[str, int] = field(default_factory=dict)  # node -> bytes the controller sent it
    fallbacks: dict[str, str] = field(default_factory=dict)  # node -> why the controller pushed
    token: str = field(default_factory=lambda: secrets.token_hex(6))
    what: str = "wheelhouse"  # what travels, for messages ("container image")
    unit: str = "wheels"  # its files, for messages ("archive")
    lock: threading.Lock = field(default_factory=threading.Lock)

    def want(self, w: Want, login: MeshLogin, local: Path) -> None:
        with self.lock:
            self.wants[w.node] = w
            self.logins[w.node] = login
            self.local[w.platform] = local
            for hs in self.holders.values():
                hs.pop(w.node, None)

    def hold(self, node: str, platform: str, dest: str, login: MeshLogin) -> None:
        with self.lock:
            self.wants.pop(node, None)
            self.logins[node] = login
            self.holders.setdefault(platform, {})[node] = dest

    def count(self, node: str, nbytes: int) -> None:
        with self.lock:
            self.sent[node] = self.sent.get(node, 0) + nbytes

    def fail(self, nodes, why: str, source: str | None = None) -> None:
        """NODES got nothing by relay (the first reason given stays): the controller pushes."""
        with self.lock:
            for n in nodes:
                self.errors.setdefault(n, why)
                if source:
                    self.source.setdefault(n, source)
