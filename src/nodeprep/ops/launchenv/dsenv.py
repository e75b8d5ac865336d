"""What DeepSpeed's multi-node runner does with `.deepspeed_env` files and the launching shell's
environment: which lines it cannot parse or misreads, and which variables never reach the ranks.

Facts, read from the deepspeed 0.19.8 sdist (deepspeed-0.19.8.tar.gz from PyPI):
- deepspeed/launcher/runner.py:36 EXPORT_ENVS = ['MLFLOW', 'PYTHON', 'MV2', 'UCX'];
  :598-602 every variable of the launching process's environment (os.environ.copy(), :480) whose
  name starts with one of EXPORT_ENVS + get_accelerator().export_envs() is exported, unless
  :43 EXCLUDE_ENVS ({'AISC_JOB_NAME': ['NCCL_IB_HCA', 'UCX_NET_DEVICES']}) drops it (:591-595:
  those two names are excluded when AISC_JOB_NAME is set). :586-589 PYTHONPATH always gets the
  job directory prepended.
- accelerator/cpu_accelerator.py:359 export_envs() -> []; accelerator/cuda_accelerator.py:411
  export_envs() -> ['NCCL'] (so NCCL_* is forwarded with cuda only, not with cpu). Others, in
  accelerator/<name>_accelerator.py: npu:333, mlu:270, sdaa:298, supa:277, klxpu:71; xpu, hpu,
  mps: [].
- runner.py:37-38 the files read are os.path.join(p, os.getenv("DS_ENV_FILE", ".deepspeed_env"))
  for p in [os.path.expanduser("~"), '.'], in that order, each only if os.path.isfile (:606).
  This happens only on the multi-node path (:537-539).
- runner.py:608-611 open(file, 'r') (universal newlines: \\r\\n and \\r end lines too), then for
  every line of fd.readlines(): `key, val = var.split('=', maxsplit=1)`. Nothing is skipped: a
  blank line, a comment or any line without '=' raises ValueError (not enough values to unpack)
  and the launch dies; a comment containing '=' becomes a variable named '# ...'.
- deepspeed/launcher/multinode_runner.py:37-41 add_export(key, var): var.strip(); if
  re.search(r'[^\\w@%+=:,./-]', var) the value is wrapped in double quotes; exports[key.strip()]
  = var (a dict, so a later file or line wins over an earlier one and over the shell).
- multinode_runner.py:102-104 pdsh: "export {}={}; " per entry, run by the remote node's shell
  (inside those double quotes " $ ` \\ are still special; '#' at a word start comments out the rest
  of the remote launch command). :183 openmpi: ['-x', "{}={}"], and runner.py:619 runs mpirun
  with subprocess.Popen(list) and no shell, so the added double quotes reach the ranks verbatim.
  :137 the openmpi runner also sets UCX_TLS=tcp itself.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

EXPORT_ENVS = ("MLFLOW", "PYTHON", "MV2", "UCX")  # runner.py:36
ACCELERATOR_ENVS = {  # accelerator/*.py export_envs()
    "cpu": (),
    "cuda": ("NCCL",),
    "xpu": (),
    "hpu": (),
    "mps": (),
    "npu": ("ASCEND", "HCCL", "LD_LIBRARY", "PATH"),
    "mlu": ("NEUWARE_HOME", "CNCL", "LD_LIBRARY", "PATH"),
    "sdaa": ("NCCL", "LD_LIBRARY", "PATH"),
    "supa": ("BCCL", "BIREN", "SUPA", "LD_LIBRARY", "PATH"),
    "klxpu": ("BKCL", "XPU", "XMLIR", "LD_LIBRARY", "PATH"),
}
EXCLUDE_ENVS = {"AISC_JOB_NAME": ("NCCL_IB_HCA", "UCX_NET_DEVICES")}  # runner.py:43
DEFAULT_NAME = ".deepspeed_env"  # runner.py:37
SUPPORTED_DS_LAUNCHERS = ("pdsh", "openmpi")  # the --ds-launcher values nodeprep drives
_QUOTED = re.compile(r"[^\w@%+=:,./-]")  # values DeepSpeed double-quotes (multinode_runner.py:39)
_LIVE_IN_QUOTES = '"$`\\'  # still special to a POSIX shell inside "..."
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXPORT = re.compile(r"export\s+(\S+)")
_UNPACK = "the runner stops with ValueError (not enough values to unpack)"


@dataclass
class EnvFile:
    path: str
    entries: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def env_paths(home: str, cwd: str, shell_env: dict[str, str] | None = None) -> list[str]:
    """The files DeepSpeed's runner reads, in its order (later wins): HOME's, then the job
    directory's (the runner's cwd); DS_ENV_FILE in SHELL_ENV renames both (an absolute one is
    read twice, which changes nothing, so it is listed once)."""
    name = (shell_env or {}).get("DS_ENV_FILE", DEFAULT_NAME)
    paths = [posixpath.join(home, name), posixpath.join(cwd, name)]
    return list(dict.fromkeys(paths))


def _lines(text: str) -> list[str]:
    """fd.readlines() of a file opened in text mode, without the line ends."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def _no_equals(line: str) -> str:
    if not line.strip():
        return f"blank line, which DeepSpeed 0.19.8 does not skip: {_UNPACK}; delete the line"
    if line.lstrip().startswith("#"):
        return f"comment line, which DeepSpeed 0.19.8 does not skip: {_UNPACK}; delete the line"
    return f"no '=' in the line: {_UNPACK}; write it as NAME=value or delete it"


