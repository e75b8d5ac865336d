"""The Python environment on a node: a venv (its Python and installed packages) and the torch
build inside it (version, CUDA, NCCL, arch list, and the libnccl it really loads)."""

from __future__ import annotations

import ast
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from nodeprep import nodeside
from nodeprep.engine.facts.modules import with_modules
from nodeprep.engine.facts.probe import Fact
from nodeprep.engine.remote import rpath

# In a venv being made, until it is whole (roles/venv writes and removes it): a venv whose
# making was cut (Ctrl-C, a node gone silent, a kill) is nodeprep's to replace.
MAKING = ".nodeprep-making"


def _venv_script(path: str) -> str:
    """No interpreter start for the answer (it cost ~0.1 s of CPU per node): the Python version
    from pyvenv.cfg and the packages from the *.dist-info directory names, which carry the
    normalized name and exact version (PEP 376/427). Whether the venv's interpreter still runs
    (its base Python may be gone) is one start (~6 ms), done again only when the stat of
    bin/python's target, of the dynamic linker's cache or of a directory on LD_LIBRARY_PATH
    (a module's Python that needs its module's libraries: cray-python) changed since it last
    ran, or LD_LIBRARY_PATH names a directory that is not there: the key
    is kept in the venv itself, per machine (<venv>/.nodeprep-runs.<machine-id>); a dangling
    bin/python has no stat, so it always runs (and fails)."""
    p = rpath(path)
    return (
        f"[ -x {p}/bin/python ] || {{ echo MISSING; exit 0; }}\n"
        # the version line of pyvenv.cfg with sh builtins (was sed | head: two execs)
        "v=\n"
        "h=\n"
        'while IFS= read -r l || [ -n "$l" ]; do\n'
        "  case $l in version_info*=*|'version '*=*|version=*) v=${l#*=};;\n"
        "    home*=*) h=${l#*=};; esac\n"
        f"done < {p}/pyvenv.cfg\n"
        "printf '%s\\n' \"${v:-?}\"\n"
        '[ -n "$h" ] && printf \'@H %s\\n\' "$h"\n'
        f"[ -f {p}/{MAKING} ] && echo @@MAKING@@\n"
        "m=\n"
        "IFS= read -r m 2>/dev/null < /etc/machine-id\n"
        "k=\n"
        "c=\n"
        "ok=\n"
        # the directories on LD_LIBRARY_PATH (a module's, the nccl block's) are in the key: a
        # library added, removed or renamed there changes its directory's mtime
        "set -f\n"
        "o=$IFS\n"
        "IFS=:\n"
        "set --\n"
        'for d in $LD_LIBRARY_PATH; do [ -n "$d" ] && set -- "$@" "$d"; done\n'
        "IFS=$o\n"
        "set +f\n"
        '[ -n "$m" ] &&\n'
        f"  k=$(stat -L --printf '%d:%i:%s:%Y ' -- {p}/bin/python /etc/ld.so.cache \"$@\" "
        "2>/dev/null) &&\n"
        f'  c={p}/.nodeprep-runs.$m && [ -f "$c" ] && IFS= read -r ok < "$c"\n'
        'if [ -n "$k" ] && [ "$ok" = "$k" ]; then :\n'
        f"elif {p}/bin/python -I -S -c ''; then\n"
        '  [ -n "$c" ] && { printf \'%s\\n\' "$k" > "$c.$$" && '
        'mv -f -- "$c.$$" "$c"; } 2>/dev/null\n'
        "else echo @@BROKEN@@; fi\n"
        # parameter expansion, not basename: one fork per package cost ~25 ms a node; the
        # wheel's platform tags (WHEEL's Tag lines but `-any`) read with sh's read builtin
        f"for d in {p}/lib/python*/site-packages/*.dist-info; do\n"
        '  [ -d "$d" ] || continue\n'
        "  w=$d/WHEEL\n"
        "  d=${d%.dist-info}\n"
        "  printf '%s\\n' \"${d##*/}\"\n"
        '  [ -f "$w" ] && while IFS= read -r l || [ -n "$l" ]; do\n'
        "    case $l in 'Tag: '*-any) ;; 'Tag: '*) printf '@T %s\\n' \"${l#Tag: }\";; esac\n"
        '  done < "$w"\n'
        "done\n"
        "true"
    )


