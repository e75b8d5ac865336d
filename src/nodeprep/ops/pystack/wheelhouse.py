"""The controller's wheelhouse: every wheel the nodes need, resolved and downloaded ONCE per
distinct node platform (CPU arch, Python X.Y, glibc), then pushed to each node (only the
files it lacks) so nodes install with `--no-index --find-links` and never talk to an index.

Layout under <state>/wheelhouse/:
  built/                   wheels built here from sdists (e.g. deepspeed, pure Python)
  build-venv/              venv used to build them (has the pinned torch: --no-build-isolation)
  <platform>/              the wheels for one platform, plus
  <platform>/MANIFEST.json {"key": hash of the inputs, "files": {name: sha256}, "lock": [pins]}
A platform whose inputs did not change is not downloaded again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from nodeprep.errors import InputError, NodeprepError
from nodeprep.inventory.yamlfile import read_input


@dataclass(frozen=True)
class Platform:
    arch: str  # x86_64, aarch64
    python: str  # "3.11"
    glibc: str  # "2.36"

    @property
    def key(self) -> str:
        return f"cp{self.python.replace('.', '')}-{self.arch}-glibc{self.glibc}"

    def markers(self) -> dict[str, str]:
        """The PEP 508 environment of a node of this platform: what markers such as
        `platform_machine == "aarch64"` are evaluated against when resolving for it (pip
        itself evaluates them for the machine it runs on, whatever --platform says)."""
        return {
            "platform_machine": self.arch,
            "platform_system": "Linux",
            "sys_platform": "linux",
            "os_name": "posix",
            "python_version": self.python,
            "python_full_version": f"{self.python}.0",
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
            "implementation_version": f"{self.python}.0",
        }

    def pip_args(self) -> list[str]:
        major, minor = (int(x) for x in self.glibc.split(".")[:2])
        tags = [f"manylinux_{major}_{m}_{self.arch}" for m in range(minor, 4, -1)]
        legacy = {"manylinux2014": (2, 17), "manylinux2010": (2, 12), "manylinux1": (2, 5)}
        tags += [
            f"{name}_{self.arch}" for name, (ma, mi) in legacy.items() if (major, minor) >= (ma, mi)
        ]
        cp = "cp" + self.python.replace(".", "")
        args = [
            "--only-binary=:all:",
            "--python-version",
            self.python,
            "--implementation",
            "cp",
            "--abi",
            cp,
            "--abi",
            "abi3",
            "--abi",
            "none",
        ]
        for t in tags:
            args += ["--platform", t]
        return args


def read_requirements(paths: list[Path]) -> list[str]:
    """Pinned requirement lines from FILES; anything not `name==version` is refused with its
    file and line (an unpinned torch would pull gigabytes of CUDA wheels), and so is a file
    that is not UTF-8 text (its line) or cannot be read."""
    pins = []
    for path in paths:
        if not path.is_file():
            raise InputError(
                "requirements file not found", hint="fix python_requirements", file=str(path)
            )
        for no, raw in enumerate(read_input(path, str(path)).split("\n"), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                req = Requirement(line)
            except (InvalidRequirement, RecursionError) as e:  # a marker nested too deep
                why = (
                    str(e).splitlines()[0]
                    if isinstance(e, InvalidRequirement)
                    else "nested too deeply"
                )
                raise InputError(f"not a requirement: {why}", file=str(path), line=no) from None
            spec = list(req.specifier)
            if len(spec) != 1 or spec[0].operator not in ("==", "==="):
                raise InputError(
                    f"{req.name} is not pinned", hint="write name==version", file=str(path), line=no
                )
            pins.append(line)
    return pins


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# pip with the PEP 508 environment of another machine: pip evaluates environment markers (of
# the pins and of every dependency's metadata) against the interpreter it runs in, even with
# --platform; this replaces its vendored packaging's default_environment() for the run.
_TARGET_PIP = (
    "import json, sys\n"
    "from pip._vendor.packaging import markers\n"
    "target = json.loads(sys.argv.pop(1))\n"
    "here = markers.default_environment\n"
    "markers.default_environment = lambda: {**here(), **target}\n"
    "from pip._internal.cli.main import main\n"
    "sys.exit(main())\n"
)


def _pip(python: str, args: list[str], env=None, what="pip", target: dict | None = None) -> str:
    """pip ARGS with PYTHON; TARGET: the marker environment to resolve for (Platform.markers)."""
    head = [python, "-c", _TARGET_PIP, json.dumps(target)] if target else [python, "-m", "pip"]
    r = subprocess.run(
        [*head, "--disable-pip-version-check", *args], capture_output=True, text=True, env=env
    )
    if r.returncode:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-6:])
        raise NodeprepError(f"{what} failed on the controller (exit {r.returncode}):\n{tail}")
    return r.stdout


class Wheelhouse:
    def __init__(self, root: Path, log=None):
        self.root = root
        # Progress is an event (engine/events.py): the cli shows it on stderr.
        self.log = log or (lambda msg: None)
        self.downloads: dict[str, int] = {}  # platform -> pip download runs (the bench counts)

    def build(self, builds: dict[str, dict], torch_pin: str | None, index_args: list[str]) -> Path:
        """Build sdist-only requirements into wheels once, in a venv that has the pinned torch
        (deepspeed imports torch at build time: --no-build-isolation)."""
        built = self.root / "built"
        built.mkdir(parents=True, exist_ok=True)
        for pin, env in (builds or {}).items():
            req = Requirement(pin)
            version = next(iter(req.specifier)).version
            prefix = canonicalize_name(req.name).replace("-", "_") + "-" + version + "-"
            if any(p.name.startswith(prefix) for p in built.glob("*.whl")):
                continue
            venv = self.root / "build-venv"
            if not (venv / "bin" / "python").exists():
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            py = str(venv / "bin" / "python")
            base = ["setuptools", "wheel"] + ([torch_pin] if torch_pin else [])
            self.log(f"wheelhouse: preparing the build venv ({' '.join(base)})")
            _pip(py, ["install", "-q", *index_args, *base], what="build venv install")
            self.log(f"wheelhouse: building {pin} once on the controller")
            _pip(
                py,
                ["wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(built), pin],
                env=dict(os.environ, **{k: str(v) for k, v in (env or {}).items()}),
                what=f"building {pin}",
            )
        return built

    @staticmethod
    def _key(platform: Platform, pins: list[str], index_args: list[str]) -> str:
        return hashlib.sha256(
            json.dumps([platform.key, sorted(pins), index_args]).encode()
        ).hexdigest()

    def cached(self, platform: Platform, pins: list[str], index_args: list[str]) -> dict | None:
        """The manifest of a previous resolution of exactly these inputs, if all its files are
        there."""
        d = self.root / platform.key
        try:
            m = json.loads((d / "MANIFEST.json").read_text())
        except (OSError, ValueError):
            return None
        ok = m.get("key") == self._key(platform, pins, index_args) and all(
            (d / f).exists() for f in m["files"]
        )
        return m if ok else None

    def resolve(
        self, platform: Platform, pins: list[str], index_args: list[str], find_links: list[Path]
    ) -> dict:
        """Download (if the inputs changed) every wheel PINS need on PLATFORM; return the
        manifest."""
        d = self.root / platform.key
        m = self.cached(platform, pins, index_args)
        if m:
            return m
        key = self._key(platform, pins, index_args)
        # Resolve into a fresh directory so the set is exactly this resolution; the previous
        # set is offered as --find-links, so unchanged wheels are copied, not fetched again.
        fresh = self.root / f".{platform.key}.new"
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir(parents=True)
        args = ["download", "-q", "-d", str(fresh), *platform.pip_args(), *index_args]
        for fl in [*find_links, d]:
            if fl.exists():
                args += ["--find-links", str(fl)]
        self.log(f"wheelhouse: resolving and downloading for {platform.key}")
        _pip(
            sys.executable,
            args + pins,
            what=f"pip download for {platform.key}",
            target=platform.markers(),
        )
        self.downloads[platform.key] = self.downloads.get(platform.key, 0) + 1
        files, lock = {}, []
        for whl in sorted(fresh.glob("*.whl")):
            name, version, _b, _t = parse_wheel_filename(whl.name)
            files[whl.name] = sha256(whl)
            lock.append(f"{canonicalize_name(name)}=={version}")
        shutil.rmtree(d, ignore_errors=True)
        os.replace(fresh, d)
        manifest_path = d / "MANIFEST.json"
        m = {"key": key, "platform": platform.key, "files": files, "lock": sorted(lock)}
        tmp = manifest_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(m, indent=1) + "\n")
        os.replace(tmp, manifest_path)
        return m
