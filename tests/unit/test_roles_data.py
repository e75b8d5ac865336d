"""Roles tested as data (issue 28, item 6), the way pyinfra tests its operations: each
tests/roles/<role>/<case>.yml gives the nodes' variables, the facts their probe returned (in
the form the fact parsers produce, keyed by the fact's key) and the plan the role must make
from them; tests/roles/README.md describes the format. For every case:

  1. the plan: the roles' validate(prov) and steps(ctx), run as `provision` runs them
     (commands.provision.validated and node_steps), give the expected steps, in order, with
     their checks (ok, or the `why` they report) and the files they leave; or the expected
     one-line error;
  2. convergence on paper: the effect of each differing step is applied to its node's facts
     (Step.after; for the step kinds without one, EFFECTS below says what their action
     leaves), every node is planned again from those facts, and every step's check passes:
     a second run plans nothing (commands.provision._converged agrees). The steps a second
     run still plans are listed in STILL_DIFFER, each with its reason.

Pure: no ssh, no process is started (a guard refuses one); the controller's home and
nodeprep's state directory are a temporary directory holding only what the case gives."""

from __future__ import annotations

import base64
import copy
import json
import re
import shlex
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from packaging.utils import canonicalize_name

from nodeprep.commands.options import ProvisionOptions
from nodeprep.commands.provision import _converged, validated
from nodeprep.commands.waves import node_steps
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.engine.facts import FILE, LOGIN_SHELL, OS, PYTHON, FactValues
from nodeprep.engine.steps import action_for
from nodeprep.errors import InputError, NodeprepError
from nodeprep.ops import pystack
from nodeprep.ops.container import archive
from nodeprep.ops.provision import roles as rolemod
from nodeprep.ops.pystack import relay
from nodeprep.settings import Settings, find_project

ROOT = find_project(Path(__file__).parent)
CASES_DIR = ROOT / "tests" / "roles"
RECORDED = ROOT / "tests" / "facts"
SITE = rolemod.site_order(ROOT / "roles")
CASES = sorted(CASES_DIR.glob("*/*.yml"))
CASE_KEYS = {
    "roles",
    "hosts",
    "vars",
    "node",
    "check",
    "facts",
    "controller_files",
    "shared",
    "plan",
    "error",
    "error_at",
}
STEP_KEYS = {
    "step",
    "check",
    "fixable",
    "file",
    "has",
    "lacks",
    "mode",
    "action_has",
    "hint_has",
    "scope",
    "secrets",
    "fleet",
}
DEFAULT_HOSTS = {"node-0": {"address": "10.200.0.10"}}


# ---------------------------------------------------------------------------- case files


class CaseLoader(yaml.SafeLoader):
    """YAML plus four tags that give facts in the parsers' form: `!recorded fact/case` (the
    real output recorded in tests/facts/<fact>/<case>.json, through the fact's own parser),
    `!file {content, mode}` and `!missing` (the FILE fact of a file that exists or not), and
    `!stamp {head, changed}` (the STAMP fact: a verify's stamp; bare `!stamp`: none)."""


def _recorded(loader, node):
    fact, _, name = loader.construct_scalar(node).partition("/")
    data = json.loads((RECORDED / fact / f"{name}.json").read_text())
    return factmod.ALL[fact].parse(data["output"], data["rc"])


def _file(loader, node):
    spec = loader.construct_mapping(node, deep=True)
    assert set(spec) <= {"content", "mode", "size"}, f"!file takes content, mode, size: {spec}"
    mode = spec.get("mode", "644")
    assert isinstance(mode, str), f"!file mode {mode!r}: write it quoted, e.g. '600'"
    content = spec.get("content")
    size = spec["size"] if content is None else len(content.encode("utf-8", "surrogateescape"))
    return {"exists": True, "mode": int(mode, 8), "size": size, "content": content}


def _missing(loader, node):
    return {"exists": False, "mode": None, "size": 0, "content": None}