def parse_venv(text: str, rc: int) -> dict:
    """{'exists', 'python' (version), 'packages': {canonical name: version}, 'platforms':
    {canonical name: [the wheel's platform tags, e.g. manylinux_2_17_x86_64]} for the packages
    whose wheel is not for any platform}, plus 'making': True where nodeprep's making of it
    never finished (MAKING is still there: cut by Ctrl-C, a kill or a silent node)."""
    from packaging.utils import canonicalize_name

    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines or lines[0] == "MISSING":
        return {"exists": False, "python": None, "packages": {}, "platforms": {}}
    making = {"making": True} if "@@MAKING@@" in lines else {}
    # pyvenv.cfg's home: the directory of the interpreter that made it (issue 46: a module
    # that now puts another one first is a change)
    home = {"home": ln[3:].strip() for ln in lines if ln.startswith("@H ")}
    lines = [ln for ln in lines if ln != "@@MAKING@@" and not ln.startswith("@H ")]
    if "@@BROKEN@@" in lines:
        return {
            "exists": True,
            "python": None,
            "packages": {},
            "platforms": {},
            "error": "its python does not run",
            **making,
        }
    pkgs = {}
    plats = {}
    last = None
    for ln in lines[1:]:
        if ln.startswith("@T "):
            tag = ln[3:].split("-")
            if last and len(tag) == 3:  # python-abi-platform; a compressed set a.b is two
                plats.setdefault(last, [])
                plats[last] += [t for t in tag[2].split(".") if t not in plats[last]]
            continue
        name, _, version = ln.rpartition("-")
        last = canonicalize_name(name) if name else None
        if last:
            pkgs[last] = version
    # virtualenv writes version_info = 3.8.10.final.0; venv writes version = 3.11.2
    return {
        "exists": True,
        "python": ".".join(lines[0].split(".")[:3]),
        "packages": pkgs,
        "platforms": plats,
        **home,
        **making,
    }


VENV = Fact(
    "venv", _venv_script, parse_venv, wrap=with_modules
)  # VENV(path): the venv at that path


def _bare_source(path: Path) -> str:
    """A module's code without its docstrings and comments: the probe travels in every
    verify's command line, and the head's fan-out carries one per distinct probe."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree) + "\n"


# `import torch` costs seconds of CPU, so the node caches its torch answer in
# ~/.nodeprep/torch_probe.<machine-id>.json keyed by torch's version.py (mtime, size), the
# NVIDIA driver line, and what decides which libnccl torch loads (_torch_script): it runs again
# only when one of them changed (or with deep=True).
# After the import, on CUDA builds only, the libnccl torch really mapped (nccl_probe.py, sent as
# its code: the node has no nodeprep): path and version, beside the NCCL torch was built with.
TORCH_PY = (
    _bare_source(nodeside.NCCL_PROBE)
    + r"""
import json, sys
import torch
cuda = torch.version.cuda
avail = bool(cuda) and torch.cuda.is_available()
out = {"version": torch.__version__, "cuda": cuda, "available": avail,
       "arch_list": torch.cuda.get_arch_list() if cuda else [], "nccl": None,
       "device_count": torch.cuda.device_count() if avail else 0}
if cuda:
    try:
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as e:  # an unusable NCCL is a finding, not a crash of the probe
        out["nccl"] = "error: %s" % e
    try:
        out["nccl_lib"] = runtime()
    except Exception as e:
        out["nccl_lib"] = {"error": "%s: %s" % (type(e).__name__, e)}
