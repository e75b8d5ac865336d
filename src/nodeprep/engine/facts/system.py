"""What a node is: host name, OS, the user and its login shell, the inventory's Python, the
`python` a launcher's ssh shell finds, free disk, and which machine and home it is (IDENTITY)."""

from __future__ import annotations

import re
import shlex

from nodeprep.engine.facts.modules import under_modules
from nodeprep.engine.facts.probe import Fact
from nodeprep.engine.remote import rpath


def _hostname(text, rc):
    return text.strip()


# /proc's copy with a builtin read: the `hostname` exec cost ~0.5 ms of the node's CPU a probe
HOSTNAME = Fact(
    "hostname",
    lambda _v: (
        "IFS= read -r h 2>/dev/null < /proc/sys/kernel/hostname &&\n"
        '[ -n "$h" ] && printf \'%s\\n\' "$h" || hostname'
    ),
    _hostname,
)


def _os(text, rc):
    """OS release name, kernel name, kernel release, machine (CPU architecture). A node with
    no os-release file, or one without PRETTY_NAME, has an unknown release: the kernel name
    ("Linux", os-release(5)'s default for PRETTY_NAME)."""
    lines = text.strip().splitlines()
    system, kernel, arch = lines[-1].split()
    return {"release": lines[0] if len(lines) > 1 else system, "kernel": kernel, "arch": arch}


# os-release(5): /etc/os-release, else /usr/lib/os-release. Tested before `.` reads it: a `.`
# of a missing file ends a POSIX sh (dash), and the section with it (no output at all).
# PRETTY_NAME is emptied first: one in the login's environment is not the node's.
OS = Fact(
    "os",
    lambda _v: (
        "PRETTY_NAME=\n"
        "for np_f in /etc/os-release /usr/lib/os-release; do\n"
        '  [ -r "$np_f" ] && { . "$np_f" 2>/dev/null; break; }\n'
        "done\n"
        "printf '%s\\n' \"$PRETTY_NAME\"\n"
        "uname -srm"
    ),
    _os,
)


PY_CODE = (
    'import os, sys; print(sys.executable); print("%d.%d.%d" % sys.version_info[:3]); '
    'print(os.confstr("CS_GNU_LIBC_VERSION") or "-")'
)


_RECORD = "IFS= read -r a && IFS= read -r x && IFS= read -r y && IFS= read -r z"  # one cache entry
_ENTRIES = 4  # interpreters remembered per machine (facts and a venv'd PATH may ask for two)


def _python_script(v: dict) -> str:
    """Starting the interpreter (-I -S: no site import) is most of a fact probe's cost on the
    node (~6 ms of its ~17). On a machine nodeprep manages (~/.nodeprep exists) the answer is
    kept in ~/.nodeprep/python_probe.<machine-id> (homes may be shared across machines), keyed
    by the path and the stat (device, inode, size, mtime) of the interpreter's file and of the
    dynamic linker's cache (a glibc upgrade rewrites it), up to 4 interpreters a machine (the
    newest first; one entry made two probes asking for two names evict each other's on every
    run): a hit costs one stat. A script
    (`#!`: a pyenv or asdf shim picks its interpreter at run time) is never cached: the check
    (`head -c 2`) runs only before writing an entry, since a file that becomes a script
    later has another stat than the one its entry was written under."""
    name = shlex.quote(str(v.get("python") or "python3"))
    # with `modules` named: the interpreter they put first, in their environment (issue 46)
    return under_modules(
        v,
        f"p=$(command -v {name}) || {{ echo MISSING; exit 0; }}\n"
        "k=\n"
        "c=\n"
        'if [ -d "$HOME/.nodeprep" ] && IFS= read -r m 2>/dev/null < /etc/machine-id && '
        '[ -n "$m" ]; then\n'
        "  k=$(stat -L --printf '%d:%i:%s:%Y ' -- \"$p\" /etc/ld.so.cache 2>/dev/null) || k=\n"
        '  c="$HOME/.nodeprep/python_probe.$m"\n'
        "fi\n"
        'if [ -n "$k" ] && [ -f "$c" ]; then\n'
        f"  while {_RECORD}; do\n"
        '    [ "$a" = "$p $k" ] && [ -n "$z" ] && { printf \'%s\\n\' "$x" "$y" "$z"; exit 0; }\n'
        '  done < "$c"\n'
        "fi\n"
        f'o=$("$p" -I -S -c {shlex.quote(PY_CODE)}) || exit $?\n'
        "printf '%s\\n' \"$o\"\n"
        '[ -n "$k" ] && case $(head -c 2 -- "$p" 2>/dev/null) in "#!"|"") ;; *)\n'
        '  { { printf \'%s\\n\' "$p $k" "$o"\n'
        "      n=1\n"
        f'      [ ! -f "$c" ] || while {_RECORD}; do\n'
        '        case $a in "$p "*) continue;; esac\n'
        f"        [ $n -lt {_ENTRIES} ] || break\n"
        "        n=$((n+1))\n"
        '        printf \'%s\\n\' "$a" "$x" "$y" "$z"\n'
        '      done < "$c"; } > "$c.$$" && mv -f -- "$c.$$" "$c"; } 2>/dev/null;;\n'
        "esac\n"
        "exit 0",
    )


