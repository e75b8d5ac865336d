"""wheelhouse: the controller resolves and downloads every wheel the nodes need once per node
platform (src/nodeprep/ops/pystack/wheelhouse.py), then gets each node only the files it lacks (by
sha256), so nodes never talk to a package index. With wheelhouse_relay (and the ssh mesh) the wheels
go node to node (ops/pystack/relay.py: the controller sends each platform's once, into a chain of
the nodes lacking them, after the mesh is in place: Step.fleet); each relayed wheel is checked
against the controller's sha256 before it is used, and what did not arrive intact is pushed by the
controller over the run's own SSH connection, as without the relay."""

from __future__ import annotations

import posixpath
import shlex
import time

from nodeprep.engine.facts import DIR, FILE, GPUS, MODULES, OS, PYTHON, STAMP, USER
from nodeprep.engine.remote import SHA256_SH, rpath, stamp_from_list
from nodeprep.engine.steps import FileContent, Room, Step, StepCheck, scope_of
from nodeprep.errors import InputError, NodeprepError
from nodeprep.ops import pystack
from nodeprep.ops.pystack import relay, relay_run, wheelcast

SUMS = "SHA256SUMS"
# The stamp of the last sha256 check that passed (STAMP fact; engine/remote.stamp_from_list),
# over every wheel it checked: a wheel rewritten, truncated or removed since is pushed and
# checked again, where SHA256SUMS alone says only what was pushed.
STAMP_NAME = pystack.paths.VERIFIED  # the name a verify stamp has wherever it is (the venv too)


def validate(prov):
    first = next(iter(prov.vars.values()))
    pystack.requirement_pins(prov)
    for pin in first["wheel_builds"] or {}:
        if pin.split("==")[0].strip() and "==" not in pin:
            file, line = prov.origin(next(iter(prov.vars)), "wheel_builds")
            raise InputError(
                f"wheel_builds: {pin!r} is not pinned",
                hint="write name==version",
                file=file,
                line=line,
            )


# GPUS: the torch plan (pystack.torch_plan) needs them; without, `--roles wheelhouse` alone
# had no torch pin and resolved the index's newest torch (CUDA, GBs) for deepspeed's `torch`
FACTS = [OS, PYTHON, USER, GPUS]


def reads(ctx):
    d = ctx.vars["wheelhouse_dir"]
    # requirements.lock too: a fact read later costs a round trip, and a converged run could
    # not tell it has nothing to do from the probe alone (it would take the locks)
    return [
        DIR(d),
        FILE(posixpath.join(d, SUMS)),
        FILE(posixpath.join(d, "requirements.lock")),
        STAMP(posixpath.join(d, STAMP_NAME)),
    ] + ([MODULES] if ctx.vars.get("modules") else [])  # the torch plan's cuda module


# Line 1 of the stamp. SHA256SUMS and the stamp are written by one action, after its check
# passed, and name the same wheels.
STAMP_HEAD = "sha256 of every wheel checked against SHA256SUMS"


def controller(prov):
    """Build and download once per platform; in --check mode only from the cache."""
    prov.shared.relay = relay.Relay(order=[h.name for h in prov.hosts])
    return pystack.wheelhouse_manifests(prov)


def _relay(ctx):
    """The run's relay when this node may take part in it: not --check, and either under
    --via slurm (the wheels go by sbcast: Slurm's own tree) or over ssh (relay.over_mesh)."""
    rl, prov = ctx.prov.shared.relay, ctx.prov
    if not ctx.vars.get("wheelhouse_relay") or prov.check_mode:
        return None
    if prov.shared.via == "slurm":
        return rl
    return rl if relay.over_mesh(ctx) else None


def _register(ctx, rl, platform: str, local, lack: list[str]) -> None:
    dest = pystack.node_path(ctx.vars["wheelhouse_dir"], ctx.facts)
    login = relay.MeshLogin(ctx.host.address, int(ctx.host.port or 22), ctx.host.user)
    if lack:
        rl.want(relay.Want(ctx.name, platform, dest, tuple(sorted(lack))), login, local)
    else:
        rl.hold(ctx.name, platform, dest, login)


def report(ctx):
    rl = ctx.prov.shared.relay
    if rl is None or (ctx.name not in rl.source and ctx.name not in rl.sent):
        return {}
    return {
        "wheelhouse": {
            "from": rl.source.get(ctx.name, "controller"),
            "verified_on_arrival": len(rl.verified.get(ctx.name, ())),
            "controller_bytes": rl.sent.get(ctx.name, 0),
            "relay_error": rl.errors.get(ctx.name),
            "fallback": rl.fallbacks.get(ctx.name),
        }
    }