print(json.dumps(out))
"""
)


@dataclass(frozen=True)
class TorchIn:
    """TORCH_BUILD's argument: the venv, and whether to skip the node's cached answer. Its
    str is the venv alone, so the answer's key does not depend on `deep`."""

    venv: str
    deep: bool = False

    def __str__(self) -> str:
        return self.venv


def _torch_key(v: str) -> str:
    """sh: torch's directory in the venv V (MISSING, and the section ends, where there is
    none), then k, the cache's key: the stat of torch's version.py, of the dynamic linker's
    cache and of every libnccl.so.2 torch could load, the driver's line, LD_LIBRARY_PATH and
    LD_PRELOAD."""
    # sh builtins where they do (glob, read, set): this runs on every node at every verify
    return (
        "t=\n"
        f"for x in {v}/lib/python*/site-packages/torch; do\n"
        '  [ -d "$x" ] && { t=$x; break; }\n'
        "done\n"
        '[ -n "$t" ] || { echo MISSING; exit 0; }\n'
        "set -f\n"
        'set -- "$t/version.py" /etc/ld.so.cache "${t%/torch}/nvidia/nccl/lib/libnccl.so.2"\n'
        "o=$IFS\n"
        "IFS=:\n"
        'for x in $LD_LIBRARY_PATH; do set -- "$@" "$x/libnccl.so.2"; done\n'
        "IFS=': '\n"
        'for x in $LD_PRELOAD; do set -- "$@" "$x"; done\n'
        "IFS=$o\n"
        's=$(stat -L -c %n:%Y:%s "$@" 2>/dev/null)\n'
        "set -- $s\n"
        "set +f\n"
        "d=\n"
        "[ -r /proc/driver/nvidia/version ] && IFS= read -r d < /proc/driver/nvidia/version\n"
        'k="$* | $d | $LD_LIBRARY_PATH | $LD_PRELOAD"\n'
    )


def _torch_script(arg: TorchIn) -> str:
    """The cache is per machine (homes may be shared by machines with other drivers) and
    written through a temp file of this process's own, then renamed: two probes at once
    (two inventory nodes on one machine, or a shared home) never read a half-written one.
    A probe that fails or is stopped removes its temp file (an EXIT trap; the section is a
    subshell of its own, so the trap is the probe's alone).

    The probe runs in the environment of a non-interactive ssh shell, the one torchrun's,
    mpirun's and srun's ranks (and `verify-parity --collective`) start from: the env file
    nodeprep writes reaches it through ~/.bashrc. Its key holds what decides which libnccl
    `import torch` loads: LD_LIBRARY_PATH and LD_PRELOAD (their values, and the stat of the
    libnccl.so.2 each directory offers and of each preloaded file), the venv's nvidia-nccl
    wheel and the dynamic linker's cache (stat): a changed LD_LIBRARY_PATH, or a libnccl
    replaced in place, is never answered from the cache."""
    v = rpath(arg.venv)
    cache = '"$HOME/.nodeprep/torch_probe.${mid:-x}.json"'
    # Line 1 of the cache is its key, line 2 the answer.
    return (
        "mid=\n"
        "[ -s /etc/machine-id ] && IFS= read -r mid < /etc/machine-id\n"
        + (f"rm -f {cache}\n" if arg.deep else "")
        + _torch_key(v)
        + "c=\n"
        "a=\n"
        f"[ -f {cache} ] && {{\n"
        "  IFS= read -r c\n"
        '  while IFS= read -r l || [ -n "$l" ]; do a=$l; done\n'
        f"}} < {cache}\n"
        'if [ -n "$c" ] && [ "$c" = "$k" ]; then printf \'%s\\n\' "$a"\n'
        "else\n"
        # the temp file goes however the probe ends: torch failing to import, or the probe
        # stopped (TERM to its process group, from `timeout` or a Ctrl-C on the controller)
        f'  tmp={cache[:-1]}.$$.tmp"\n'
        "  trap 'rm -f -- \"$tmp\"' EXIT\n"
        "  trap 'exit 143' HUP INT TERM\n"
        '  mkdir -p "$HOME/.nodeprep" && {\n'
        "    printf '%s\\n' \"$k\"\n"
        f"    {v}/bin/python -I -c {shlex.quote(TORCH_PY)}\n"
        '  } > "$tmp" && tail -n 1 "$tmp" && mv -f "$tmp" ' + cache + "\n"
        "fi"
    )