def _key_problem(key: str, launcher: str) -> str | None:
    if _NAME.fullmatch(key):
        return None
    if key.startswith("#"):
        why = (
            (
                " and the pdsh runner's `export #...` turns the rest of the remote launch command "
                "into a shell comment, so no rank starts"
            )
            if launcher == "pdsh"
            else ""
        )
        return (
            f"comment line, which DeepSpeed 0.19.8 does not skip: it exports a variable named "
            f"{key!r}{why}; delete the line"
        )
    m = _EXPORT.fullmatch(key)
    if m:
        return (
            f"DeepSpeed takes {key!r} as the variable name; write it as "
            f"{m.group(1)}=value, without 'export'"
        )
    if not key:
        return "no variable name before '='; write it as NAME=value or delete the line"
    return (
        f"{key!r} is not a valid variable name (letters, digits and _, not starting with a "
        f"digit); rename it or delete the line"
    )


# Where the pdsh runner hands the values to a shell (multinode_runner.py, 0.19.8)
PDSH_EXPORT = 'multinode_runner.py:102-104: export K="V"; in the remote command'
PDSH_COMMAND = "multinode_runner.py:109: cd <job dir>; <sys.executable> -u ..., unquoted"
_PLAIN = re.compile(r"[\w@+=:,./-]*")  # no '%': pdsh substitutes %h %u %n %% (pdsh(1))


def pdsh_live(value: str) -> list[str]:
    """The characters of VALUE that the pdsh runner's export leaves to the remote shell: it
    double-quotes a value with any character outside [\\w@%+=:,./-], and inside double quotes
    " $ ` \\ are still live."""
    val = value.strip()
    if not _QUOTED.search(val):
        return []
    return sorted({c for c in val if c in _LIVE_IN_QUOTES})


def pdsh_plain(word: str) -> bool:
    """Can WORD go unquoted into the pdsh runner's remote command (the python and job dir),
    and through pdsh's own %-substitution, unchanged?"""
    return bool(_PLAIN.fullmatch(word))


def _chars(chars: list[str]) -> str:
    return ", ".join(repr(c) for c in chars)