def _sums(text: str | None) -> dict[str, str]:
    out = {}
    for line in (text or "").splitlines():
        sha, _, name = line.partition("  ")
        out[name.strip()] = sha
    return out


def _without_manifest(ctx) -> list[Step] | None:
    """The node's one step when it has no manifest to sync from: the controller could not
    resolve its platform's wheels, or --check found none in the controller's cache."""
    if ctx.name in ctx.prov.shared.wheelhouse_errors:
        err = ctx.prov.shared.wheelhouse_errors[ctx.name]
        return [
            Step(
                "wheelhouse.download",
                [],
                lambda f: StepCheck(False, err.splitlines()[0]),
                action=None,
                hint="the controller could not resolve the wheels for this node's platform: "
                + " | ".join(err.splitlines()[1:])[-300:],
            )
        ]
    if ctx.name not in ctx.prov.shared.manifests:
        return [
            Step(
                "wheelhouse.sync",
                [],
                lambda f: StepCheck(False, "would download and push the wheelhouse"),
                action=":",
            )
        ]
    return None


def _verify(ctx, rl, d: str, files: dict, sums_text: str):
    """The sync step's action, run after the uploads: check every wheel against the
    controller's sha256 (but those the relay's arrival check just passed), drop stale ones,
    then record the sums (the file the next run's check reads)."""

    def verify(_facts):
        done = rl.verified.get(ctx.name, set()) if rl else set()
        todo = "".join(f"{sha}  {n}\n" for n, sha in sorted(files.items()) if n not in done)
        # each wheel hashed by np_sha256 (the CPU's SHA instructions where openssl has them)
        check_all = (
            f"printf %s {_b64(todo)} | base64 -d | {{ np_bad=0; while read -r np_w np_f; do "
            f'[ "$(np_sha256 < "$np_f")" = "$np_w" ] || {{ echo "$np_f: FAILED" >&2; np_bad=1; }}; '
            f"done; [ $np_bad -eq 0 ]; }} && "
        )
        listing = STAMP_HEAD + "\n" + "".join(f"{n}\n" for n in sorted(files))
        return (
            f"{SHA256_SH}; cd {rpath(d)} && rm -rf {relay.STAGE} && rm -f {STAMP_NAME} && "
            f"printf %s {_b64(sums_text)} | base64 -d > .sums.new && "
            + (check_all if todo else "")
            + f'for f in *.whl; do grep -qF "  $f" .sums.new || rm -f -- "$f"; done && '
            f"mv -f .sums.new {SUMS} && "
            f"printf %s {_b64(listing)} | base64 -d > {STAMP_NAME}.list && "
            + stamp_from_list(d, STAMP_NAME, STAMP_NAME + ".list")
        )

    return verify


def steps(ctx):
    d = ctx.vars["wheelhouse_dir"]
    no_manifest = _without_manifest(ctx)
    if no_manifest:
        return no_manifest
    local, m = ctx.prov.shared.manifests[ctx.name]
    files = m["files"]
    sums_text = "".join(f"{sha}  {name}\n" for name, sha in sorted(files.items()))
    stamp_key = STAMP(posixpath.join(d, STAMP_NAME))
    missing = _missing(files, d, stamp_key)
    check = _check(missing, files, stamp_key)
    rl = _relay(ctx)
    try:
        lack = missing(ctx.facts)
    except (KeyError, TypeError):  # not probed: the check tells
        rl, lack = None, []
    if rl is not None:
        _register(ctx, rl, m["platform"], local, lack)
    upload = _upload(ctx, d, rl, files, local, missing)
    verify = _verify(ctx, rl, d, files, sums_text)  # the action, after the uploads
    fleet = _fleet(ctx, rl, lack)
    return [
        Step(
            f"wheelhouse.sync {len(files)} wheels ({m['platform']})",
            [DIR(d), FILE(posixpath.join(d, SUMS)), stamp_key],
            check,
            action=verify,
            before=upload,
            hint="see the run log",
            scope=scope_of(d),
            fleet=fleet,
            room=_room(d, local, missing),
        ),
        FileContent(posixpath.join(d, "requirements.lock"), "\n".join(m["lock"]) + "\n", 0o644),
    ]


def _missing(files: dict, d: str, stamp_key):
    """The sync step's list of wheels to push, a function of the facts."""
    listing_key, sums_key = DIR(d), FILE(posixpath.join(d, SUMS))

    def missing(facts) -> list[str]:
        """The wheels to push: not recorded with their sha256, absent, or changed since the
        last check passed."""
        have = _sums((facts[sums_key] or {}).get("content"))
        present = set(facts[listing_key] or [])
        changed = set((facts.get(stamp_key) or {}).get("changed") or ())
        return [
            n for n, sha in files.items() if have.get(n) != sha or n not in present or n in changed
        ]

    return missing