def _stamp(loader, node):
    """`!stamp {head, changed}` (changed: the files that differ since; default none), or a bare
    `!stamp` for no stamp: the STAMP fact's value."""
    spec = loader.construct_mapping(node, deep=True) if isinstance(node, yaml.MappingNode) else None
    if not spec:
        return {"exists": False, "head": None, "same": False, "changed": []}
    assert set(spec) <= {"head", "changed"}, f"!stamp takes head, changed: {spec}"
    head = spec["head"] if isinstance(spec["head"], str) else json.dumps(spec["head"])
    changed = sorted(spec.get("changed") or [])
    return {"exists": True, "head": head, "same": not changed, "changed": changed}


CaseLoader.add_constructor("!recorded", _recorded)
CaseLoader.add_constructor("!file", _file)
CaseLoader.add_constructor("!missing", _missing)
CaseLoader.add_constructor("!stamp", _stamp)


def load_case(path: Path) -> dict:
    text = path.read_text()
    assert text.startswith("# "), f"{path.name}: the first line is a comment naming what it covers"
    case = yaml.load(text, Loader=CaseLoader)
    assert set(case) <= CASE_KEYS, f"unknown keys {set(case) - CASE_KEYS}"
    assert ("plan" in case) != ("error" in case), "a case expects a plan or an error"
    for want in case.get("plan") or []:
        assert {"step", "check"} <= set(want) <= STEP_KEYS, f"step entry keys: {sorted(want)}"
        assert (
            not want["step"].startswith("file.")
            or want["check"] == "ok"
            or {"file", "has"} & set(want)
        ), f"{want['step']}: say the file it leaves (file or has)"
    return case


# ---------------------------------------------------------------------------- the run


class Run:
    """One case's world: the inventory written where validate reads it, the controller's
    files, the settings; steps() builds the Provisioning as `provision` does, gives it the
    facts and the case's Shared fields, and plans every node."""

    def __init__(self, path: Path, tmp: Path):
        self.role = path.parent.name
        self.case = load_case(path)
        self.roles = self.case.get("roles") or [self.role]
        self.tmp, self.home = tmp, tmp / "home"
        self.settings = Settings(project_root=str(ROOT), state_dir=str(tmp / "state"))
        self.inventory = self._inventory()
        for name, text in (self.case.get("controller_files") or {}).items():
            target = self.where(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)

    def where(self, name: str) -> Path:
        """A controller path of the case: ~/x in the controller's home, state/x in nodeprep's
        state directory, anything else beside the inventory."""
        assert ".." not in Path(name).parts, name
        if name.startswith("~/"):
            return self.home / name[2:]
        if name.startswith("state/"):
            return self.settings.state / name[len("state/") :]
        return self.tmp / name

    def _inventory(self) -> Path:
        data = {
            "vars": self.case.get("vars") or {},
            "hosts": self.case.get("hosts") or DEFAULT_HOSTS,
        }
        path = self.tmp / "hosts.yml"
        path.write_text(
            yaml.safe_dump(
                data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000
            )
        )
        return path

    def facts(self) -> dict:
        out = {}
        for node, values in (self.case.get("facts") or {}).items():
            bad = [k for k in values if k.split(":", 1)[0] not in factmod.ALL]
            assert bad == [], f"{node}: not fact keys: {bad}"
            out[node] = FactValues(copy.deepcopy(values))
        return out

    def steps(self, facts: dict):
        opts = ProvisionOptions(
            inventory=str(self.inventory),
            roles=",".join(self.roles),
            check_mode=bool(self.case.get("check")),
        )
        roles, prov = validated(opts, self.settings, Events())
        assert sorted(facts) == sorted(h.name for h in prov.hosts), "facts for every node"
        prov.facts = facts
        self._give(prov)
        self._declared_facts_given(roles, prov)
        return roles, prov, {h.name: node_steps(rolemod.Ctx(h, prov), roles) for h in prov.hosts}

    def _give(self, prov) -> None:
        """The case's Shared fields: what controller(prov) would have computed with the network,
        keys or the wheelhouse (e.g. manifests: wheels the controller downloaded)."""
        given = self.case.get("shared") or {}
        assert set(given) <= {f.name for f in fields(rolemod.Shared)}, sorted(given)
        if {"wheelhouse", "venv"} & set(self.roles):  # else steps() would resolve wheels
            assert "manifests" in given, "give shared.manifests: the controller's wheelhouse"
        for name, value in given.items():
            if name == "manifests":
                value = {
                    n: (self.settings.state / "wheelhouse" / m["platform"], m)
                    for n, m in value.items()
                }
                _manifests_as_the_controller_makes_them(prov, value)
            elif name == "relay":
                value = relay.Relay(order=[h.name for h in prov.hosts]) if value else None
            elif name in ("cluster_key", "controller_key"):
                value = self.where(value)
            elif name == "images":  # node -> the ArchiveImage container.controller() reads
                value = {
                    n: archive.ArchiveImage(
                        **{**d, "path": Path(d["path"]), "tags": tuple(d["tags"])}
                    )
                    for n, d in value.items()
                }
            setattr(prov.shared, name, value)

    def _declared_facts_given(self, roles, prov) -> None:
        """Every fact the roles declare (FACTS, reads(ctx)) is in the case: the probe's answer."""
        for h in prov.hosts:
            ctx = rolemod.Ctx(h, prov)
            asked = [f for r in roles for f in r.facts()] + [q for r in roles for q in r.reads(ctx)]
            assert [factmod.key_of(q) for q in asked if q not in prov.facts[h.name]] == [], h.name

    def shown(self, text: str) -> str:
        return text.replace(str(self.home), "~").replace(str(self.tmp), "$TMP")