def value_problems(raw: str, launcher: str) -> list[str]:
    """What the launcher does to the value (never echoed: it may be a secret)."""
    out = []
    val = raw.strip()
    if raw != val:
        out.append(
            "the value has leading or trailing whitespace, which DeepSpeed strips; "
            "remove it (it cannot reach the ranks)"
        )
    quoted = sorted(set(_QUOTED.findall(val)))
    if launcher == "openmpi" and quoted:
        out.append(
            f"the value contains {_chars(quoted)}, so DeepSpeed wraps it in double quotes "
            f'that the openmpi launcher (mpirun -x K="V", no shell) passes to the ranks '
            f"as part of the value; use only letters, digits and _@%+=:,./- in it"
        )
    live = [c for c in quoted if c in _LIVE_IN_QUOTES]
    if launcher == "pdsh" and live:
        out.append(
            f"the value contains {_chars(live)}, which the remote shell still interprets "
            f'inside the double quotes of the pdsh launcher\'s export K="V"; write the '
            f"value out literally without them"
        )
    if launcher == "pdsh" and "%" in val:
        out.append(
            "the value contains '%', and pdsh replaces %h, %u, %n and %% in the command it "
            "runs (DeepSpeed relies on that for --node_rank=%n; pdsh(1)), so the ranks would get "
            "another value; write it without '%'"
        )
    if launcher == "pdsh" and (val.startswith("~") or ":~" in val):
        out.append(
            "'~' in the value is not expanded, the pdsh launcher double-quotes it; "
            "write the full path"
        )
    return out


def parse(text: str, path: str, launcher: str = "pdsh") -> EnvFile:
    """Read TEXT (the file at PATH) as DeepSpeed 0.19.8 does. ENTRIES: key -> stripped value for
    every line it accepts (invalid names included, as DeepSpeed exports them; lines it dies on
    are left out). PROBLEMS: "PATH:LINE: what is wrong; what to do", for LAUNCHER (pdsh,
    openmpi)."""
    if launcher not in SUPPORTED_DS_LAUNCHERS:
        raise ValueError(
            f"unknown launcher {launcher!r} (one of {', '.join(SUPPORTED_DS_LAUNCHERS)})"
        )
    out = EnvFile(path)
    seen: dict[str, int] = {}
    for n, line in enumerate(_lines(text), 1):
        where = f"{path}:{n}: "
        if "=" not in line:
            out.problems.append(where + _no_equals(line))
            continue
        raw_key, raw_val = line.split("=", 1)
        key = raw_key.strip()
        bad_key = _key_problem(key, launcher)
        if bad_key:
            out.problems.append(where + bad_key)
        else:
            out.problems.extend(where + p for p in value_problems(raw_val, launcher))
        if key in seen:
            out.problems.append(
                f"{where}{key!r} was already set on line {seen[key]} and this "
                f"later value wins; keep only one of the two lines"
            )
        seen[key] = n
        out.entries[key] = raw_val.strip()
    return out


def merged(files: list[EnvFile]) -> dict[str, str]:
    """What the runner exports from FILES, given in DeepSpeed's order (env_paths): later wins."""
    out: dict[str, str] = {}
    for f in files:
        out.update(f.entries)
    return out


def _prefixes(accelerator: str) -> tuple[str, ...]:
    if accelerator not in ACCELERATOR_ENVS:
        raise ValueError(
            f"unknown accelerator {accelerator!r} (one of {', '.join(ACCELERATOR_ENVS)})"
        )
    return EXPORT_ENVS + ACCELERATOR_ENVS[accelerator]


def forwarded(name: str, accelerator: str = "cpu") -> bool:
    """Does the runner forward NAME from the launching shell (by its prefix list)?"""
    return name.startswith(_prefixes(accelerator))


def dropped(
    shell_env: dict[str, str], wanted: list[str], files: list[EnvFile], accelerator: str = "cpu"
) -> list[str]:
    """Names in WANTED set in SHELL_ENV that reach no rank: not forwarded by prefix (or
    excluded by EXCLUDE_ENVS) and not in the env FILES. One sentence each."""
    prefixes = _prefixes(accelerator)
    triggers = [k for k in EXCLUDE_ENVS if k in shell_env]
    excluded = {v for k in triggers for v in EXCLUDE_ENVS[k]}
    shown = ", ".join(p + "*" for p in prefixes)
    if excluded:
        shown += f" except {', '.join(sorted(excluded))} (as {', '.join(triggers)} is set)"
    in_files = merged(files)
    out = []
    for name in dict.fromkeys(wanted):
        if name not in shell_env or name in in_files:
            continue
        if name.startswith(prefixes) and name not in excluded:
            continue
        out.append(
            f"{name} is set on the launching node but DeepSpeed's runner does not forward "
            f"it (only {shown} and .deepspeed_env entries reach the ranks): add it to "
            f"deepspeed_env in the inventory"
        )
    return out
