"""MODULES: the node's environment modules as the ranks will load them (issue 46).

One snippet, in a clean environment (env -i: HOME, USER, LOGNAME and BASE_PATH, as a login
starts, whatever the probe's own shell loaded already): the init a login shell would source
(the host var `module_init`, else the first of INITS that exists: the profile.d scripts Lmod
and Environment Modules install, then their own sh init files, Cray's among them), one `module
use` of the `module_path` entries (the first searched first), then `module load` for each of
`modules`, in order. It reports the module system and its version (`module --version`), each
module's load (its exit status and first error lines; for one that failed, what `module -t avail
NAME` lists of the same name), the loaded list (`module -t list`), and the environment before
the loads and after (`env -0`, one variable a line), so the controller computes what the
modules set: PATH, LD_LIBRARY_PATH,
CUDA_HOME and whatever else. A node with no init is {"init": None}: "no module system".
"""

from __future__ import annotations

import re
import shlex

from nodeprep.engine.facts.probe import Fact

INITS = (
    "/etc/profile.d/lmod.sh",
    "/etc/profile.d/z00_lmod.sh",
    "/etc/profile.d/modules.sh",
    "/usr/share/lmod/lmod/init/profile",
    "/usr/share/modules/init/profile.sh",
    "/usr/share/Modules/init/profile.sh",
    "/opt/cray/pe/lmod/lmod/init/profile",
    "/opt/cray/pe/modules/default/init/profile.sh",
)
# What the module systems keep for themselves: not part of what a module sets.
INTERNAL = re.compile(
    r"^(_.*|LMOD_.*|MODULE.*|LOADEDMODULES|_LMFILES_|__LMOD_.*|__MODULES_.*|BASH_FUNC_.*|"
    r"OLDPWD|PWD|SHLVL|_)$"
)
ERR_LINES = 4
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"  # the PATH the snippet starts from (and ranks' base)
# A newline inside a variable's value, as the snippet prints it: \x1f, which str.splitlines
# (the probe's section reader) does not split on, unlike \x1c-\x1e
SEP = "\x1f"


def _use(v: dict) -> str:
    """One `module use` of every module_path entry: both systems keep the order given (the
    first is searched first), where one `module use` each would put the last first."""
    return "module use " + " ".join(shlex.quote(str(p)) for p in v["module_path"])


def load_snippet(v: dict) -> str:
    """sh that loads the node's `modules` quietly, as a login shell would: the init file (the
    first of `module_init` or INITS that exists), `module use` for each `module_path` entry,
    `module load` of the modules in order. "" when none are named. What the PYTHON fact, the
    venv's making and the env file's `modules` block run."""
    mods = [str(m) for m in (v.get("modules") or [])]
    if not mods:
        return ""
    q = shlex.quote
    inits = [v["module_init"]] if v.get("module_init") else list(INITS)
    uses = _use(v) + "; " if v.get("module_path") else ""
    return (
        f"for np_f in {' '.join(q(i) for i in inits)}; do "
        '[ -r "$np_f" ] && { . "$np_f"; break; }; done >/dev/null 2>&1 </dev/null; unset np_f\n'
        f"{{ {uses}module load {' '.join(q(m) for m in mods)}; }} >/dev/null 2>&1 </dev/null\n"
    )


def under_modules(v: dict, script: str) -> str:
    """SCRIPT run by sh in a clean environment with the node's `modules` loaded (as a fresh
    login would have them: whatever the calling shell loaded already, such as the env file's
    blocks and the venv's PATH, plays no part); SCRIPT itself when none are named."""
    if not v.get("modules"):
        return script
    return (
        'env -i HOME="$HOME" USER="$USER" LOGNAME="${LOGNAME:-$USER}" '
        f"PATH={BASE_PATH} /bin/sh -c {shlex.quote(load_snippet(v) + script)}\n"
    )