def _manifests_as_the_controller_makes_them(prov, manifests: dict) -> None:
    """A stubbed manifest may not drift from what pystack.wheelhouse_manifests would make: the
    node's own platform, and a lock of canonical name==version lines holding every pin the
    controller asks pip for (the requirements, the torch plan's build, wheel_builds)."""
    plan = pystack.torch_plan(prov)
    first = next(iter(prov.vars.values()))
    for node, (_dir, m) in manifests.items():
        facts = prov.facts[node]
        assert m["platform"] == pystack.platform(facts).key, node
        build = plan.for_arch(facts["os"]["arch"]) if plan else None
        asked = (
            pystack.requirement_pins(prov)
            + ([build.requirement] if build else [])
            + list(first["wheel_builds"] or {})
        )
        lock = set(m["lock"])
        assert [
            p for p in m["lock"] if canonicalize_name(p.split("==")[0]) != p.split("==")[0]
        ] == []
        assert [p for p in asked if _canonical(p) not in lock] == [], node


def _canonical(pin: str) -> str:
    name, _, version = pin.partition("==")
    return f"{canonicalize_name(name)}=={version}"


# ---------------------------------------------------------------------------- effects


def _pip_effect(st, view, prov, node) -> dict:
    """pip installs the node's requirements.lock (the wheelhouse role's file; the controller's
    manifest lock when this case does not plan that role): the venv's packages, by the
    canonical names the VENV fact reads from the dist-info directories."""
    key = st.reads[0].key
    lock_file = view.get(FILE(prov.vars[node]["wheelhouse_dir"].rstrip("/") + "/requirements.lock"))
    lines = (
        lock_file["content"].split()
        if lock_file and lock_file["exists"]
        else prov.shared.manifests[node][1]["lock"]
    )
    venv = copy.deepcopy(view[key])
    venv["packages"].update({canonicalize_name(p.split("==")[0]): p.split("==")[1] for p in lines})
    stamp = st.reads[1].key
    if "--force-reinstall" in action_for(st, view):  # damaged packages: the stamp dropped
        return {key: venv, stamp: {"exists": False, "head": None, "same": False, "changed": []}}
    return {key: venv}


