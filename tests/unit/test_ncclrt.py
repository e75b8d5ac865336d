"""Which libnccl a process really maps (nodeside/nccl_probe.py, run on the nodes inside the torch
probe, and beside the health payload): /proc/<pid>/maps excerpts in tests/facts/nccl_maps/
(each names its source and the answer expected), the decisions on what was found, and, where
the real NCCL library can be had (the nvidia-nccl-cu12 wheel from PyPI, cached under /tmp),
the probe's own code reading its version from a live process: no GPU is needed for that."""

from __future__ import annotations

import ast
import fcntl
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from nodeprep.engine.facts.python import (
    TORCH_PY,
    TorchIn,
    _bare_source,
    _torch_build,
    _torch_script,
)
from nodeprep.nodeside import BUILTIN, NCCL_PROBE, nccl_probe
from nodeprep.ops.train import payload
from tests.unit import test_launchers

MAPS = sorted((Path(__file__).parents[1] / "facts" / "nccl_maps").glob("*.maps"))
CACHE = Path("/tmp/nodeprep-nccl")  # the real libnccl, fetched once per machine
WHEEL = "nvidia-nccl-cu12==2.21.5"
torch_python = test_launchers.torch_python  # the CPU torch venv (torch 2.13.0+cpu), a fixture
SHIPPED = _bare_source(NCCL_PROBE)  # what the probe sends: nccl_probe.py without docstrings


def case(path: Path) -> tuple[str, dict]:
    """(the maps text, what mapped() must find) of a data file."""
    lines = path.read_text().splitlines()
    assert any(ln.startswith("# source: ") for ln in lines), f"{path.name} names no source"
    expect = json.loads(
        next(ln for ln in lines if ln.startswith("# expect: "))[len("# expect: ") :]
    )
    return "\n".join(ln for ln in lines if not ln.startswith("#")), expect


@pytest.mark.parametrize("path", MAPS, ids=[p.stem for p in MAPS])
def test_mapped_libraries_of_real_maps(path):
    text, expect = case(path)
    assert text.strip(), "no maps lines"
    assert nccl_probe.mapped(text) == expect


def test_the_corpus_covers_every_case():
    found = [nccl_probe.mapped(case(p)[0]) for p in MAPS]
    assert any(f["nccl"] and "/nvidia/nccl/lib/" in f["nccl"][0] for f in found)  # pip wheel
    assert any(f["nccl"] and f["nccl"][0].startswith("/opt/") for f in found)  # custom
    assert any(f["net"] for f in found)  # plugin
    assert any(len(f["nccl"]) > 1 for f in found)
    assert any(f == {"nccl": [], "net": [], "torch_cuda": None} for f in found)  # CPU


def test_the_health_payload_has_no_copy_of_the_probe():
    """One copy of the probe: health.py imports nccl_probe (shipped beside it) and parses no
    maps of its own."""
    tree = ast.parse(BUILTIN["health"].read_text())
    defs = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert not defs & {"mapped", "mapped_nccl", "lib_version", "version_name", "describe"}
    assert any(
        isinstance(n, ast.Import) and [a.name for a in n.names] == ["nccl_probe"]
        for n in ast.walk(tree)
    )


def test_train_ships_the_probe_beside_the_health_payload():
    root, script = payload.resolve_payload("health")
    assert payload.local_files(root, script) == {
        "health.py": BUILTIN["health"],
        "nccl_probe.py": NCCL_PROBE,
    }
    root, script = payload.resolve_payload("ddp")
    assert payload.local_files(root, script) == {"ddp.py": BUILTIN["ddp"]}


@pytest.mark.parametrize(
    "code,name",
    [
        (22105, "2.21.5"),
        (22703, "2.27.3"),
        (21903, "2.19.3"),
        (20906, "2.9.6"),
        (2804, "2.8.4"),
        (2408, "2.4.8"),
    ],
)
def test_version_codes(code, name):
    # NCCL_VERSION_CODE: major*10000+minor*100+patch from 2.9 on, major*1000+minor*100+patch before
    assert nccl_probe.version_name(code) == name


def found_in(stem: str) -> dict:
    return nccl_probe.mapped(case(next(p for p in MAPS if p.stem == stem))[0])


def fake_versions(table: dict):
    """A version_of for describe(): the library's version, or its exception."""

    def version_of(path):
        got = table[path]
        if isinstance(got, Exception):
            raise got
        return got

    return version_of