def _check(missing, files: dict, stamp_key):
    """The sync step's check: nothing to push, and every wheel checked since it was pushed."""

    def check(facts):
        lack = missing(facts)
        if lack:
            return StepCheck(False, f"{len(lack)} of {len(files)} wheels to push")
        st = facts[stamp_key]
        if not st["exists"] or st["head"] != STAMP_HEAD:
            return StepCheck(
                False,
                f"{len(files)} wheels not checked against their sha256 since they were pushed",
            )
        return StepCheck(True)

    return check


def _upload(ctx, d: str, rl, files: dict, local, missing):
    """The sync step's upload (before its action): what the relay did not bring, pushed."""

    def upload(session, facts):
        remote_dir = pystack.node_path(d, facts)
        if not session.run(f"mkdir -p -m 700 {shlex.quote(remote_dir)}").ok:
            raise NodeprepError(f"cannot create {remote_dir}")
        _push(
            session,
            remote_dir,
            _arrived(session, rl, remote_dir, missing(facts), files),
            local,
            ctx.prov.shared.relay,
        )  # counts what the controller sends, relay on or off

    return upload


def _fleet(ctx, rl, lack: list[str]):
    """The sync step's fleet pass (Step.fleet): the relay (sbcast under --via slurm, else the
    chain) when this node takes part and lacks wheels; None otherwise."""
    if rl is not None and lack:
        prov = ctx.prov
        how = wheelcast.run if prov.shared.via == "slurm" else relay_run.run  # sbcast, or the chain
        return ("wheelhouse.relay", lambda fl, nodes: how(fl, nodes, rl, prov.events, prov.notes))

    return None


def _room(d: str, local, missing):
    """The sync step's room: the wheels to push, and their files."""

    def room(facts) -> Room:
        lack = missing(facts)
        return Room(
            d,
            sum((local / n).stat().st_size for n in lack),
            len(lack) + 2,
            what=f"{len(lack)} wheels",
        )

    return room


def _arrived(session, rl, remote_dir: str, lack: list[str], files: dict) -> list[str]:
    """After a relay: keep what arrived with the controller's sha256 (moved into place on
    the node), return what the controller must still push itself (the fallback, noted)."""
    if rl is None or session.name not in rl.source or not lack:
        return lack
    r = session.run(
        relay.finalize_script(remote_dir, {n: files[n] for n in lack}),
        label=f"relay arrival check of {len(lack)} wheels",
    )
    ok, bad = relay.parse_finalize(r.stdout)
    with rl.lock:
        rl.verified[session.name] = ok
    push, why = relay.fallback(
        lack,
        ok,
        bad,
        rl.errors.get(session.name) or (None if r.ok else f"arrival check exit {r.rc}"),
    )
    if push:
        with rl.lock:
            rl.fallbacks[session.name] = why
        session.log(f"relay: {why}; the controller pushes {len(push)} wheel(s) itself\n")
        session.events.note(session.name, f"wheelhouse relay: {why}; pushed by the controller")
    return push


class _Pace:
    """The push's deadline from its work: after a 30 s grace it must average relay.MIN_RATE
    (a link that still acknowledges but trickles would otherwise hold the run for hours; a
    silent one is the dead-peer rule's)."""

    def __init__(self, node: str):
        self.node = node
        self.t0 = time.monotonic()
        self.done = 0
        self.base = 0

    def next_file(self) -> None:
        self.base = self.done

    def __call__(self, sent: int, _total: int) -> None:
        self.done = self.base + sent
        took = time.monotonic() - self.t0
        if took > 30 and self.done / took < relay.MIN_RATE:
            raise NodeprepError(
                f"{self.done / 2**20:.0f} MiB in {took:.0f} s "
                f"({self.done / took / 2**20:.2f} MiB/s, "
                f"below the {relay.MIN_RATE / 2**20:.0f} MiB/s floor): the link to the node "
                "is too slow or stalls"
            )


def _push(session, remote_dir: str, names: list[str], local, rl) -> None:
    sftp = session.conn.sftp()
    pace = _Pace(session.name)
    try:
        for name in names:
            tmp = f"{remote_dir}/.{name}.part"
            pace.next_file()
            sftp.put(str(local / name), tmp, callback=pace)
            sftp.posix_rename(tmp, f"{remote_dir}/{name}")
            if rl is not None:
                rl.count(session.name, (local / name).stat().st_size)
            session.log(f"pushed {name}\n")
    except (OSError, EOFError, NodeprepError) as e:
        raise NodeprepError(f"pushing wheels to {remote_dir} failed: {e}") from None


def _b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()
