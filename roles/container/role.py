"""container: the same image on every node, by its ID (the container way; nothing to do while
container_image is null). The controller reads the image once (an archive: its config's sha256
is the ID every engine shows; ops/container/archive.py; a registry reference: pinned to the
digest its tag names now with skopeo, for each node's architecture, ops/container/registry.py,
and copied once into an archive), then each node whose engine lacks that ID gets the archive,
node to node through the relay chain as the wheels do (or pushed by the controller without the
mesh), and loads it; with container_fetch: registry each such node pulls the pinned digest
itself. A node that already holds the ID does nothing. The engine step names what keeps a node
from running the image (no engine, not allowed, no daemon, no GPU toolkit on a GPU node) with
its fix (ops/container/readiness.py)."""

from __future__ import annotations

import hashlib
import os
import posixpath
import shlex
import tarfile

from nodeprep.engine.facts import GPUS, OS, USER
from nodeprep.engine.facts.container import CONTAINER
from nodeprep.engine.remote import rpath
from nodeprep.engine.steps import Room, Step, StepCheck
from nodeprep.errors import InputError, NodeprepError
from nodeprep.ops import pystack
from nodeprep.ops.container import archive, readiness, registry
from nodeprep.ops.container import spec as specmod
from nodeprep.ops.pystack import relay, relay_run

STAGE_DIR = "~/.nodeprep/images"  # where an archive waits on a node until it is loaded
PULL_EXPANDS = 3  # room for a pull: compressed layers x this (gzip of a Python stack: ~2.5x)


def _spec(prov, node: str):
    try:
        return specmod.from_vars(prov.vars[node])
    except specmod.Refused as e:
        file, line = prov.origin(node, e.var)
        raise InputError(
            f"{e.var}: {e}", hint="see roles/container/defaults.yml", file=file, line=line
        ) from None


def validate(prov):
    for node in prov.vars:
        _spec(prov, node)


def reads(ctx):
    spec = specmod.from_vars(ctx.vars)
    if spec is None:
        return []
    return [CONTAINER(readiness.engines(spec.engine)), USER, GPUS] + (
        [] if spec.image.archive else [OS]  # the architecture a reference is pinned for
    )


def controller(prov):
    """Read each archive once (the ID, the architecture, the size); pin each registry
    reference once per architecture (ops/container/registry.py) and, for the relay, copy it
    once into an archive."""
    read: dict = {}
    sent: dict = {}  # archive read -> what travels (an OCI layout packed into one file)
    pins: dict = {}  # (reference, arch) -> Pinned
    given: dict = {}  # node -> the Pinned it gets
    for node in prov.vars:
        spec = specmod.from_vars(prov.vars[node])
        if spec is None or node not in prov.facts:
            continue
        if spec.image.archive:
            img = archive.named(spec.image, *prov.origin(node, "container_image"), read)
        else:
            given[node] = pin = _pin(prov, node, spec, pins)
            if spec.fetch == "registry" or prov.check_mode:  # --check copies no image
                prov.shared.images[node] = pin
                continue
            img = _fetched(prov, pin, read)
        if img.path not in sent:
            sent[img.path] = _as_file(prov, img)
        prov.shared.images[node] = sent[img.path]
    if not prov.check_mode:
        registry.remember(prov.settings.state, given)
    prov.shared.image_relay = relay.Relay(
        order=[h.name for h in prov.hosts], what="container image", unit="archive"
    )
    return []


def _pin(prov, node: str, spec, pins: dict):
    arch = registry.arch_of((prov.facts[node].get(OS) or {}).get("arch"))
    key = (spec.image.qualified, arch)
    if key not in pins:
        try:
            pins[key] = registry.resolve(spec.image.qualified, arch)
        except registry.RegistryError as e:
            file, line = prov.origin(node, "container_image")
            raise InputError(
                f"container_image {e.message}", hint=e.hint, file=file, line=line
            ) from None
    return pins[key]


def _fetched(prov, pin, read: dict):
    """The pinned image copied once into the state directory as a docker-archive, read; its ID
    must be the one the registry's manifest names."""
    path = registry.fetch(pin, prov.settings.state / "images")
    if path not in read:
        read[path] = archive.read(path, "docker-archive")
    if read[path].id != pin.id:
        raise NodeprepError(
            f"{pin.ref}: skopeo's copy {path} holds {read[path].id[:19]}, the registry names "
            f"{pin.id[:19]}",
            hint=f"remove {path} and run again",
        )
    return read[path]