def with_modules(v: dict, script: str) -> str:
    """SCRIPT in a subshell that first loads the node's `modules` on top of the calling shell's
    environment (the venv's PATH and the env file's other blocks stay; loading a module that is
    already loaded changes nothing); SCRIPT itself when none are named. What runs the venv's
    python: the VENV, TORCH_BUILD and GPU_DEEP facts (their Fact.wrap), pip's install, torch's
    verify."""
    if not v.get("modules"):
        return script
    return f"(\n{load_snippet(v)}{script}\n)"


def _script(v: dict) -> str:
    mods = [str(m) for m in (v.get("modules") or [])]
    if not mods:
        return "echo 'init unused'"
    inits = [v["module_init"]] if v.get("module_init") else list(INITS)
    q = shlex.quote
    lines = [
        "np_mi=",
        f"for np_f in {' '.join(q(i) for i in inits)}; do "
        '[ -r "$np_f" ] && { np_mi=$np_f; break; }; done',
        '[ -n "$np_mi" ] || { echo "init none"; exit 0; }',
        'echo "init $np_mi"',
        "np_env() { env -0 2>/dev/null | tr '\\n\\0' '\\037\\n'; }",
        '. "$np_mi" >/dev/null 2>&1 </dev/null',
        'type module >/dev/null 2>&1 || { echo "nomodule"; exit 0; }',
        "module --version 2>&1 </dev/null | head -3 | sed 's/^/version /'",
    ]
    if v.get("module_path"):
        lines.append(f"{_use(v)} >/dev/null 2>&1")
    lines += ["echo '@@env0'", "np_env", "echo '@@loads'", "np_t=$(mktemp)"]
    for m in mods:
        base = q(m.split("/")[0])
        lines += [
            f'module load {q(m)} >/dev/null 2>"$np_t" </dev/null; np_rc=$?',
            f'printf "load %s %s\\n" {q(m)} "$np_rc"',
            f"sed -n '1,{ERR_LINES}s/^/err /p' \"$np_t\"",
            f'[ $np_rc -eq 0 ] || module -t avail {base} 2>&1 </dev/null | sed "s/^/avail /"',
        ]
    lines += [
        'rm -f "$np_t"',
        "echo '@@list'",
        "module -t list 2>&1 </dev/null",
        "echo '@@env1'",
        "np_env",
    ]
    # from a clean environment (as a fresh login's before its profile): what the modules set
    # must not depend on what this very shell already loaded (the env file's block does)
    return (
        'exec env -i HOME="$HOME" USER="$USER" LOGNAME="${LOGNAME:-$USER}" '
        f"PATH={BASE_PATH} /bin/sh -c {q(chr(10).join(lines))}"
    )