def test_describe_one_library():
    found = found_in("opt_nccl_via_ld_library_path")
    got = nccl_probe.describe(found, fake_versions({"/opt/nccl/lib/libnccl.so.2.21.5": "2.21.5"}))
    assert got == {"path": "/opt/nccl/lib/libnccl.so.2.21.5", "version": "2.21.5"}


def test_describe_two_libraries_names_both():
    found = found_in("two_libnccl_mapped")
    a, b = found["nccl"]
    got = nccl_probe.describe(found, fake_versions({a: "2.21.5", b: "2.18.1"}))
    assert got == {"path": a, "version": "2.21.5", "also": [{"path": b, "version": "2.18.1"}]}


def test_describe_library_without_ncclgetversion_is_a_finding():
    found = found_in("torch_bundled_libnccl_so_1")
    path = found["nccl"][0]
    got = nccl_probe.describe(
        found, fake_versions({path: AttributeError("undefined symbol: ncclGetVersion")})
    )
    assert got == {
        "path": path,
        "version_error": "AttributeError: undefined symbol: ncclGetVersion",
    }


def test_describe_static_nccl_inside_libtorch_cuda():
    tc = "/usr/local/lib/python3.8/dist-packages/torch/lib/libtorch_cuda.so"
    found = {"nccl": [], "net": [], "torch_cuda": tc}
    assert nccl_probe.describe(found, fake_versions({tc: "2.14.3"})) == {
        "path": "static (in libtorch_cuda.so)",
        "static": True,
        "version": "2.14.3",
    }
    # not exported: nothing invented, and no error either (the build's NCCL is the one it runs)
    assert nccl_probe.describe(found, fake_versions({tc: AttributeError("no symbol")})) == {
        "path": "static (in libtorch_cuda.so)",
        "static": True,
    }


def test_describe_nothing_mapped():
    assert nccl_probe.describe({"nccl": [], "net": [], "torch_cuda": None}, fake_versions({})) == {
        "path": "none mapped"
    }


def test_probe_sends_nccl_probe_stdlib_only_and_unchanged_in_meaning():
    imports = {
        a.name.split(".")[0]
        for n in ast.walk(ast.parse(SHIPPED))
        if isinstance(n, ast.Import)
        for a in n.names
    } | {
        n.module.split(".")[0]
        for n in ast.walk(ast.parse(SHIPPED))
        if isinstance(n, ast.ImportFrom)
    }
    assert imports <= {"os", "re", "ctypes"}
    assert TORCH_PY.startswith(SHIPPED) and "runtime()" in TORCH_PY and '"""' not in SHIPPED
    ns: dict = {}
    exec(compile(SHIPPED, "shipped", "exec"), ns)
    for path in MAPS:
        text, expect = case(path)
        assert ns["mapped"](text) == expect
    assert ns["version_name"](22105) == "2.21.5"


# -- the real library ---------------------------------------------------------------------------
def _fetch(spec: str, member: str, target: Path) -> Path:
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    name = spec.replace("-", "_").replace("==", "-")
    archives = [p for p in CACHE.iterdir() if p.name.startswith(name) and p.suffix == ".whl"]
    if not archives:
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(CACHE), spec],
            capture_output=True,
            text=True,
            timeout=600,
        )
        archives = [p for p in CACHE.iterdir() if p.name.startswith(name) and p.suffix == ".whl"]
        if got.returncode or not archives:
            pytest.skip(f"{spec} could not be fetched: {got.stderr.strip()[-200:]}")
    with (
        zipfile.ZipFile(archives[0]) as z,
        z.open(member) as src,
        open(f"{target}.part", "wb") as dst,
    ):
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    os.replace(f"{target}.part", target)
    return target