def _venv_effect(st, view, prov, node) -> dict:
    """The action removes what is there (a venv only) and makes a venv with the inventory's
    python (the PYTHON fact's) and pip: the offline pip wheel's version (the lock's pip) where
    the wheelhouse has it; pip.install pins it to the lock right after either way."""
    m = (prov.shared.manifests or {}).get(node)
    pip = next(
        (p.split("==")[1] for p in (m[1]["lock"] if m else []) if p.startswith("pip==")),
        "ensurepip's",
    )
    return {
        st.reads[0].key: {
            "exists": True,
            "python": view[PYTHON]["version"],
            "packages": {"pip": pip},
        }
    }


def _sync_effect(st, view, prov, node) -> dict:
    """What the action writes, read from the action itself: SHA256SUMS (the base64 text it
    decodes into .sums.new), every wheel it names present (pushed by `before`, checked against
    its sha256), the wheels it does not name removed, the relay's staging directory gone."""
    script = action_for(st, view)
    sums = base64.b64decode(
        re.search(r"printf %s (\S+) \| base64 -d > \.sums\.new", script)[1]
    ).decode()
    names = {line.split("  ", 1)[1] for line in sums.splitlines()}
    listing_key, sums_key = st.reads[0].key, st.reads[1].key
    kept = [
        e
        for e in view[listing_key] or []
        if e not in (relay.STAGE, ".sums.new") and not (e.endswith(".whl") and e not in names)
    ]
    listing = base64.b64decode(
        re.search(r"printf %s (\S+) \| base64 -d > \.nodeprep-verified\.list", script)[1]
    ).decode()
    assert sorted(listing.splitlines()[1:]) == sorted(names)  # the stamp covers what was checked
    return {
        listing_key: sorted(set(kept) | names | {"SHA256SUMS", ".nodeprep-verified"}),
        sums_key: {"exists": True, "mode": 0o644, "size": len(sums.encode()), "content": sums},
        st.reads[2].key: {
            "exists": True,
            "head": listing.splitlines()[0],
            "same": True,
            "changed": [],
        },
    }


def _torch_verify_effect(st, view, prov, node) -> dict:
    """Its action imports torch in the venv and checks it against the plan (the `want` it
    carries, read from the action itself); when that passes it stamps the venv: the stamp
    says what a build covering those GPUs reports, on this node's CPU."""
    argv = shlex.split(action_for(st, view))
    want = json.loads(argv[argv.index("-c") + 2])
    head = {
        "version": want["version"],
        "cuda": want["cuda"],
        "machine": view[OS]["arch"],
        "arch_list": [f"sm_{c.replace('.', '')}" for c in want["capabilities"]],
    }
    return {
        st.reads[1].key: {"exists": True, "head": json.dumps(head), "same": True, "changed": []}
    }


# What the action of a step without Step.after leaves, by the start of the step's name.
def _image_effect(st, view, prov, node) -> dict:
    """The load leaves the engine holding the image's ID (what the action's inspect checks)."""
    img = prov.shared.images[node]
    key = st.reads[0].key
    fact = copy.deepcopy(view[key])
    for e in fact["engines"].values():
        if e.get("access") in ("ok", "sudo"):
            e["images"].append({"id": img.id, "name": (img.tags or ("",))[0], "digest": ""})
            break
    return {key: fact}


EFFECTS = {
    "user.shell ": lambda st, view, prov, node: {LOGIN_SHELL.key: st.name.split(" ", 1)[1]},
    "venv.create ": _venv_effect,
    "pip.install requirements.lock": _pip_effect,
    "wheelhouse.sync ": _sync_effect,
    # its action runs the VERIFY script in the venv: it checks torch, it installs nothing
    "torch.verify ": _torch_verify_effect,
    "container.image ": _image_effect,
    # --check without a cached wheelhouse: the action is `:` (nothing is done in --check)
    "wheelhouse.sync": lambda st, view, prov, node: {},
}

