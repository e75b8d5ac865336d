"""`invoke verify-parity`: one batched probe per node (all nodes in parallel), turned into a
flat fingerprint {key: value} per node, compared by src/nodeprep/parity.py.

`import torch` costs seconds of CPU, so the node caches its torch answer in
~/.nodeprep/torch_probe.json keyed by torch's version.py (mtime, size) and the NVIDIA driver
line: it runs again only when torch or the driver changed (or with --deep)."""
from __future__ import annotations

import hashlib
import json
import shlex

from . import facts as factmod
from . import hostkeys, meshcheck, nodeset, pystack, torchplan
from .facts import fact
from .redact import is_secret
from .remote import rpath

CACHE = "~/.nodeprep/torch_probe.json"
TORCH_PY = r'''
import json, sys
import torch
cuda = torch.version.cuda
avail = bool(cuda) and torch.cuda.is_available()
nccl = None
if cuda:
    try:
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as e:  # an unusable NCCL is a finding, not a crash of the probe
        nccl = "error: %s" % e
print(json.dumps({"version": torch.__version__, "cuda": cuda,
                  "available": avail, "arch_list": torch.cuda.get_arch_list() if cuda else [],
                  "nccl": nccl, "device_count": torch.cuda.device_count() if avail else 0}))
'''


def _torch_script(arg: str) -> str:
    venv, deep = arg.split("|", 1)
    v, cache = rpath(venv), rpath(CACHE)
    # Line 1 of the cache is its key, line 2 the answer.
    return ((f"rm -f {cache}; " if deep == "deep" else "") +
            # sh builtins where they do (glob, read): this runs on every node at every verify
            f"t=; for x in {v}/lib/python*/site-packages/torch; do [ -d \"$x\" ] && {{ t=$x; break; }}; done; "
            "[ -n \"$t\" ] || { echo MISSING; exit 0; }; "
            "s=$(stat -c %Y:%s \"$t/version.py\"); d=; [ -r /proc/driver/nvidia/version ] && "
            "IFS= read -r d < /proc/driver/nvidia/version; k=\"$s $d\"; c=; a=; "
            f"[ -f {cache} ] && {{ IFS= read -r c; while IFS= read -r l || [ -n \"$l\" ]; do a=$l; done; }} < {cache}; "
            "if [ -n \"$c\" ] && [ \"$c\" = \"$k\" ]; then printf '%s\\n' \"$a\"; "
            f"else mkdir -p \"$(dirname {cache})\" && {{ printf '%s\\n' \"$k\"; "
            f"{v}/bin/python -I -c {shlex.quote(TORCH_PY)}; }} > {cache}.tmp && "
            f"mv -f {cache}.tmp {cache} && tail -n 1 {cache}; fi")


@fact("torch_build", _torch_script)
def _torch_build(text: str, rc: int):
    """torch as the venv sees it: version, cuda, nccl, is_available, arch list (None if absent)."""
    lines = text.strip().splitlines()
    if not lines or lines[-1] == "MISSING":
        return None
    for line in reversed(lines):      # import warnings may precede the JSON line
        if line.startswith("{"):
            return json.loads(line)
    return {"error": lines[-1][:200]}


@fact("port_listening", lambda port: f"ss -Hltn 'sport = :{int(port)}' 2>/dev/null")
def _port(text: str, rc: int) -> bool:
    return bool(text.strip())


_SSH = ("ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o UpdateHostKeys=no -o ConnectTimeout=5 "
        "-o ServerAliveInterval=5 -o ServerAliveCountMax=3 "
        "-o KexAlgorithms=curve25519-sha256,curve25519-sha256@libssh.org,ecdh-sha2-nistp256,"
        "diffie-hellman-group14-sha256")


def mesh_start(peers: list[str]) -> str:
    """sh that starts one ssh login per peer in the background (in the calling shell, so a
    later mesh_collect can `wait` for them while other work runs meanwhile).
    BatchMode + StrictHostKeyChecking=yes: a prompt or an unknown key counts as a failure,
    exactly what pdsh/mpirun would hit. UpdateHostKeys=no: a check writes nothing (OpenSSH
    would otherwise add the peer's other host key types to known_hosts). curve25519: OpenSSH
    9.2's default post-quantum hybrid kex costs ~70 ms more per handshake, which is all this
    check pays for (the login itself is what it proves)."""
    lines = ['_npm=$(mktemp -d "${TMPDIR:-/tmp}/nodeprep-mesh.XXXXXX") || exit 1']
    for i, p in enumerate(peers):
        q = shlex.quote(p)
        lines.append(f'( {_SSH} -- {q} true </dev/null >/dev/null 2>"$_npm/e{i}"; '
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


def _env_lines(text: str | None, export: bool) -> dict[str, str]:
    out = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if export:
            if not line.startswith("export "):
                continue
            line = line[len("export "):]
        if "=" in line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k.strip()] = v
    return out