def _python(text, rc):
    """The inventory's interpreter: resolved path, version, glibc (None when missing)."""
    lines = text.strip().splitlines()
    if not lines or lines[0] == "MISSING" or rc != 0:
        return None
    path, version, libc = lines[-3:]
    return {
        "path": path,
        "version": version,
        "glibc": libc.split()[-1] if libc.startswith("glibc") else None,
    }


PYTHON = Fact("python", _python_script, _python)  # the host var `python` names the interpreter


def _login_shell(text, rc):
    """Field 7 of the user's passwd entry (cut on the controller: one exec less per node)."""
    f = text.strip().splitlines()[-1].split(":") if text.strip() else []
    return (f[6] or None) if len(f) >= 7 else None


# The effective uid from /proc/self/status (a read loop: no `id` exec), `id -un` without it.
LOGIN_SHELL = Fact(
    "login_shell",
    lambda _v: (
        "u=\n"
        '{ while read -r np_k np_r np_e np_x; do [ "$np_k" = Uid: ] && { u=$np_e; break; }\n'
        "  done < /proc/self/status; } 2>/dev/null\n"
        "case $u in ''|*[!0-9]*) u=$(id -un);; esac\n"
        'getent passwd "$u"'
    ),
    _login_shell,
)


def _python_on_path(text, rc):
    """What `python` a launcher's non-interactive ssh shell runs: the probe's sh inherits the
    PATH the user's login shell set up for this very ssh command, so no second round trip."""
    lines = [ln for ln in text.strip().splitlines() if ln.startswith("/")]
    return lines[-1] if lines else None


PYTHON_ON_PATH = Fact("python_on_path", lambda _v: "command -v python || true", _python_on_path)


def _disk_free(text, rc):
    """Free bytes on the file system holding the home directory: field 4 (1K blocks
    available) of `df -P`'s last line, cut here rather than by an awk on the node (one exec
    less per probe). A device name with spaces shifts the fields: counted from the right."""
    fields = text.strip().splitlines()[-1].split()
    return int(fields[-3]) * 1024


DISK_FREE = Fact("disk_free", lambda _v: 'df -Pk "$HOME"', _disk_free)


def _room_script(path: str) -> str:
    """The file system a path is (or would be) on: its nearest existing directory, `df -Pk`
    and `df -Pi` there (space and inodes), whether that directory is writable, and the mount
    options of its file system (ro). Two execs (the df's): the rest is shell builtins."""
    last = "{ read -r _h; read -r np_x; printf '%s\\n' \"$np_x\"; }"  # df's line after its header
    return (
        f"p={rpath(path)}\n"
        'while [ ! -d "$p" ] && [ "$p" != / ]; do p=${p%/*}; p=${p:-/}; done\n'
        'echo "dir $p"\n'
        '[ -w "$p" ] && echo writable\n'
        f'k=$(LC_ALL=C df -Pk "$p" | {last})\n'
        "printf '%s\\n' \"$k\"\n"
        f'LC_ALL=C df -Pi "$p" | {last}\n'
        "m=${k##* }\n"
        'while read -r _d mp _t opts _r; do [ "$mp" = "$m" ] && o=$opts; done < /proc/mounts\n'
        'echo "opts ${o:-?}"\n'
        "true"
    )