def _sum(prov, img) -> str:
    """The archive's sha256, once per run (each relayed copy is checked against it)."""
    key = str(img.path)
    if key not in prov.shared.image_sums:
        with img.path.open("rb") as f:
            prov.shared.image_sums[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return prov.shared.image_sums[key]


def _relay(ctx):
    """The run's image relay when this node may take part (not --check, over ssh: relay.over_mesh),
    else None."""
    prov = ctx.prov
    rl = prov.shared.image_relay
    if rl is None or prov.check_mode or prov.shared.via != "ssh":
        return None
    return rl if relay.over_mesh(ctx) else None


def _as_file(prov, img):
    """An OCI layout directory travels as an OCI archive (one file), made once in nodeprep's
    state directory; podman loads both forms."""
    if img.kind != "oci":
        return img
    out = prov.settings.state / "images" / f"{img.id.split(':')[1]}.oci.tar"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".new")
        with tarfile.open(tmp, "w") as tar:
            for child in sorted(img.path.iterdir()):
                tar.add(child, arcname=child.name)
        os.replace(tmp, out)
    return archive.read(out, "oci-archive")


def steps(ctx):
    spec = specmod.from_vars(ctx.vars)
    if spec is None:
        return []
    key = CONTAINER(readiness.engines(spec.engine))

    def engine_check(facts) -> StepCheck:
        ready = readiness.assess(facts.get(key.key), spec.engine, _gpus(facts), _user(facts))
        return StepCheck(True) if ready.ok else StepCheck(False, ready.problems[0].what)

    ready = readiness.assess(
        ctx.facts.get(key.key), spec.engine, _gpus(ctx.facts), _user(ctx.facts)
    )
    engine_step = Step(
        f"container.engine {ready.engine or spec.engine}",
        [key, USER, GPUS],
        engine_check,
        action=None,
        hint=ready.problems[0].fix if ready.problems else "",
    )
    if not ready.engine or any(p.code != "CONTAINER_NO_GPU_TOOLKIT" for p in ready.problems):
        return [engine_step]  # no image goes to a node that could not load it
    img = ctx.prov.shared.images[ctx.name]
    if isinstance(img, registry.Pinned):
        return [engine_step, _pull_step(ctx, key, ready, img)]
    return [engine_step, _image_step(ctx, key, ready, img)]


def _gpus(facts) -> int:
    g = facts.get(GPUS.key) or {}
    return int(g.get("count") or 0) if isinstance(g, dict) else 0


def _uid(facts) -> int:
    u = facts.get(USER.key)
    return int(u.get("uid", -1)) if isinstance(u, dict) else -1


def _user(facts) -> str:
    u = facts.get(USER.key)
    return u.get("name", "") if isinstance(u, dict) else str(u or "")


def _held(facts, key, engine: str) -> list[str]:
    e = ((facts.get(key.key) or {}).get("engines") or {}).get(engine) or {}
    return [i["id"] for i in e.get("images") or []]


def _image_step(ctx, key, ready, img) -> Step:
    stage = posixpath.join(STAGE_DIR, ctx.name)  # per node: homes may be shared
    name = img.path.name
    file = posixpath.join(stage, name)
    engine = " ".join(shlex.quote(w) for w in ready.command())
    lacks = img.id not in _held(ctx.facts, key, ready.engine)
    rl = _relay(ctx) if lacks else None
    if rl is not None:
        login = relay.MeshLogin(ctx.host.address, int(ctx.host.port or 22), ctx.host.user)
        dest = pystack.node_path(stage, ctx.facts)
        rl.want(relay.Want(ctx.name, f"image {img.id[:19]}", dest, (name,)), login, img.path.parent)

    def check(facts) -> StepCheck:
        if img.id in _held(facts, key, ready.engine):
            return StepCheck(True)
        return StepCheck(False, f"{ready.engine} does not hold {img.id[:19]}")

    # the load, then the archive goes; verified by inspecting the ID in the same round trip
    action = (
        f"{engine} load -i {rpath(file)} >&2; np_rc=$?; rm -f -- {rpath(file)}; "
        f"rmdir -- {rpath(stage)} 2>/dev/null; [ $np_rc -eq 0 ] && "
        f"{engine} image inspect {shlex.quote(img.id)} >/dev/null"
        + _warm(ready, img.id, _uid(ctx.facts))
    )
    prov = ctx.prov
    return Step(
        f"container.image {img.id[:19]} ({name}, {img.arch})",
        [key],
        check,
        action=action,
        before=_upload(ctx, img, file, rl, key, ready),
        hint=f"load it by hand to see why: {ready.engine} load -i {name}",
        scope="machine",
        room=lambda facts: Room(stage, img.size, 1, what=f"the image archive {name}"),
        fleet=(
            (
                "container.relay",
                lambda fl, nodes: relay_run.run(fl, nodes, rl, prov.events, prov.notes),
            )
            if rl is not None
            else None
        ),
    )