def _hide(k: str, v):
    if v is not None and is_secret(k):
        return "sha256:" + hashlib.sha256(str(v).encode()).hexdigest()[:12]
    return v


def requests(v: dict, deep: bool, workdir: str | None, port: int | None) -> list:
    reqs = ["os", "login_shell", "user", "python_on_path", "interfaces", "gpus",
            ("venv", v["venv_path"]), ("torch_build", f"{v['venv_path']}|{'deep' if deep else ''}"),
            ("file", "~/.deepspeed_env"), ("file", v["env_file"])]
    if v.get("ssh_mesh"):
        reqs += [("file", p) for p in meshcheck.FILES]
    if workdir:
        reqs.append(("dir", workdir))
    if port:
        reqs.append(("port_listening", port))
    return reqs


def fingerprint(host, v: dict, f: dict, path_seen: str | None, workdir: str | None) -> dict:
    """The node's facts as flat comparable keys."""
    fp: dict = {}
    venv = f.get(f"venv:{v['venv_path']}") or {}
    here = pystack.venv_path(v, f) if f.get("user") else None
    fp["python.path"] = f"{here}/bin/python" if venv.get("exists") else None
    fp["python.version"] = venv.get("python")
    for name, version in (venv.get("packages") or {}).items():
        fp[f"pkg.{name}"] = version
    t = f.get(f"torch_build:{v['venv_path']}|") or f.get(f"torch_build:{v['venv_path']}|deep")
    g = f.get("gpus") or {}
    caps = sorted({d["capability"] for d in g.get("devices", []) if d.get("capability")})
    if t:
        fp["torch.version"], fp["torch.cuda"] = t.get("version"), t.get("cuda")
        fp["torch.nccl"], fp["torch.cuda_available"] = t.get("nccl"), t.get("available")
        archs = [a for a in t.get("arch_list", [])]
        fp["torch.covers_gpus"] = all(_covered(archs, c) for c in caps) if caps else None
    fp["cpu.arch"] = f["os"]["arch"]
    fp["os.release"], fp["os.kernel"] = f["os"]["release"], f["os"]["kernel"]
    fp["gpu.count"], fp["gpu.driver"] = g.get("count", 0), g.get("driver")
    fp["gpu.models"] = ", ".join(sorted({d["name"] for d in g.get("devices", [])})) or None
    fp["shell.login"] = f.get("login_shell")
    fp["shell.noninteractive_python"] = path_seen
    ds = f.get("file:~/.deepspeed_env") or {}
    fp["env.deepspeed_env"] = "present" if ds.get("exists") else None
    for k, val in _env_lines(ds.get("content"), export=False).items():
        fp[f"env.deepspeed.{k}"] = _hide(k, val)
    for k, val in _env_lines((f.get(f"file:{v['env_file']}") or {}).get("content"), export=True).items():
        fp[f"env.shell.{k}"] = _hide(k, val)
    fp["net.interfaces"] = ",".join(sorted(n for n in (f.get("interfaces") or {}) if n != "lo"))
    if workdir:
        fp["job.workdir_exists"] = f.get(f"dir:{workdir}") is not None
    return fp


def _covered(archs: list[str], cap: str) -> bool:
    sms = [f"{a[3:-1]}.{a[-1]}" for a in archs if a.startswith("sm_")]
    ptx = any(a.startswith("compute_") for a in archs)
    return torchplan.covers(sms, ptx, cap)


