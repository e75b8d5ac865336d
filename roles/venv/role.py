"""venv: one venv at the same absolute path on every node, made from the inventory's `python`,
with pip bootstrapped OFFLINE when ensurepip is missing (Debian without python3-venv, old
cluster Pythons): `venv --without-pip`, then pip runs from its own pushed wheel to install
itself. Then the wheelhouse's exact lock is installed with --no-index."""
from __future__ import annotations

import posixpath
import shlex

from nodeprep.ops import pystack
from nodeprep.ops.launchenv import dsenv
from nodeprep.errors import InputError
from nodeprep.engine.remote import rpath
from nodeprep.engine.steps import FileBlock, Room, Step, StepCheck, scope_of
from nodeprep.ops.provision import room
from nodeprep.engine.facts import FILE, GPUS, MODULES, OS, PYTHON, STAMP, USER, VENV
from nodeprep.engine.facts.modules import under_modules, with_modules
from nodeprep.engine.facts.python import MAKING

MODES = ("auto", "no-pip", "ensurepip")


def validate(prov):
    pystack.requirement_pins(prov)
    for node, v in prov.vars.items():
        parts = [x for x in posixpath.normpath(v["venv_path"]).split("/") if x not in ("", "~", ".")]
        if not parts or ".." in parts:
            file, line = prov.origin(node, "venv_path")
            raise InputError(f"venv_path: {v['venv_path']!r} must be a directory of its own (it is "
                             "replaced when broken)", hint="e.g. ~/.nodeprep/venv", file=file, line=line)
        venv = str(v["venv_path"])
        plain = venv[2:] if venv.startswith("~/") else venv
        if not dsenv.pdsh_plain(plain):
            file, line = prov.origin(node, "venv_path")
            bad = sorted({c for c in plain if not dsenv.pdsh_plain(c)})
            raise InputError(f"venv_path: contains {', '.join(repr(c) for c in bad)}; DeepSpeed's "
                             f"pdsh launcher runs the venv's python in its remote command without "
                             f"quotes ({dsenv.PDSH_COMMAND})", hint="use letters, digits and "
                             "_@+=:,./- (and a leading ~/) only", file=file, line=line)
        if v["venv_bootstrap"] not in MODES:
            file, line = prov.origin(node, "venv_bootstrap")
            raise InputError(f"venv_bootstrap: {v['venv_bootstrap']!r} is not one of {', '.join(MODES)}",
                             file=file, line=line)


FACTS = [PYTHON, USER, OS, GPUS]


def reads(ctx):
    venv = ctx.vars["venv_path"]
    return [VENV(venv), FILE(ctx.vars["env_file"]), STAMP(pystack.verified_stamp(venv))] + (
        [MODULES] if ctx.vars.get("modules") else []  # the torch plan's cuda module
    )


def create_script(python: str, venv: str, wh: str, mode: str) -> str:
    py = shlex.quote(python)
    env = rpath(venv)
    house = rpath(wh)
    mark = f"mkdir -p {env} && : > {env}/{MAKING}"
    nopip = (f"{mark} && {py} -m venv --without-pip {env} && set -- {house}/pip-*.whl && [ -f \"$1\" ] && "
             f"{env}/bin/python \"$1\"/pip install -q --no-index \"$1\" && echo 'bootstrap: offline pip wheel'")
    ensure = f"{mark} && {py} -m venv {env} && echo 'bootstrap: ensurepip'"
    if mode == "no-pip":
        make = nopip
    elif mode == "ensurepip":
        make = ensure
    else:   # a failed `venv` leaves a venv without pip behind: start the fallback from scratch
        make = f"{{ {ensure}; }} || {{ echo 'ensurepip failed; using the pushed pip wheel'; rm -rf {env}; {nopip}; }}"
    return f"{{ {make}; }} && rm -f {env}/{MAKING}"


