"""The container engines of a node as its login user meets them: CONTAINER(engines), ENGINES a
comma list such as "podman,docker".

For each engine asked for (podman, docker) that is on the PATH: its version, whether this user
may run it (directly, only through `sudo -n`, refused by the daemon's socket, or no daemon
answering), where it keeps images and the room there, the runtimes it knows (docker's `nvidia`),
and the images it holds (full ID, name:tag, repo digest; the first MAX_IMAGES). Beside them,
NVIDIA's container toolkit: the CDI specs that define `nvidia.com/gpu` devices and `nvidia-ctk`.
Every engine command is under a timeout: a hung daemon is an answer ("timeout"), not a hang.
"""

from __future__ import annotations

import shlex

from nodeprep.engine.facts.probe import Fact

ENGINE_TIMEOUT = 15  # seconds for one engine command (podman's first run sets up its storage)
_IMAGES = "{{.ID}}|{{.Repository}}:{{.Tag}}|{{.Digest}}"
MAX_IMAGES = 200
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


def _engine_script(engine: str) -> str:
    """sh for one engine: found, version, access (direct, sudo -n, refused with its words,
    timeout), podman's subordinate ids, room where images live, the images."""
    t, e = f"timeout {ENGINE_TIMEOUT}", shlex.quote(engine)
    root = "{{.Store.GraphRoot}}" if engine == "podman" else "{{.DockerRootDir}}"
    runtimes = "" if engine == "podman" else "{{range $k, $v := .Runtimes}}{{$k}},{{end}}"
    info = f"info --format {shlex.quote(root + '|' + runtimes)}"
    subids = (
        "  np_u=$(id -un); np_n=$(id -u); np_g=no\n"
        '  if grep -qs -e "^$np_u:" -e "^$np_n:" /etc/subuid && '
        'grep -qs -e "^$np_u:" -e "^$np_n:" /etc/subgid; then np_g=yes; fi\n'
        '  [ "$np_n" -eq 0 ] && np_g=root\n'
        f'  echo "subids {engine} $np_g"\n'
    )
    return (
        f'if np_p=$(command -v {e}); then echo "engine {engine} $np_p"\n'
        f'  echo "version {engine} $({t} {e} --version 2>&1 | head -n1)"\n'
        f"  if np_i=$({t} {e} {info} 2>/dev/null); then np_a=ok\n"
        "  elif [ $? -eq 124 ]; then np_a=timeout\n"
        f"  elif np_i=$(sudo -n {t} {e} {info} 2>/dev/null); then np_a=sudo\n"
        f"  else np_a=refused; np_i=$({t} {e} {info} 2>&1 >/dev/null); fi\n"
        f"  echo \"access {engine} $np_a $(printf %s \"$np_i\" | tr '\\n' ' ' | cut -c1-300)\"\n"
        + (subids if engine == "podman" else "")
        + '  np_r=${np_i%%|*}; if [ "$np_a" = ok ] || [ "$np_a" = sudo ]; then\n'
        '    [ -d "$np_r" ] || np_r=$(dirname "$np_r")\n'
        f'    echo "room {engine} $(df -Pk "$np_r" 2>/dev/null | awk \'NR==2{{print $4}}\')"\n'
        "    np_s=; [ $np_a = sudo ] && np_s='sudo -n'\n"
        f"    $np_s {t} {e} images --no-trunc --format {shlex.quote(_IMAGES)} 2>/dev/null | "
        f"head -n {MAX_IMAGES} | sed 's/^/image {engine} /'\n"
        "  fi\nfi"
    )


def _script(engines: str) -> str:
    dirs = " ".join(CDI_DIRS)
    return "\n".join(
        [_engine_script(engine) for engine in engines.split(",") if engine]
        + [
            f'for np_d in {dirs}; do for np_f in "$np_d"/*.yaml "$np_d"/*.json; do '
            '[ -f "$np_f" ] && grep -qs \'nvidia.com/gpu\' "$np_f" && echo "cdi $np_f"; '
            "done; done\n"
            'np_c=$(command -v nvidia-ctk) && echo "ctk $np_c"\n'
            "true"
        ]
    )


def _engine(out: dict, name: str) -> dict:
    return out["engines"].setdefault(
        name,
        {
            "path": "",
            "version": "",
            "access": "",
            "info": "",
            "root": "",
            "runtimes": [],
            "free_bytes": None,
            "subids": "",
            "images": [],
        },
    )


def _version(text: str) -> str:
    """`podman version 4.3.1`, `Docker version 20.10.24+dfsg1, build 297e128` -> the number."""
    words = text.replace(",", " ").split()
    for i, word in enumerate(words[:-1]):
        if word.lower() == "version":
            return words[i + 1]
    return ""


def _access(e: dict, rest: str) -> None:
    how, _, info = rest.partition(" ")
    e["access"] = how
    if how in ("ok", "sudo"):
        root, _, runtimes = info.strip().partition("|")
        e["root"] = root
        e["runtimes"] = [r for r in runtimes.split(",") if r]
    else:
        e["info"] = info.strip()


def _image(text: str) -> dict | None:
    """`ID|repository:tag|digest` -> {id (sha256:...), name ("" for <none>), digest}."""
    fields = text.strip().split("|")
    if len(fields) != 3 or not fields[0]:
        return None
    ident, name, digest = fields
    return {
        "id": ident if ident.startswith("sha256:") else f"sha256:{ident}",
        "name": "" if "<none>" in name else name,
        "digest": digest if digest.startswith("sha256:") else "",
    }


def _parse(text: str, rc: int) -> dict:
    """{"engines": {name: {path, version, access (ok | sudo | refused | timeout), info (the
    engine's words when refused), subids (podman: yes | no | root | ""), root, runtimes,
    free_bytes, images}}, "cdi": [spec files
    naming nvidia.com/gpu], "ctk": path of nvidia-ctk or ""}. An engine that is not on the
    PATH is absent."""
    out: dict = {"engines": {}, "cdi": [], "ctk": ""}
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("cdi", "ctk"):
            if word == "cdi":
                out["cdi"].append(rest.strip())
            else:
                out["ctk"] = rest.strip()
            continue
        name, _, rest = rest.partition(" ")
        if word not in ("engine", "version", "access", "subids", "room", "image") or not name:
            continue
        e = _engine(out, name)
        if word == "engine":
            e["path"] = rest.strip()
        elif word == "version":
            e["version"] = _version(rest)
        elif word == "access":
            _access(e, rest)
        elif word == "subids":
            e["subids"] = rest.strip()
        elif word == "room":
            e["free_bytes"] = int(rest) * 1024 if rest.strip().isdigit() else None
        elif _image(rest):
            e["images"].append(_image(rest))
    return out


CONTAINER = Fact("container", _script, _parse)  # CONTAINER("podman,docker")