def gather_node(session, v: dict, deep: bool, workdir: str | None, port: int | None,
                peers: list[str]) -> dict:
    """ONE remote command: the mesh logins start in the background, the fact probe runs
    meanwhile (it also answers what `python` a launcher's non-interactive ssh shell finds),
    then the logins' results are collected."""
    import secrets
    reqs = requests(v, deep, workdir, port)
    token = secrets.token_hex(6)
    script = (mesh_start(peers) + factmod.probe_script(reqs, v, token) +
              f"echo '@@{token}:mesh@@'\n" + mesh_collect(peers) + f"echo '@@{token}:rc=0@@'\n")
    r = session.run(script, label=f"verify probe + ssh mesh ({len(peers)} peers)", log_output=False)
    f = factmod.parse_sections(session.name, reqs, r.stdout, token, r.rc, r.tail(3))
    mesh = parse_mesh(factmod.split_sections(r.stdout, token).get("mesh", ("", 0))[0])
    for p in peers:
        mesh.setdefault(p, (-1, "no answer from the mesh check"))
    return {"facts": f, "python_seen": f.get("python_on_path"), "mesh": mesh}


FANOUT_MAX = 100_000   # bytes of head script: posix() passes it as ONE argument (128 KiB cap)


def fanout_script(peers: list[str], probes: dict[str, str], timeout: int, token: str) -> str:
    """sh for the head node: one ssh login per peer, all in parallel (the mesh check: BatchMode,
    pinned host keys, as pdsh would log in), each carrying that peer's fact probe (PROBES:
    name -> probe script, fed on stdin; peers without one run `true`). Prints every login's
    output fenced by TOKEN (`n<i>` sections whose rc is ssh's exit status: 255 = the login
    failed) and the last lines of each login's stderr (`e<i>`). A probe cannot forge another
    node's section: TOKEN is only ever sent to the head. Identical probes are written once.
    Each login is bounded on the head (TIMEOUT + 20 s; keepalives catch a peer that dies
    mid-session) and each probe on its node (TIMEOUT), so one stuck node costs its own answer,
    not everyone's; the caller gives the whole script TIMEOUT + 40 s."""
    # The answers (env files included) wait in a 0700 directory, files 0600, that goes on
    # TERM and on a closed pipe (the controller went away) too.
    lines = ["umask 077", '_npf=$(mktemp -d "${TMPDIR:-/tmp}/nodeprep-fan.XXXXXX") || exit 1',
             "trap 'rm -rf \"$_npf\"' EXIT", "trap 'exit 143' HUP INT TERM", "trap 'exit 141' PIPE"]
    files: dict[str, str] = {}
    for script in dict.fromkeys(probes.values()):
        f = files[script] = f"p{len(files)}"
        end = f"NODEPREP_{token}_{f}"
        lines.append(f"cat > \"$_npf/{f}\" <<'{end}'\n{script.rstrip(chr(10))}\n{end}")
    run = shlex.quote(f"timeout -k 5 {int(timeout)} /bin/sh")
    ssh = f"timeout -k 5 {int(timeout) + 20} {_SSH}"
    for i, p in enumerate(peers):
        q = shlex.quote(p)
        cmd = (f"{ssh} -- {q} {run} < \"$_npf/{files[probes[p]]}\"" if p in probes
               else f"{ssh} -- {q} true </dev/null")
        lines.append(f"( echo '@@{token}:n{i}@@'; {cmd} 2>\"$_npf/e{i}\"; r=$?; echo; "
                     f"echo \"@@{token}:rc=$r@@\" ) > \"$_npf/o{i}\" &")
    lines += ["wait", 'cat "$_npf"/o*',
              f'for f in "$_npf"/e*; do [ -s "$f" ] && {{ echo "@@{token}:${{f##*/}}@@"; '
              f'tail -n 3 "$f"; echo "@@{token}:rc=0@@"; }}; done', "exit 0"]
    return "\n".join(lines) + "\n"