def _norm(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _venv_room(venv: str, key, manifest):
    """The room pip.install needs: about VENV_BYTES_PER_WHEEL_BYTE times the wheels of the
    packages it still has to install (ops/provision/room.py)."""
    local, m = manifest

    def need(facts) -> Room:
        have = (facts.get(key) or {}).get("packages") or {}
        lack = {_norm(p.split("==")[0]) for p in m["lock"] if have.get(p.split("==")[0]) != p.split("==")[1]}
        size = sum((local / n).stat().st_size for n in m["files"] if _norm(n.split("-")[0]) in lack)
        return Room(venv, int(size * room.VENV_BYTES_PER_WHEEL_BYTE),
                    int(size / 2**20 * room.VENV_FILES_PER_WHEEL_MB), what="the venv")
    return need


def _install_step(v: dict, key, manifest) -> Step:
    """pip installs the lock; packages whose files changed since torch last imported (the
    venv's verify stamp names them) are reinstalled by force, and that stamp dropped, since
    pip keeps whatever has the right version. With the node's modules loaded (the venv's
    python may need them)."""
    venv, wh = v["venv_path"], v["wheelhouse_dir"]
    lock, stamp = manifest[1]["lock"], STAMP(pystack.verified_stamp(venv))
    pip = (f"{rpath(venv)}/bin/python -m pip install -q --disable-pip-version-check --no-compile "
           f"--no-index --find-links {rpath(wh)}")

    def installed(facts):
        have = facts[key]["packages"]
        lack = [p for p in lock if have.get(p.split("==")[0]) != p.split("==")[1]]
        if lack:
            return StepCheck(False, f"{len(lack)} packages to install ({', '.join(lack[:4])}"
                                f"{', ...' if len(lack) > 4 else ''})")
        bad = pystack.damaged(facts.get(stamp), lock)
        return StepCheck(not bad, f"files of {', '.join(bad)} changed since torch last imported: reinstall")

    def action(facts):
        # --no-compile: byte-compiling every file of torch is most of the install under
        # emulation (aarch64 lab node: 66 s -> 13 s); the torch role's verify imports torch
        # right after, compiling what it loads
        bad = pystack.damaged(facts.get(stamp), lock)
        again = (f" && rm -f {rpath(pystack.verified_stamp(venv))} && {pip} --force-reinstall --no-deps "
                 + " ".join(shlex.quote(p) for p in bad)) if bad else ""
        return with_modules(v, f"{pip} -r {rpath(posixpath.join(wh, 'requirements.lock'))}{again}")
    return Step("pip.install requirements.lock", [key, stamp], installed, action=action,
                scope=scope_of(venv), room=_venv_room(venv, key, manifest))


def steps(ctx):
    v = ctx.vars
    f = ctx.facts
    prov = ctx.prov
    venv, key = v["venv_path"], VENV(v['venv_path'])
    out = []
    py = f.get(PYTHON)
    want_py = pystack.fleet_python(prov)
    if py and py["version"] != want_py:
        out.append(Step("venv.python_version", [PYTHON], lambda facts: StepCheck(
            False, f"Python {py['version']} here, {want_py} on the rest of the fleet"), action=None,
            hint="point `python` at the same version on every node"))
    want_path = pystack.fleet_majority(prov, lambda n, ff: pystack.venv_path(prov.vars[n], ff), "venv_path")
    here = pystack.venv_path(v, f)
    if here != want_path:
        out.append(Step("venv.path", [USER], lambda facts: StepCheck(
            False, f"venv would be {here} here but {want_path} elsewhere"), action=None,
            hint="set venv_path to an absolute path that exists on every node"))
    if out:
        return out
    # The inventory's command, not the resolved sys.executable: a wrapper or module-loaded
    # interpreter must be the one that makes the venv.
    python = v["python"] or "python3"

    def exists(facts):
        e = facts[key]
        if e.get("making"):
            return StepCheck(False, "its making was cut short")
        made_by = posixpath.dirname(py["path"]) if py else None
        if made_by and v.get("modules") and e["exists"] and e.get("home") not in (None, made_by):
            # the modules now put another interpreter first: a change, not a silent mismatch
            return StepCheck(False, f"made by the python in {e['home']}, the modules give {made_by}")
        if e["exists"] and e["python"] == py["version"] and "pip" in e["packages"]:
            return StepCheck(True)
        return StepCheck(False, "missing" if not e["exists"] else "no pip" if e["python"] else
                     "broken (its python does not run)")
    # Only ever delete a directory that is a venv (has pyvenv.cfg) or one nodeprep was making,
    # never a user's directory.
    refuse = shlex.quote(f"{venv} exists and is not a venv; refusing to replace it")
    replace = (f"if [ -e {rpath(venv)} ]; then [ -f {rpath(venv)}/pyvenv.cfg ] || [ -f {rpath(venv)}/{MAKING} ] "
               f"|| {{ echo {refuse} >&2; exit 1; }}; rm -rf {rpath(venv)}; fi; ")
    out.append(Step(f"venv.create {venv}", [VENV(venv)], exists,
                    # with `modules`: made by the interpreter they put first, in their environment
                    action=under_modules(v, replace + create_script(
                        python, venv, v["wheelhouse_dir"], v["venv_bootstrap"])),
                    scope=scope_of(venv)))
    pystack.wheelhouse_manifests(prov)      # no-op when the wheelhouse role already did it
    manifest = prov.shared.manifests.get(ctx.name)
    if manifest:
        out.append(_install_step(v, key, manifest))
    env = pystack.path_env(v, f)["PATH"].split(":")[0]
    out.append(FileBlock(v["env_file"], "venv", f"export PATH={shlex.quote(env)}:\"$PATH\"\n", mode=0o600))
    return out


def report(ctx):
    """Each node's installed packages (pip freeze) go into the run report."""
    e = ctx.facts.get(VENV(ctx.vars['venv_path'])) or {}
    return {"pip_freeze": sorted(f"{n}=={ver}" for n, ver in e.get("packages", {}).items())}