def _torch_build(text: str, rc: int):
    """torch as the venv sees it: version, cuda, nccl, is_available, arch list (None if absent)."""
    lines = text.strip().splitlines()
    if not lines or lines[-1] == "MISSING":
        return None
    for line in reversed(lines):  # import warnings may precede the JSON line
        if line.startswith("{"):
            return json.loads(line)
    return {"error": lines[-1][:200]}


TORCH_BUILD = Fact(
    "torch_build", _torch_script, _torch_build, wrap=with_modules
)  # TORCH_BUILD(TorchIn(venv, deep))


# The Python stack inside an image: its python3's version and installed distributions, then the
# same torch probe as TORCH_BUILD's; the first line is printed before torch is imported, so an
# image without torch still says what it holds.
STACK_PY = r"""
import json, sys
import importlib.metadata as md
pk = {}
for d in md.distributions():
    name = d.metadata["Name"]
    if name:
        pk[name.lower().replace("_", "-")] = d.version
print(json.dumps({"python": sys.version.split()[0], "packages": pk}), flush=True)
"""


def _image_script(image_id: str) -> str:
    """sh: the image's stack, from `ENGINE run --rm --network none IMAGE python3` with the engine
    that holds IMAGE_ID (directly, or through `sudo -n`). An image ID names its content, so a
    complete answer is kept under ~/.nodeprep by the ID and never asked again; MISSING where no
    engine holds the image."""
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", image_id):  # the ID names the cache file
        return "echo MISSING"
    ident = shlex.quote(image_id)
    cache = f'"$HOME/.nodeprep/image_probe.{image_id.removeprefix("sha256:")}.json"'
    code = shlex.quote(STACK_PY + TORCH_PY)
    return (
        f"[ -s {cache} ] && {{ cat {cache}; exit 0; }}\n"
        "for e in podman docker; do command -v $e >/dev/null 2>&1 || continue\n"
        '  for s in "" "sudo -n"; do\n'
        f"    $s timeout 15 $e image inspect {ident} >/dev/null 2>&1 || continue\n"
        f'    mkdir -p "$HOME/.nodeprep"; tmp={cache[:-1]}.$$.tmp"\n'
        f"    if $s timeout 300 $e run --rm --network none --entrypoint python3 {ident} "
        f'-I -c {code} > "$tmp" 2>&1; then mv -f "$tmp" {cache}; cat {cache}\n'
        '    else cat "$tmp"; rm -f "$tmp"; fi\n'
        "    exit 0\n"
        "  done\n"
        "done\n"
        "echo MISSING"
    )


def _image_stack(text: str, rc: int) -> dict | None:
    """{python, packages {name: version}, torch (TORCH_BUILD's answer, or None: no torch in the
    image), error (the image's python failed)}; None: no engine holds the image."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if not lines or lines[-1] == "MISSING":
        return None
    found = [json.loads(ln) for ln in lines if ln.startswith("{")]
    if not found:
        return {"python": None, "packages": {}, "torch": None, "error": lines[-1][:200]}
    out = {"python": found[0].get("python"), "packages": found[0].get("packages") or {}}
    out["torch"] = found[1] if len(found) > 1 else None
    if len(found) == 1 and "No module named 'torch'" not in lines[-1]:
        out["torch"] = {"error": lines[-1][:200]}  # torch is there but its import failed
    return out


IMAGE_STACK = Fact("image_stack", _image_script, _image_stack)  # IMAGE_STACK(image_id)