def _room(text: str, rc: int) -> dict:
    """{dir, mount, free (bytes), size (bytes), inodes_free (None where the file system has
    no inode count, as btrfs), writable, readonly} of ROOM(path)."""
    lines = text.strip().splitlines()
    d = next(ln[4:] for ln in lines if ln.startswith("dir "))
    opts = next((ln[5:] for ln in lines if ln.startswith("opts ")), "?")
    dfk, dfi = [
        ln.split() for ln in lines if not ln.startswith(("dir ", "opts ")) and ln != "writable"
    ][:2]
    # df's fields counted from the right: a device name may hold spaces
    inodes = int(dfi[-3]) if dfi[-3].isdigit() and dfi[-5] != "0" else None
    return {
        "dir": d,
        "mount": dfk[-1],
        "free": int(dfk[-3]) * 1024,
        "size": int(dfk[-5]) * 1024,
        "inodes_free": inodes,
        "writable": "writable" in lines,
        "readonly": "ro" in opts.split(","),
    }


# ROOM(path): space, inodes and writability where PATH is or would be (a push, a venv)
ROOM = Fact("room", _room_script, _room)


def _etc_shells(text, rc):
    """Login shells the node allows."""
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("/")]


ETC_SHELLS = Fact(
    "etc_shells",
    lambda _v: (  # builtins: no exec
        '{ while IFS= read -r l || [ -n "$l" ]; do\n'
        "    printf '%s\\n' \"$l\"\n"
        "  done < /etc/shells; } 2>/dev/null\n"
        "true"
    ),
    _etc_shells,
)


def _user(text, rc):
    """Name, uid and home, from one `id` (POSIX format `uid=N(name) ...`), not two."""
    idline, home = text.strip().splitlines()[:2]
    m = re.match(r"uid=(\d+)(?:\(([^)]*)\))?", idline)
    if not m:
        raise ValueError(f"unexpected `id` output {idline[:80]!r}")
    return {"name": m.group(2) or m.group(1), "uid": int(m.group(1)), "home": home}


USER = Fact("user", lambda _v: "LC_ALL=C id; printf '%s\\n' \"$HOME\"", _user)


def _identity_script(_v) -> str:
    """The machine: /etc/machine-id (cloned images share it) plus this boot's id (machines
    never share it). The home: a random id nodeprep leaves in ~/.nodeprep/home-id the first
    time (created with `ln`, atomic on NFS too, so nodes sharing the home agree on the first
    one written); st_dev of an NFS home differs per client, so dev:inode alone cannot tell.
    The id is drawn ON the node (the kernel's random uuid; /dev/urandom where that is
    missing): the script is the same text for every node, so the head's fan-out sends one
    probe for all (a token drawn here made every probe differ: 8 KB a node, and past a dozen
    nodes the fan-out script was too big and verify fell back to direct probes)."""
    return (
        "m=\n"
        "for f in /etc/machine-id /var/lib/dbus/machine-id; do\n"
        '  [ -s "$f" ] && { IFS= read -r m < "$f"; break; }\n'
        "done\n"
        "b=\n"
        "[ -r /proc/sys/kernel/random/boot_id ] && "
        "IFS= read -r b < /proc/sys/kernel/random/boot_id\n"
        'printf \'machine %s %s\\n\' "${m:--}" "${b:--}"\n'
        'f="$HOME/.nodeprep/home-id"\n'
        'if [ ! -s "$f" ]; then\n'
        '  mkdir -p "$HOME/.nodeprep" && {\n'
        "    r=\n"
        "    IFS= read -r r 2>/dev/null < /proc/sys/kernel/random/uuid\n"
        '    [ -n "$r" ] || r=$(od -An -N16 -tx1 /dev/urandom)\n'
        '    r=$(printf %s "$r" | tr -dc 0-9a-f)\n'
        '    [ ${#r} -ge 16 ] && t="$HOME/.nodeprep/.home-id.$r" && '
        'printf \'%s\\n\' "$r" > "$t" &&\n'
        '      { ln "$t" "$f" 2>/dev/null; rm -f "$t"; }\n'
        "  }\n"
        "fi\n"
        "h=\n"
        '[ -s "$f" ] && IFS= read -r h < "$f"\n'
        "printf 'home %s\\n' \"${h:--}\""
    )


def _identity(text, rc):
    """{'machine': machine-id:boot-id (None unless both are known), 'home': the home's id
    or None}. None: the node is taken as alone in its group."""
    out = {"machine": None, "home": None}
    for line in text.splitlines():
        f = line.split()
        if (
            len(f) == 3 and f[0] == "machine" and "-" not in (f[1], f[2])
        ):  # cloned images share an id
            out["machine"] = f"{f[1]}:{f[2]}"
        elif len(f) == 2 and f[0] == "home" and f[1] != "-":
            out["home"] = f[1]
    return out


IDENTITY = Fact("identity", _identity_script, _identity)