def gather_fanout(session, hosts, v_of: dict, deep: bool, workdir, port, peers: list[str],
                  settings) -> tuple[dict, dict] | None:
    """The head's ONE command: a login to every peer (the mesh check), each carrying the
    peer's probe. Returns ({node: gather_node-like result} for the nodes whose probe came back
    whole, {peer: (rc, error)} for the head's mesh); a node missing from the first dict is
    probed directly by the caller. None when the fan-out itself failed (script too big, no
    temp dir, killed): the caller then does it all the direct way."""
    import ipaddress
    import secrets
    head = session.name
    token, inner = secrets.token_hex(6), secrets.token_hex(6)
    reqs = {h.name: requests(v_of[h.name], deep, workdir, port if h.name == head else None)
            for h in hosts}
    probes = {n: factmod.probe_script(r, v_of[n], inner) for n, r in reqs.items()}
    limit = int(settings.command_timeout)
    script = fanout_script(peers, probes, limit, token)
    if len(script) * 4 // 3 > FANOUT_MAX:
        session.log(f"fan-out script of {len(script)} bytes: too big for one command; direct probes\n")
        return None
    r = session.run(script, timeout=limit + 40,
                    label=f"verify: probes of {len(probes)} node(s) over the ssh mesh from {head} "
                          f"({len(peers)} logins)", log_output=False)
    sections = factmod.split_sections(r.stdout, token)
    if r.rc != 0 or not any(f"n{i}" in sections for i in range(len(peers))):
        session.log(f"fan-out failed (exit {r.rc}): {r.tail(2)}; direct probes\n")
        return None
    address = {h.name: h.address for h in hosts}
    mesh, got = {}, {}
    for i, p in enumerate(peers):
        text, rc = sections.get(f"n{i}", ("", -1))
        err = sections.get(f"e{i}", ("", 0))[0].strip().splitlines()
        # logged in: `true` said 0, or the probe started (its first marker came back); a shell
        # that refuses commands (nologin) fails the pair, as it would fail pdsh
        if not (rc == 0 or (p in probes and f"@@{inner}:" in text)):
            mesh[p] = (rc, err[-1] if err else ("no answer from the mesh check" if rc == -1 else ""))
            continue
        mesh[p] = (0, "")
        if p in probes:
            try:
                f = factmod.parse_sections(p, reqs[p], text, inner, rc, "\n".join(err[-2:]))
            except Exception:  # noqa: BLE001 -- the direct probe will tell what is wrong
                continue
            # The head dialled the NAME; the answer counts only if it came from the machine the
            # inventory means (stale DNS or a hand-made alias would credit the wrong one).
            try:
                ip = str(ipaddress.ip_address(address.get(p) or ""))
            except ValueError:
                ip = None
            seen = f.get("interfaces")
            if ip and seen is not None and ip not in {a for addrs in seen.values() for a in addrs}:
                mesh[p] = (1, f"the login reached a machine without {p}'s address {ip} "
                              f"(what does {p} resolve to on {head}?)")
                continue
            got[p] = {"facts": f, "python_seen": f.get("python_on_path"), "mesh": {}}
    return got, mesh


SEVERITY = {"os.kernel": "warning", "os.release": "warning", "gpu.driver": "warning",
            "net.interfaces": "info"}


def ifname_matches(spec: str, names: list[str]) -> bool:
    """NCCL_SOCKET_IFNAME grammar: `^a,b` excludes, `=a,b` exact, else prefixes."""
    names = [n for n in names if n != "lo"] if not spec.lstrip("^=").startswith("lo") else names
    if spec.startswith("^"):
        bad = [p for p in spec[1:].split(",") if p]
        return any(not any(n.startswith(b.lstrip("=")) for b in bad) for n in names)
    if spec.startswith("="):
        return any(n in spec[1:].split(",") for n in names)
    return any(n.startswith(p) for p in spec.split(",") if p for n in names)


def checks_for(host, v: dict, f: dict, fp: dict, is_head: bool, workdir, port) -> list[dict]:
    out = []

    def bad(key, msg, severity="error"):
        out.append({"node": host.name, "key": key, "message": msg, "severity": severity})
    g = f.get("gpus") or {}
    if g.get("error"):
        bad("gpu", f"nvidia-smi: {g['error'][:120]}")
    if g.get("count") and host.slots and g["count"] != host.slots:
        bad("gpu.count", f"{g['count']} GPUs but the inventory gives it {host.slots} slots")
    if fp.get("torch.covers_gpus") is False:
        bad("torch.covers_gpus", "torch.cuda.get_arch_list() lacks this node's GPU capability")
    if g.get("count") and fp.get("torch.cuda_available") is False:
        bad("torch.cuda_available", "torch.cuda.is_available() is False on a GPU node")
    if fp.get("python.path") is None:
        bad("python.path", f"no venv at {v['venv_path']} (run `invoke provision`)")
    elif fp.get("shell.noninteractive_python") != fp["python.path"]:
        bad("shell.noninteractive_python", f"a non-interactive ssh shell finds "
            f"{fp.get('shell.noninteractive_python') or 'no python'}, not {fp['python.path']}")
    spec = fp.get("env.deepspeed.NCCL_SOCKET_IFNAME") or fp.get("env.shell.NCCL_SOCKET_IFNAME")
    if spec and not ifname_matches(spec.strip("'\""), list(f.get("interfaces") or {})):
        bad("net.NCCL_SOCKET_IFNAME", f"NCCL_SOCKET_IFNAME={spec} matches no interface here "
            f"({', '.join(f.get('interfaces') or {})})")
    if workdir and fp.get("job.workdir_exists") is False:
        bad("job.workdir", f"{workdir} does not exist (the launchers cd into it on every node)")
    if is_head and port and f.get(f"port_listening:{port}"):
        bad("net.master_port", f"port {port} is already in use on the head node")
    return out