def _env(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        name, eq, value = line.partition("=")
        if eq and name:
            out[name] = value.replace(SEP, "\n")
    return out


def _system(versions: list[str]) -> tuple[str, str]:
    """(lmod | tcl | unknown, its version) from `module --version`; `module` is defined (the
    snippet checked), so an answer this does not know is a system all the same."""
    text = " ".join(versions)
    m = re.search(r"Modules based on Lua: Version (\S+)", text)
    if m:
        return "lmod", m.group(1)
    m = re.search(r"Modules Release (\S+)|VERSION=(\S+)", text)  # 4.x/5.x; 3.2 (RHEL 7, Cray)
    if m:
        return "tcl", m.group(1) or m.group(2)
    return "unknown", text.strip()[:80]


def _names(lines: list[str]) -> list[str]:
    """Module names from a terse listing: headers ("/path:", "Currently Loaded ...:") and
    markers (" <L>", "(default)") dropped."""
    out = []
    for line in lines:
        line = line.strip()
        if not line or line.endswith(":") or line.startswith(("No module", "Inactive")):
            continue
        name = re.sub(r"\s*(<[^>]*>|\([^)]*\))\s*$", "", line).strip()
        if name and " " not in name and name not in out:
            out.append(name)
    return out


def _parse(text: str, rc: int) -> dict:
    part = "head"
    head: list[str] = []
    sections: dict[str, list[str]] = {"env0": [], "loads": [], "list": [], "env1": []}
    for line in text.split("\n"):
        if line.startswith("@@") and line[2:] in sections:
            part = line[2:]
        elif part == "head":
            head.append(line)
        else:
            sections[part].append(line)
    init = next((ln[5:] for ln in head if ln.startswith("init ")), None)
    if init in (None, "unused"):
        return {"init": None, "unused": init == "unused"}
    if init == "none":
        return {"init": None}
    if "nomodule" in head:
        return {"init": init, "system": None, "error": f"{init} defines no `module`"}
    system, version = _system([ln[8:] for ln in head if ln.startswith("version ")])
    mods: dict[str, dict] = {}
    cur = None
    for line in sections["loads"]:
        kind, _, rest = line.partition(" ")
        if kind == "load":
            name, _, code = rest.rpartition(" ")
            cur = mods[name] = {"loaded": code == "0", "error": "", "available": []}
        elif cur is not None and kind == "err":
            cur["error"] = (cur["error"] + "\n" + rest).strip()
        elif cur is not None and kind == "avail":
            cur["available"].append(rest)
    for m in mods.values():
        m["available"] = _names(m["available"])
    before, after = _env(sections["env0"]), _env(sections["env1"])
    return {
        "init": init,
        "system": system,
        "version": version,
        "modules": mods,
        "loaded": _names(sections["list"]),
        "env": {
            k: v for k, v in sorted(after.items()) if before.get(k) != v and not INTERNAL.match(k)
        },
        "unset": sorted(k for k in before if k not in after and not INTERNAL.match(k)),
    }


# host vars: modules, module_path, module_init; private: its output holds environment values
MODULES = Fact("modules", _script, _parse, private=True)


def problem(fact: dict | None, v: dict) -> tuple[str, str] | None:
    """(what is wrong, its fix) for a node whose `modules` (host vars V) do not all load, read
    from its MODULES fact; None: they do. The modules role's step and health's check say it."""
    fact = fact or {}
    if fact.get("init") is None:
        where = v.get("module_init") or ", ".join(INITS[:3]) + ", ..."
        return (
            f"no module system: nothing defines `module` ({where} missing)",
            "install Lmod or Environment Modules, or set module_init to the file that "
            "defines `module`",
        )
    if fact.get("system") is None:
        return (fact.get("error") or f"{fact['init']} defines no `module`", "set module_init")
    for name in v.get("modules") or []:
        m = (fact.get("modules") or {}).get(name) or {}
        if m.get("loaded"):
            continue
        others = [a for a in m.get("available") or [] if a != name]
        if others:
            return (
                f"module {name} not available ({', '.join(others)} "
                f"{'is' if len(others) == 1 else 'are'})",
                "name one of those in `modules`, or install it",
            )
        first = (m.get("error") or "").splitlines()
        return (
            f"module {name} not available: {first[0][:160] if first else 'it did not load'}",
            "add the directory of its modulefile to module_path, or install it",
        )
    return None


def set_by_modules(v: dict, facts) -> dict[str, str]:
    """The variables the node's named `modules` set (its MODULES fact), {} when none are named."""
    return ((facts.get(MODULES.key) or {}).get("env") or {}) if v.get("modules") else {}


def _rank_modules(text: str, rc: int) -> list[str]:
    return [m for m in text.strip().split(":") if m]


# What a launcher's non-interactive ssh shell on the node has loaded: LOADEDMODULES, which Lmod
# and Environment Modules both keep (colon-separated), as the probe's own shell inherited it
# from the login shell's startup files (the env file's `modules` block). No exec.
RANK_MODULES = Fact(
    "rank_modules", lambda _v: "printf '%s\\n' \"${LOADEDMODULES:-}\"", _rank_modules
)