def _warm(ready, image_id: str, uid: int) -> str:
    """sh appended to the load on rootless Podman: one throwaway container in the user's own id
    mapping (--userns keep-id, as train runs it), so Podman makes its id-shifted copy of the
    image's layers now, not in the first job's start (18 s for the lab's 1.2 GB training image
    on 2026-11-29, 0.15 s after). The copy is as big as the image: the room check counts it."""
    if not readiness.rootless(ready, uid):
        return ""
    return (
        " && { timeout 600 podman run --rm --userns keep-id --network none --entrypoint true "
        f"{shlex.quote(image_id)} >/dev/null 2>&1 || true; }}"
    )


def _engine_room(facts, key, ready, size: float) -> None:
    """NodeprepError when the engine's storage lacks room for SIZE bytes of layers (twice that
    for rootless Podman: the keep-id copy _warm makes)."""
    copies = 2 if readiness.rootless(ready, _uid(facts)) else 1
    short = readiness.storage_short(facts.get(key.key), ready.engine, int(size * copies))
    if short:
        raise NodeprepError(short)


def _pull_step(ctx, key, ready, pin) -> Step:
    """container_fetch: registry: the node's engine pulls the pinned digest itself (with the
    node user's own registry settings and logins) and names it as the reference does."""
    engine = " ".join(shlex.quote(w) for w in ready.command())
    ident = shlex.quote(pin.id)
    tag = "".join(f" && {engine} tag {ident} {shlex.quote(t)}" for t in pin.tags)

    def check(facts) -> StepCheck:
        if pin.id in _held(facts, key, ready.engine):
            return StepCheck(True)
        return StepCheck(False, f"{ready.engine} does not hold {pin.id[:19]}")

    def room(session, facts):
        # the layers come compressed; unpacked they take about PULL_EXPANDS times as much
        _engine_room(facts, key, ready, pin.size * PULL_EXPANDS)

    how = "pulled" if ctx.vars.get("container_fetch") == "registry" else "from"
    return Step(
        f"container.image {pin.id[:19]} ({how}: {pin.ref}, {pin.arch})",
        [key],
        check,
        action=f"{engine} pull -q {shlex.quote(pin.pull)} >&2{tag} && "
        f"{engine} image inspect {ident} >/dev/null" + _warm(ready, pin.id, _uid(ctx.facts)),
        before=room,
        hint=f"pull it on the node to see why: {ready.engine} pull {pin.pull} (a registry "
        f"that wants a login: {ready.engine} login REGISTRY, as the node's user)",
        scope="machine",
    )


def _upload(ctx, img, file: str, rl, key, ready):
    """The image step's upload: what the relay brought, checked against the controller's
    sha256 and moved into place; else (or when it failed) the controller's own push."""

    def upload(session, facts):
        # room where the engine keeps images, before anything is sent: the load unpacks the
        # layers there (about the archive's size; an OCI or docker archive is not compressed)
        _engine_room(facts, key, ready, img.size * 1.1)
        remote = pystack.node_path(file, facts)
        folder = posixpath.dirname(remote)
        if rl is not None and session.name in rl.source:
            r = session.run(
                relay.finalize_script(folder, {img.path.name: _sum(ctx.prov, img)}),
                label="relay arrival check of the image archive",
            )
            ok, _bad = relay.parse_finalize(r.stdout)
            if img.path.name in ok:
                with rl.lock:
                    rl.verified[session.name] = ok
                return
            why = rl.errors.get(session.name) or "the relayed archive failed its sha256 check"
            with rl.lock:
                rl.fallbacks[session.name] = why
            session.events.note(session.name, f"image relay: {why}; pushed by the controller")
        if not session.run(f"mkdir -p -m 700 {shlex.quote(folder)}").ok:
            raise NodeprepError(f"cannot create {folder}")
        sftp = session.conn.sftp()
        try:
            sftp.put(str(img.path), remote + ".part")
            sftp.posix_rename(remote + ".part", remote)
        except (OSError, EOFError) as e:
            raise NodeprepError(f"pushing {img.path.name} to {remote} failed: {e}") from None
        if rl is not None:
            rl.count(session.name, img.path.stat().st_size)
        session.log(f"pushed {img.path} as {remote}\n")

    return upload


def report(ctx):
    rl = ctx.prov.shared.image_relay
    if rl is None or (ctx.name not in rl.source and ctx.name not in rl.sent):
        return {}
    return {
        "container_image": {
            "from": rl.source.get(ctx.name, "controller"),
            "controller_bytes": rl.sent.get(ctx.name, 0),
            "relay_error": rl.errors.get(ctx.name),
            "fallback": rl.fallbacks.get(ctx.name),
        }
    }