# The steps a second run still plans, on paper; each: (start of its name, when, why).
STILL_DIFFER = [
    (
        "modules.load ",
        lambda st, roles, prov: st.action is None,
        "a module or module system nodeprep does not install (no action): the step fails with "
        "its fix until someone installs it or the inventory names what the node has",
    ),
    (
        "container.engine ",
        lambda st, roles, prov: st.action is None,
        "an engine nodeprep does not install or allow (no action): the step fails with its fix "
        "until someone installs the engine or lets the user run it",
    ),
    (
        "nccl.library ",
        lambda st, roles, prov: st.action is None,
        "a library nodeprep does not install (no action): the step fails with its hint until "
        "someone installs it or fixes the *_home variable",
    ),
    (
        "venv.python_version",
        lambda st, roles, prov: st.action is None,
        "the node's Python differs from the fleet's: nodeprep installs no Python (no action)",
    ),
    (
        "venv.path",
        lambda st, roles, prov: st.action is None,
        "the venv's absolute path differs from the fleet's (another home path): no action",
    ),
    (
        "wheelhouse.download",
        lambda st, roles, prov: st.action is None,
        "the controller could not resolve this platform's wheels: no action on the node",
    ),
    (
        "user.shell ",
        lambda st, roles, prov: st.action is None,
        "the wanted shell is not in the node's /etc/shells: nodeprep does not install shells",
    ),
    (
        "wheelhouse.sync",
        lambda st, roles, prov: st.name == "wheelhouse.sync" and prov.check_mode,
        "--check without a cached wheelhouse: a placeholder whose check says 'would download'",
    ),
    (
        "torch.verify ",
        lambda st, roles, prov: "venv" not in roles,
        "its action verifies torch and installs nothing: torch comes from the venv role's "
        "pip.install of the lock (tests/roles/torch/with_venv.yml converges)",
    ),
]


def effect(st, view, prov, node) -> dict:
    """The facts STEP's action leaves, from VIEW (the node as the earlier steps leave it)."""
    if st.after:
        return st.after(view)
    for start, fn in EFFECTS.items():
        if st.name.startswith(start) and (start.endswith(" ") or st.name == start):
            return fn(st, view, prov, node)
    raise AssertionError(
        f"nothing says what '{st.name}' leaves: give it Step.after, or an entry in EFFECTS"
    )


# ---------------------------------------------------------------------------- comparison


def observed(st, c, view, left: dict, want: dict) -> dict:
    """What STEP shows for the keys WANT names (a case names only what it cares about)."""
    got = {"step": st.name, "check": "ok" if c.ok else c.why}
    files = [v for k, v in left.items() if k.startswith("file:")]
    text = files[0]["content"] if len(files) == 1 else None
    picks = {
        "fixable": lambda: st.action is not None,
        "file": lambda: text,
        "has": lambda: [x for x in want["has"] if x in (text or "")],
        "lacks": lambda: [x for x in want["lacks"] if x not in (text or "")],
        "mode": lambda: f"{files[0]['mode']:o}" if len(files) == 1 else None,
        "action_has": lambda: [x for x in want["action_has"] if x in (action_for(st, view) or "")],
        "hint_has": lambda: [x for x in want["hint_has"] if x in st.hint],
        "scope": lambda: st.scope,
        "secrets": lambda: st.secrets,
        "fleet": lambda: st.fleet[0] if st.fleet else None,
    }
    got.update({k: picks[k]() for k in want if k in picks})
    return got


def apply_on_paper(steps, facts, prov, node, wants=None):
    """The node's facts after one run (the differing steps with an action, in order, each on
    the facts the earlier ones leave, as the batched apply does), and what each step shows."""
    view = FactValues(copy.deepcopy(dict(facts)))
    shown = []
    for i, st in enumerate(steps):
        c = st.check(facts)
        left = effect(st, view, prov, node) if st.action is not None else {}
        if wants is not None and i < len(wants):
            shown.append(observed(st, c, view, left, wants[i]))
        if not c.ok and st.action is not None:
            view.update(left)
    return view, shown


