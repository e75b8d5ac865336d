"""Remote file primitives as POSIX sh snippets: quoting node paths, and replacing a file
atomically (temp file with the final mode in the same directory, then rename), so an
interrupted run never leaves a truncated authorized_keys or ssh config. Reading files is
the FILE fact (engine/facts/files.py)."""

from __future__ import annotations

import base64
import shlex


def rpath(path: str) -> str:
    """Quote a node path for sh; `~/x` becomes "$HOME"/'x' so the node's home is used."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def write_script(path: str, content: str, mode: int) -> str:
    """Replace PATH with CONTENT atomically, creating its directory (0700) if needed."""
    p = rpath(path)
    blob = base64.b64encode(content.encode("utf-8", "surrogateescape")).decode()
    return (
        f"f={p}\n"
        'd=$(dirname "$f")\n'
        '[ -d "$d" ] || mkdir -p -m 700 "$d"\n'
        't=$(mktemp "$d/.nodeprep.XXXXXX") &&\n'
        f'  printf %s {blob} | base64 -d > "$t" && chmod {mode:o} "$t" &&\n'
        '  mv -f "$t" "$f" || { rm -f "$t"; exit 1; }'
    )


# How a stamp records a file (stamp_from_list writes it, engine/facts STAMP reads it back):
# size, inode and change time (ns). Any write, chmod, replacement or removal changes one of
# them; ctime cannot be set back from user space (touch sets mtime only).
STAT_FORMAT = "%s %i %.9Z %n"


def stamp_from_list(directory: str, stamp: str, listing: str) -> str:
    """sh, run after an action verified its work: the stamp STAMP in DIRECTORY (read back by
    engine/facts STAMP) from LISTING there, whose first line is what was verified and each
    further line a file name relative to DIRECTORY. One `stat` records every file as it is
    now; written atomically, LISTING removed. A later check that finds every file as
    stamped has seen the same state the action verified, without doing the work again."""
    d = rpath(directory)
    s = shlex.quote(stamp)
    ls = shlex.quote(listing)
    return (
        f"( cd {d} && set -- && {{\n"
        "    IFS= read -r h\n"
        '    while IFS= read -r x || [ -n "$x" ]; do set -- "$@" "$x"; done\n'
        f"  }} < {ls} && {{\n"
        "    printf '%s\\n' \"$h\"\n"
        f"    [ $# -eq 0 ] || stat -c '{STAT_FORMAT}' -- \"$@\"\n"
        f"  }} > {s}.$$ && mv -f {s}.$$ {s} || {{ rm -f {s}.$$; exit 1; }}\n"
        f"  rm -f {ls} )"
    )


# sh: `np_sha256 < FILE` prints FILE's sha256 (64 hex digits). coreutils' sha256sum (9.1 in
# Debian 12) does not use the CPU's SHA instructions and hashes ~0.55 GB/s a core here; the
# openssl binary does (~1.7 GB/s), which matters when every node checks gigabytes of wheels.
# openssl is used only after it hashed the empty input right (LibreSSL/OpenSSL 1.1/3 all
# accept `dgst -sha256 -r`); anything else falls back to sha256sum, so a node without it or
# with an odd one still gives the true digest. The choice is made once, where it is defined
# (a `$(np_sha256 < f)` subshell inherits it).
SHA256_EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
# No newline at its end: callers go on with `; ...` on the same line.
SHA256_SH = (
    "np_sha256() {\n"
    '  if [ -z "${np_shc:-}" ]; then\n'
    "    np_shc=sha256sum\n"
    "    [ \"$(printf '' | openssl dgst -sha256 -r 2>/dev/null | cut -c1-64)\" = "
    f"{SHA256_EMPTY} ] && np_shc=openssl\n"
    "  fi\n"
    '  if [ "$np_shc" = openssl ]; then openssl dgst -sha256 -r | cut -c1-64\n'
    "  else sha256sum | cut -c1-64; fi\n"
    "}\n"
    "np_sha256 </dev/null >/dev/null"
)


# Every remote command of a run carries RUN_VAR=<run id> in its environment (Session.run), so a
# later run can stop exactly the commands a killed run left behind (engine/locks.py).
RUN_VAR = "NODEPREP_RUN"

_STOP_TAGGED = r"""
# dash's builtin kill rejects `--` and errors went to /dev/null, so use procps kill, and
# select process groups with `ps -e -o pgid=` (ps -g means session).
tag="$1"; pgs=""
# never this script's own group: its pipes' children carry the tag too when it stops its own run
me=$(ps -o pgid= -p $$ 2>/dev/null | tr -d ' ')
for p in /proc/[0-9]*; do
  [ "${p#/proc/}" = "$$" ] && continue
  if { tr '\0' '\n' < "$p/environ"; } 2>/dev/null | grep -qxF "$tag"; then
    pg=$(ps -o pgid= -p "${p#/proc/}" 2>/dev/null | tr -d ' ')
    [ -n "$pg" ] && [ "$pg" != "$me" ] && pgs="$pgs $pg"
  fi
done
pgs=$(echo $pgs | tr ' ' '\n' | sort -u)
[ -z "$pgs" ] && { echo "stopped 0"; exit 0; }
alive() { ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ {n++} END {exit !n}'; }
for pg in $pgs; do /bin/kill -s TERM -- "-$pg" 2>/dev/null; done
i=0
while [ $i -lt 50 ]; do
  left=0
  for pg in $pgs; do alive "$pg" && left=1; done
  [ $left -eq 0 ] && break
  sleep 0.1; i=$((i+1))
done
for pg in $pgs; do alive "$pg" && /bin/kill -s KILL -- "-$pg" 2>/dev/null; done
echo "stopped $(echo $pgs | wc -w) process group(s)"
"""


def stop_tagged_script(var: str, value: str) -> str:
    """sh that stops (TERM, then KILL after 5 s) every process group holding a process whose
    environment has VAR=VALUE, and says how many: never a broad `pkill -f`."""
    return f"set -- {shlex.quote(f'{var}={value}')}\n" + _STOP_TAGGED
