"""wheelhouse: the controller resolves and downloads every wheel the nodes need once per node
platform (src/nodeprep/wheelhouse.py), then pushes each node only the files it lacks (by
sha256) over the run's own SSH connection, so nodes never talk to a package index."""
from __future__ import annotations

import posixpath
import shlex

from nodeprep.ops import pystack
from nodeprep.errors import InputError, NodeprepError
from nodeprep.engine.remote import rpath
from nodeprep.engine.steps import Check, FileContent, Step, scope_of
from nodeprep.engine.facts import DIR, FILE, OS, PYTHON, USER

SUMS = "SHA256SUMS"


def validate(prov):
    first = next(iter(prov.vars.values()))
    pystack.requirement_pins(prov)
    for pin in first["wheel_builds"] or {}:
        if pin.split("==")[0].strip() and "==" not in pin:
            file, line = prov.origin(next(iter(prov.vars)), "wheel_builds")
            raise InputError(f"wheel_builds: {pin!r} is not pinned", hint="write name==version",
                             file=file, line=line)


FACTS = [OS, PYTHON, USER]


def reads(ctx):
    d = ctx.vars["wheelhouse_dir"]
    return [DIR(d), FILE(posixpath.join(d, SUMS))]


def controller(prov):
    """Build and download once per platform; in --check mode only from the cache."""
    return pystack.wheelhouse_manifests(prov)


def _sums(text: str | None) -> dict[str, str]:
    out = {}
    for line in (text or "").splitlines():
        sha, _, name = line.partition("  ")
        out[name.strip()] = sha
    return out


def steps(ctx):
    d = ctx.vars["wheelhouse_dir"]
    if ctx.name in ctx.prov.shared.wheelhouse_errors:
        err = ctx.prov.shared.wheelhouse_errors[ctx.name]
        return [Step("wheelhouse.download", [], lambda f: Check(False, err.splitlines()[0]), None,
                     hint="the controller could not resolve the wheels for this node's platform: "
                          + " | ".join(err.splitlines()[1:])[-300:])]
    if ctx.name not in ctx.prov.shared.manifests:
        return [Step("wheelhouse.sync", [], lambda f: Check(False, "would download and push the "
                                                                   "wheelhouse"), ":")]
    local, m = ctx.prov.shared.manifests[ctx.name]
    files = m["files"]
    sums_text = "".join(f"{sha}  {name}\n" for name, sha in sorted(files.items()))
    listing_key, sums_key = DIR(d), FILE(posixpath.join(d, SUMS))

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
                 [DIR(d), FILE(posixpath.join(d, SUMS))], check, verify, before=upload,
                 hint="see the node's free disk space and the run log", scope=scope_of(d)),
            FileContent(posixpath.join(d, "requirements.lock"), "\n".join(m["lock"]) + "\n", 0o644)]


def _b64(text: str) -> str:
    import base64
    return base64.b64encode(text.encode()).decode()