def still_differs(st, roles, prov) -> str | None:
    for start, when, why in STILL_DIFFER:
        if st.name.startswith(start) and when(st, roles, prov):
            return why
    return None


# ---------------------------------------------------------------------------- tests


@pytest.fixture(autouse=True)
def _no_process(monkeypatch):
    """Nothing runs but OpenSSH's own reading of a config (`ssh -G`: no connection, the
    oracle ssh_config's alias-conflict check asks)."""
    real = subprocess.Popen

    def refuse(*a, **kw):
        argv = a[0] if a else kw.get("args")
        if isinstance(argv, (list, tuple)) and list(argv[:2]) == ["ssh", "-G"]:
            return real(*a, **kw)
        raise AssertionError(f"a role case started a process: {a[:1]}")

    monkeypatch.setattr(subprocess, "Popen", refuse)


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_role_case(path, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the controller's home: the case's
    run = Run(path, tmp_path)
    case = run.case
    if "error" in case:
        _expect_error(run)
        return
    roles, prov, steps_by_node = run.steps(run.facts())
    node = case.get("node") or prov.hosts[0].name
    steps = steps_by_node[node]
    assert [st.name for st in steps] == [w["step"] for w in case["plan"]]
    after = {}
    for h in prov.hosts:
        wants = case["plan"] if h.name == node else None
        after[h.name], shown = apply_on_paper(
            steps_by_node[h.name], prov.facts[h.name], prov, h.name, wants
        )
        if wants is not None:
            assert shown == case["plan"]
    _second_run_plans_nothing(run, after)


def _expect_error(run: Run) -> None:
    with pytest.raises(NodeprepError) as err:
        run.steps(run.facts())
    e = err.value
    text = str(e)
    if isinstance(e, InputError) and e.file:
        text = text[len(f"{e.file}:{e.line}: " if e.line else f"{e.file}: ") :]
    assert run.shown(text) == run.case["error"]
    var = run.case.get("error_at")
    if var:  # the error names the inventory line that sets VAR
        assert isinstance(e, InputError) and Path(e.file).name == "hosts.yml" and e.line
        line = run.inventory.read_text().splitlines()[e.line - 1]
        assert line.strip().startswith(f"{var}:"), line


def _second_run_plans_nothing(run: Run, facts: dict) -> None:
    roles, prov, steps_by_node = run.steps(facts)
    left = []
    for name, steps in steps_by_node.items():
        for st in steps:
            if all(r in facts[name] for r in st.reads) and st.check(facts[name]).ok:
                continue
            lacking = [factmod.key_of(r) for r in st.reads if r not in facts[name]]
            assert still_differs(st, run.roles, prov), (
                f"{name}: a second run steps_by_node '{st.name}' again: "
                + (f"facts {lacking} not known" if lacking else st.check(facts[name]).why)
            )
            left.append(st.name)
    assert _converged(prov, roles, {}) is (not left)


def test_cases_were_found():
    """An empty glob must fail, not pass."""
    assert len(CASES) >= 2 * len(SITE) and SITE


def test_every_role_has_cases():
    counts = {role: len(list((CASES_DIR / role).glob("*.yml"))) for role in SITE}
    assert {r: n for r, n in counts.items() if n < 2} == {}
    assert sorted({p.parent.name for p in CASES} - set(SITE)) == []


def test_the_effects_cover_every_step_kind_the_roles_plan():
    """EFFECTS and STILL_DIFFER name steps that exist: a renamed step must not leave a stale
    entry behind (its effect would silently stop applying)."""
    names = set()
    for path in CASES:
        for want in load_case(path).get("plan") or []:
            names.add(want["step"])
    for start in [*EFFECTS, *(s for s, _w, _y in STILL_DIFFER)]:
        assert any(n.startswith(start) for n in names), start
