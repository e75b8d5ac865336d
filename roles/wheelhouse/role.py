"""wheelhouse: the controller resolves and downloads every wheel the nodes need once per node
platform (src/nodeprep/wheelhouse.py), then pushes each node only the files it lacks (by
sha256) over the run's own SSH connection, so nodes never talk to a package index."""
from __future__ import annotations

import posixpath
import shlex
from pathlib import Path

from nodeprep import pystack
from nodeprep.errors import InputError, NodeprepError
from nodeprep.remote import rpath
from nodeprep.report import StepResult
from nodeprep.settings import ROOT
from nodeprep.steps import Check, FileContent, Step
from nodeprep.wheelhouse import Wheelhouse, read_requirements

SUMS = "SHA256SUMS"


def _req_paths(run, v) -> list[Path]:
    base = Path(run.inventory.path).parent if run.inventory.path else ROOT
    out = []
    for p in v["python_requirements"]:
        p = Path(p).expanduser()
        out.append(p if p.is_absolute() else (base / p if (base / p).exists() else ROOT / p))
    return out


def validate(run):
    first = next(iter(run.vars.values()))
    run.shared["pins"] = read_requirements(_req_paths(run, first))
    for pin in first["wheel_builds"] or {}:
        if pin.split("==")[0].strip() and "==" not in pin:
            file, line = run.origin(next(iter(run.vars)), "wheel_builds")
            raise InputError(f"wheel_builds: {pin!r} is not pinned", hint="write name==version",
                             file=file, line=line)


FACTS = ["os", "python", "user"]


def reads(ctx):
    d = ctx.vars["wheelhouse_dir"]
    return [("dir", d), ("file", posixpath.join(d, SUMS))]


def controller(run):
    """Build and download once per platform; in --check mode only say what would happen."""
    first = next(iter(run.vars.values()))
    plan = pystack.torch_plan(run)
    index = ["--extra-index-url", plan.index_url] if plan and plan.index_url else []
    pins = run.shared["pins"] + ([plan.requirement] if plan else [])
    house = run.shared.setdefault("wheelhouse", Wheelhouse(run.settings.state / "wheelhouse"))
    manifests = run.shared.setdefault("manifests", {})
    # A node on another Python than the fleet is failed by the venv role (naming both
    # versions); resolving wheels for its platform would only add a second, confusing error.
    fleet_py = pystack.fleet_python(run)
    platforms = {n: pystack.platform(f) for n, f in run.facts.items()
                 if f.get("python") and f["python"]["version"] == fleet_py}
    errors = run.shared.setdefault("wheelhouse_errors", {})
    pins = pins + list(first["wheel_builds"] or {})
    built = None if run.check else house.build(first["wheel_builds"], plan.requirement if plan else None,
                                               index)
    results = []
    for p in sorted(set(platforms.values()), key=lambda p: p.key):
        if run.check:   # plan from the cache when it matches; never download in --check
            m = house.cached(p, pins, index)
            if m is None:
                results.append(StepResult(f"wheelhouse.download {p.key}", "changed",
                                          "would resolve and download"))
                continue
        else:
            before = house.downloads.get(p.key, 0)
            try:
                m = house.resolve(p, pins, index, [built])
            except NodeprepError as e:   # fails this platform's nodes, not the whole fleet
                results.append(StepResult(f"wheelhouse.download {p.key}", "failed", str(e)))
                errors.update({n: str(e) for n, q in platforms.items() if q == p})
                continue
        fresh = not run.check and house.downloads.get(p.key, 0) > before
        results.append(StepResult(f"wheelhouse.download {p.key}", "changed" if fresh else "ok",
                                  f"{len(m['files'])} wheels " + ("downloaded" if fresh else "cached")))
        for node, q in platforms.items():
            if q == p:
                manifests[node] = (house.root / p.key, m)
    return results


def _sums(text: str | None) -> dict[str, str]:
    out = {}
    for line in (text or "").splitlines():
        sha, _, name = line.partition("  ")
        out[name.strip()] = sha
    return out


def steps(ctx):
    d = ctx.vars["wheelhouse_dir"]
    if ctx.name in ctx.run.shared.get("wheelhouse_errors", {}):
        err = ctx.run.shared["wheelhouse_errors"][ctx.name]
        return [Step("wheelhouse.download", [], lambda f: Check(False, err.splitlines()[0]), None,
                     hint="the controller could not resolve the wheels for this node's platform: "
                          + " | ".join(err.splitlines()[1:])[-300:])]
    if ctx.name not in ctx.run.shared.get("manifests", {}):
        return [Step("wheelhouse.sync", [], lambda f: Check(False, "would download and push the "
                                                                   "wheelhouse"), ":")]
    local, m = ctx.run.shared["manifests"][ctx.name]
    files = m["files"]
    sums_text = "".join(f"{sha}  {name}\n" for name, sha in sorted(files.items()))
    listing_key, sums_key = f"dir:{d}", f"file:{posixpath.join(d, SUMS)}"

    def missing(facts) -> list[str]:
        have = _sums((facts[sums_key] or {}).get("content"))
        present = set(facts[listing_key] or [])
        return [n for n, sha in files.items() if have.get(n) != sha or n not in present]

    def check(facts):
        lack = missing(facts)
        return Check(not lack, f"{len(lack)} of {len(files)} wheels to push" if lack else "")

    def upload(session, facts):
        remote_dir = pystack.node_path(d, facts)
        if not session.run(f"mkdir -p -m 700 {shlex.quote(remote_dir)}").ok:
            raise NodeprepError(f"cannot create {remote_dir}")
        sftp = session.conn.sftp()
        try:
            for name in missing(facts):
                tmp = f"{remote_dir}/.{name}.part"
                sftp.put(str(local / name), tmp)
                sftp.posix_rename(tmp, f"{remote_dir}/{name}")
                session.log(f"pushed {name}\n")
        except (OSError, EOFError) as e:
            raise NodeprepError(f"pushing wheels to {remote_dir} failed: {e}") from None

    # After the uploads: check every wheel against the controller's sha256, drop stale ones,
    # then record the sums (the file the next run's check reads).
    verify = (f"cd {rpath(d)} && "
              f"printf %s {_b64(sums_text)} | base64 -d > .sums.new && sha256sum -c --quiet .sums.new && "
              f"for f in *.whl; do grep -qF \"  $f\" .sums.new || rm -f -- \"$f\"; done && "
              f"mv -f .sums.new {SUMS}")
    return [Step(f"wheelhouse.sync {len(files)} wheels ({m['platform']})",
                 [("dir", d), ("file", posixpath.join(d, SUMS))], check, verify, before=upload,
                 hint="see the node's free disk space and the run log"),
            FileContent(posixpath.join(d, "requirements.lock"), "\n".join(m["lock"]) + "\n", 0o644)]


def _b64(text: str) -> str:
    import base64
    return base64.b64encode(text.encode()).decode()