GPU_KEYS = ("gpu.", "torch.cuda_available", "torch.covers_gpus")


def compare_fleet(fps: dict, cpu_only: set, checks, unreachable, order):
    """GPU keys are compared among the GPU nodes only: a node the inventory marks cpu_only is
    meant to differ there."""
    from . import parity
    is_gpu = lambda k: k.startswith(GPU_KEYS)
    rest = {n: {k: v for k, v in fp.items() if not is_gpu(k)} for n, fp in fps.items()}
    report = parity.compare(rest, SEVERITY, checks, unreachable, order=order)
    gpu = {n: {k: v for k, v in fp.items() if is_gpu(k)} for n, fp in fps.items() if n not in cpu_only}
    if gpu:
        g = parity.compare(gpu, SEVERITY, (), None, order=[n for n in order if n in gpu])
        report.drift = sorted(report.drift + g.drift,
                              key=lambda d: (parity.SEVERITIES.index(d.severity), d.key))
        report.compared_keys += g.compared_keys
        report.ok = report.ok and g.ok
    return report


def mesh_checks(a, inventory_hosts, got: dict, v_of: dict, paper: dict, pinned: dict) -> list[dict]:
    """One ssh.mesh error per failing pair A -> B: the real login's result where A tried one
    (it is the stronger proof), else the on-paper reasons (when nodeprep manages the mesh).
    PAPER: {node: meshcheck.NodeFiles}; PINNED: {node: the controller's pinned key blobs}."""
    out = []
    tried = got[a.name]["mesh"]
    for b in inventory_hosts:
        if b.name in tried:
            rc, err = tried[b.name]
            why = [f"login failed (exit {rc})" + (f": {err}" if err else "")] if rc else []
        elif v_of[a.name].get("ssh_mesh") and a.name in paper and b.name in paper:
            why = meshcheck.problems(a.name, b, paper[a.name], paper[b.name], pinned[b.name])
        else:
            why = []
        if why:
            out.append({"node": a.name, "key": "ssh.mesh", "severity": "error",
                        "message": f"{a.name} -> {b.name}: " + "; ".join(why)})
    return out


def fans_out(pairs: dict[str, list[str]], head: str, via: str) -> bool:
    """Do the probes ride the head's mesh logins? Only where the head alone logs in (mesh
    head, or auto beyond 4 nodes), unless --via direct."""
    return via != "direct" and all(not p for n, p in pairs.items() if n != head) and bool(pairs.get(head))


def gather(fleet, hosts, v_of, settings, deep, workdir, port, pairs, via) -> dict:
    """{node: {"facts", "python_seen", "mesh"}}. Fanned out: ONE connection from here, to the
    head, whose mesh logins carry every node's probe (N logins in all, not 2N, and the probes
    reach each node exactly as pdsh would); a node that the head cannot log in to, or whose
    probe came back broken, is then probed over its own connection, as is everything when
    the head itself is out of reach. Direct: every node over its own connection."""
    head = hosts[0].name
    one = lambda s, peers: gather_node(s, v_of[s.name], deep, workdir,
                                       port if s.name == head else None, peers)
    if not fans_out(pairs, head, via):
        return fleet.map(lambda s: one(s, pairs.get(s.name, [])), "probe")
    got: dict = {}
    fan = fleet.map(lambda s: gather_fanout(s, hosts, v_of, deep, workdir, port, pairs[head],
                                            settings), "probe", only=[head])
    if fan.get(head) is None:     # the fan-out failed as a whole: the head logs in directly
        fan.pop(head, None)
    else:
        got, head_mesh = fan[head]
        got.setdefault(head, {"facts": None, "python_seen": None, "mesh": {}})["mesh"] = head_mesh
        for n, g in got.items():
            if n != head:
                fleet.sessions[n].stage = "probe"
                fleet.sessions[n].log(f"probed through {head}'s ssh login (mesh check)\n")
    rest = [h.name for h in hosts if h.name not in got or got[h.name]["facts"] is None]
    if rest:
        # the head's own logins: done already if the fan-out ran, else now, beside its probe
        head_peers = [] if head in fan else pairs[head]
        direct = fleet.map(lambda s: one(s, head_peers if s.name == head else []), "probe", only=rest)
        for n, g in direct.items():
            g["mesh"] = got.get(n, {}).get("mesh") or g["mesh"]
            got[n] = g
    return {n: g for n, g in got.items() if g["facts"] is not None}