@pytest.fixture(scope="module")
def real_libnccl() -> Path:
    """NCCL 2.21.5's own libnccl.so.2 (it loads without a GPU: CUDA is opened lazily); one
    fetch at a time (the suite's workers)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _fetch(WHEEL, "nvidia/nccl/lib/libnccl.so.2", CACHE / "libnccl.so.2.21.5")


def nccl_dir(tmp: Path, lib: Path) -> Path:
    """TMP/lib holding the library the way an NCCL install does: libnccl.so.2 -> the file."""
    d = tmp / "lib"
    d.mkdir(parents=True)
    try:
        os.link(lib, d / "libnccl.so.2.21.5")  # maps show the path it was opened by
    except OSError:  # another file system
        shutil.copyfile(lib, d / "libnccl.so.2.21.5")
    (d / "libnccl.so.2").symlink_to("libnccl.so.2.21.5")
    return d


def test_runtime_reads_the_loaded_library_and_its_version(real_libnccl, tmp_path):
    d = nccl_dir(tmp_path, real_libnccl)
    code = (
        SHIPPED + "import ctypes, json\nctypes.CDLL('libnccl.so.2')\nprint(json.dumps(runtime()))\n"
    )
    r = subprocess.run(
        [sys.executable, "-I", "-c", code],
        capture_output=True,
        text=True,
        env={"LD_LIBRARY_PATH": str(d), "PATH": os.environ["PATH"]},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got == {"path": os.path.realpath(d / "libnccl.so.2"), "version": "2.21.5"}


FAKE_TORCH = '''"""A stand-in for a CUDA build of torch, for the probe's sake: like libtorch_cuda's
DT_NEEDED, importing it loads libnccl.so.2 by its soname; it claims the NCCL it was "built" with."""
import ctypes
ctypes.CDLL("libnccl.so.2")
__version__ = "2.5.1+cu124"


class version:
    cuda = "12.4"


class cuda:
    is_available = staticmethod(lambda: False)
    get_arch_list = staticmethod(lambda: ["sm_80", "sm_90"])
    device_count = staticmethod(lambda: 0)

    class nccl:
        version = staticmethod(lambda: (2, 21, 5))
'''


def test_probe_script_reports_the_libnccl_ld_library_path_gives_and_rekeys_its_cache(
    real_libnccl, tmp_path
):
    """The whole on-node probe (sh + TORCH_PY) against a venv whose torch is a stand-in
    (above); the library, the maps and ncclGetVersion are real. Another LD_LIBRARY_PATH is
    a new cache key: the answer follows it."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    site = next(venv.glob("lib/python*/")) / "site-packages" / "torch"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text(FAKE_TORCH)
    (site / "version.py").write_text("__version__ = '2.5.1+cu124'\n")
    a, b = nccl_dir(tmp_path / "a", real_libnccl), nccl_dir(tmp_path / "b", real_libnccl)
    script, home = _torch_script(TorchIn(str(venv))), tmp_path / "home"
    home.mkdir()

    def probe(libdir):
        r = subprocess.run(
            ["/bin/sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
            env={"HOME": str(home), "PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(libdir)},
        )
        return _torch_build(r.stdout, r.returncode)

    first = probe(a)
    assert first["nccl"] == "2.21.5" and first["cuda"] == "12.4"
    assert first["nccl_lib"] == {"path": str(a / "libnccl.so.2.21.5"), "version": "2.21.5"}
    assert probe(a) == first  # the cached answer
    assert probe(b)["nccl_lib"]["path"] == str(b / "libnccl.so.2.21.5")


def test_probe_of_a_cpu_build_has_no_libnccl(torch_python, tmp_path):
    """The real CPU torch: no torch.version.cuda, so no nccl_lib key at all (not a None)."""
    venv = Path(torch_python).parent.parent
    r = subprocess.run(
        ["/bin/sh", "-c", _torch_script(TorchIn(str(venv), deep=True))],
        capture_output=True,
        text=True,
        timeout=300,
        env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]},
    )
    got = _torch_build(r.stdout, r.returncode)
    assert got["cuda"] is None and got["version"].endswith("+cpu")
    assert "nccl_lib" not in got and got["nccl"] is None


def test_health_payload_names_the_loaded_libnccl(torch_python, real_libnccl, tmp_path):
    """health.py as `train` ships it (with nccl_probe.py beside it in the job directory), in the
    CPU torch venv, with the real libnccl loaded by soname."""
    d = nccl_dir(tmp_path, real_libnccl)
    job = tmp_path / "job"
    job.mkdir()
    for name, src in payload.local_files(*payload.resolve_payload("health")).items():
        shutil.copy(src, job / name)
    code = (
        "import ctypes, importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('health', {str(job / 'health.py')!r})\n"
        "health = importlib.util.module_from_spec(spec); spec.loader.exec_module(health)\n"
        "print(health.nccl_runtime())\n"
        "ctypes.CDLL('libnccl.so.2')\n"
        "print(health.nccl_runtime())\n"
    )
    r = subprocess.run(
        [torch_python, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={"LD_LIBRARY_PATH": str(d), "PATH": os.environ["PATH"]},
    )
    assert r.returncode == 0, r.stderr
    before, after = r.stdout.splitlines()[-2:]
    assert before == "('nccl_lib=none mapped nccl_net=none ', None)"  # CPU torch maps none
    assert after == f"('nccl_lib={d}/libnccl.so.2.21.5 (2.21.5) nccl_net=none ', '2.21.5')"