def run(inv, hosts, settings, json_mode=False, deep=False, workdir=None, port=29500,
        baseline=None, save_baseline=None, mesh="auto", collective=False, via="auto") -> int:
    import sys

    from . import parity
    from .executor import Fleet
    from .report import Display
    v_of = {h.name: {n: inv.var(h, n) for n in inv.schema} for h in hosts}
    head = hosts[0].name
    display = Display.auto(to_stderr=True, quiet=True)
    with Fleet(hosts, settings, "verify", display) as fleet:
        names = [h.name for h in inv.hosts]
        pairs = mesh_pairs(names, mesh)
        got = gather(fleet, hosts, v_of, settings, deep, workdir, port, pairs, via)
        results = fleet.results
        connected = [n for n, s in fleet.sessions.items() if n != head and s.conn is not None]
    fps, checks = {}, []
    paper = {n: meshcheck.NodeFiles({p: g["facts"].get(f"file:{p}") for p in meshcheck.FILES})
             for n, g in got.items() if v_of[n].get("ssh_mesh")}
    known = fleet.store.load()      # parsed once, not once per pair
    pinned = {h.name: {k.get_base64() for k in (known.lookup(hostkeys.host_entry(h.address, h.port)) or {}).values()}
              for h in inv.hosts if h.name in paper}
    for h in hosts:
        if h.name not in got or results[h.name].status in ("failed", "unreachable"):
            continue
        f = got[h.name]["facts"]
        fps[h.name] = fingerprint(h, v_of[h.name], f, got[h.name]["python_seen"], workdir)
        checks += checks_for(h, v_of[h.name], f, fps[h.name], h.name == head, workdir, port)
        checks += mesh_checks(h, inv.hosts, got, v_of, paper, pinned)
    unreachable = {n: r.message for n, r in results.items() if r.status in ("failed", "unreachable")}
    if baseline:
        old, _meta = parity.baseline_read(baseline)
        report = parity.against_baseline(fps, old, SEVERITY, unreachable, order=[h.name for h in hosts])
        report.checks += checks
        report.ok = report.ok and not any(c["severity"] == "error" for c in checks)
    else:
        report = compare_fleet(fps, {h.name for h in hosts if v_of[h.name].get("cpu_only")},
                               checks, unreachable, [h.name for h in hosts])
    if save_baseline:
        parity.fingerprint_file_write(save_baseline, fps, {"inventory": inv.name})
    coll = None
    if collective:
        from . import collective as collmod
        if unreachable:
            coll = {"ok": False, "launcher": "torchrun",
                    "error": f"skipped: unreachable node(s) {', '.join(unreachable)}"}
        else:
            coll = collmod.run(inv, hosts, settings, port=port or 29500)
        report.ok = report.ok and coll["ok"]
    if json_mode:
        out = report.as_dict()
        if coll is not None:
            out["collective"] = coll
        print(json.dumps(out, indent=2, default=str))
    else:
        print(parity.render(report, color=sys.stdout.isatty()).rstrip("\n"))
        if coll is not None:
            print(collmod.render(coll))
        if mesh != "full" and len(names) > 4:
            print(f"(ssh mesh: every pair checked on paper (cluster key authorized, host key pinned), "
                  f"real logins from {names[0]} to every node; --mesh full logs in over all "
                  f"{len(names)}x{len(names)} pairs)")
        if fans_out(pairs, head, via):
            print(f"(probes rode {head}'s logins" + (f"; probed directly: {nodeset.fold(connected)}"
                                                     if connected else "") +
                  "; --via direct connects from here to every node)")
    return 0 if report.ok else 1
