"""GPU-shaped lab nodes: `lab.up --gpu-record DIR` (every node) or `--gpu-record NODE=DIR`
gives a node the stand-in nvidia-smi (nodeside/gpu_standin.py) over a real machine's
recording, and `dmesg` replaying its kernel log. Each node binds its own directory over
/usr/local/bin (first on sshd's PATH); a node without a recording has it empty, so a
recording added or removed later shows at once, without a restart.

DIR: nvidia-smi-q.xml (`nvidia-smi -q -x`, required), optional nvidia-smi-q.txt,
nvlink-s.txt, topo-m.txt, kernel.log; a file `hang` makes nvidia-smi never answer."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

from nodeprep.engine.facts.gpus import capability_from_name
from nodeprep.errors import InputError
from nodeprep.lab import etc
from nodeprep.lab.config import BIN
from nodeprep.nodeside import GPU_STANDIN

RECORD = ".gpu-record"
FILES = ("nvidia-smi-q.xml", "nvidia-smi-q.txt", "nvlink-s.txt", "topo-m.txt", "kernel.log", "hang")

# --query-gpu fields: (header, path under <gpu> or a function of (root, gpu, index), unit)
_GPU_FIELDS = {
    "index": ("index", lambda r, g, i: str(i), ""),
    "name": ("name", "product_name", ""),
    "driver_version": ("driver_version", lambda r, g, i: r.findtext("driver_version", ""), ""),
    "compute_cap": (
        "compute_cap",
        lambda r, g, i: capability_from_name(g.findtext("product_name", "")) or "[N/A]",
        "",
    ),
    "memory.total": ("memory.total [MiB]", "fb_memory_usage/total", " MiB"),
    "memory.used": ("memory.used [MiB]", "fb_memory_usage/used", " MiB"),
    "memory.free": ("memory.free [MiB]", "fb_memory_usage/free", " MiB"),
    "pci.bus_id": ("pci.bus_id", lambda r, g, i: g.get("id", ""), ""),
    "uuid": ("uuid", "uuid", ""),
    "serial": ("serial", "serial", ""),
    "vbios_version": ("vbios_version", "vbios_version", ""),
    "persistence_mode": ("persistence_mode", "persistence_mode", ""),
    "ecc.mode.current": ("ecc.mode.current", "ecc_mode/current_ecc", ""),
    "mig.mode.current": ("mig.mode.current", "mig_mode/current_mig", ""),
    "pcie.link.gen.current": (
        "pcie.link.gen.current",
        "pci/pci_gpu_link_info/pcie_gen/current_link_gen",
        "",
    ),
    "pcie.link.gen.max": ("pcie.link.gen.max", "pci/pci_gpu_link_info/pcie_gen/max_link_gen", ""),
    "pcie.link.width.current": (
        "pcie.link.width.current",
        lambda r, g, i: g.findtext(
            "pci/pci_gpu_link_info/link_widths/current_link_width", ""
        ).rstrip("x"),
        "",
    ),
    "pcie.link.width.max": (
        "pcie.link.width.max",
        lambda r, g, i: g.findtext("pci/pci_gpu_link_info/link_widths/max_link_width", "").rstrip(
            "x"
        ),
        "",
    ),
    "temperature.gpu": (
        "temperature.gpu",
        lambda r, g, i: g.findtext("temperature/gpu_temp", "").rstrip(" C"),
        "",
    ),
    "utilization.gpu": ("utilization.gpu [%]", "utilization/gpu_util", " %"),
}
_APP_FIELDS = {
    "pid": ("pid", "pid", ""),
    "process_name": ("process_name", "process_name", ""),
    "used_memory": ("used_gpu_memory [MiB]", "used_memory", " MiB"),
}


def _value(spec, root, el, i) -> list[str]:
    """[with units, without units] as nvidia-smi's csv prints them."""
    _header, path, unit = spec
    text = path(root, el, i) if callable(path) else (el.findtext(path) or "[N/A]").strip()
    bare = text[: -len(unit)] if unit and text.endswith(unit) else text
    return [text, bare]


def query_json(xml_text: str) -> dict:
    root = ET.fromstring(xml_text)
    gpus, apps = [], []
    for i, g in enumerate(root.findall("gpu")):
        gpus.append({f: _value(spec, root, g, i) for f, spec in _GPU_FIELDS.items()})
        for p in g.findall("processes/process_info"):
            apps.append({f: _value(spec, root, p, i) for f, spec in _APP_FIELDS.items()})
    headers = {f: s[0] for f, s in {**_GPU_FIELDS, **_APP_FIELDS}.items()}
    return {
        "gpus": gpus,
        "gpus_fields": list(_GPU_FIELDS),
        "apps": apps,
        "apps_fields": list(_APP_FIELDS),
        "headers": headers,
    }


def check_record(path: str) -> Path:
    """A recording directory as --gpu-record names it; InputError when it cannot serve."""
    d = Path(path).expanduser().resolve()
    xml = d / "nvidia-smi-q.xml"
    if not xml.is_file():
        raise InputError(
            f"--gpu-record {path}: no nvidia-smi-q.xml in it",
            hint="a directory holding the output of `nvidia-smi -q -x` as nvidia-smi-q.xml",
        )
    try:
        ET.fromstring(xml.read_text(errors="replace"))
    except ET.ParseError as e:
        raise InputError(
            f"--gpu-record {xml}: not XML ({e})", hint="save `nvidia-smi -q -x` unchanged"
        ) from None
    return d


def records(
    specs: tuple[str, ...] | None, had: dict, count: int, names: list[str]
) -> dict[int, str]:
    """{node index: recording dir}: what the lab had, changed by the --gpu-record values in
    turn (DIR: every node; NODE=DIR: that node, NODE a name or an index; DIR `none`: no
    recording)."""
    out = {int(k): v for k, v in (had or {}).items() if int(k) < count}
    for spec in specs or ():
        node, sep, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        targets = range(count) if not sep else [_index(node, names)]
        for i in targets:
            if path == "none":
                out.pop(i, None)
            else:
                out[i] = str(check_record(path))
    return out


def _index(node: str, names: list[str]) -> int:
    if node in names:
        return names.index(node)
    if node.isdigit() and int(node) < len(names):
        return int(node)
    raise InputError(
        f"--gpu-record {node}=...: no lab node {node!r}", hint=f"nodes: {', '.join(names)}"
    )


def install(node_dir: Path, record: str | None) -> bool:
    """The node's /usr/local/bin: the stand-in over RECORD, or empty. True if it changed."""
    bin_dir = node_dir / BIN
    bin_dir.mkdir(mode=0o755, exist_ok=True)
    want = _wanted(record)
    have = _present(bin_dir)
    if want == have:
        return False
    for p in list(bin_dir.iterdir()):
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    if record:
        rec = bin_dir / RECORD
        rec.mkdir(mode=0o755)
        for name, text in want["record"].items():
            (rec / name).write_text(text)
        shutil.copyfile(GPU_STANDIN, bin_dir / "nvidia-smi")
        (bin_dir / "nvidia-smi").chmod(0o755)
        if "kernel.log" in want["record"]:
            (bin_dir / "dmesg").symlink_to("nvidia-smi")
    return True


def _wanted(record: str | None) -> dict | None:
    if not record:
        return None
    d = Path(record)
    files = {n: (d / n).read_text(errors="replace") for n in FILES if (d / n).is_file()}
    files["query.json"] = json.dumps(query_json(files["nvidia-smi-q.xml"]))
    return {"record": files, "standin": GPU_STANDIN.read_text()}


def _present(bin_dir: Path) -> dict | None:
    rec = bin_dir / RECORD
    if not rec.is_dir() or not (bin_dir / "nvidia-smi").is_file():
        return None
    return {
        "record": {p.name: p.read_text(errors="replace") for p in rec.iterdir() if p.is_file()},
        "standin": (bin_dir / "nvidia-smi").read_text(),
    }


def bound(pid: int, node_dir: Path) -> bool:
    """Whether node process PID sees its own /usr/local/bin (a node started before GPU-shaped
    nodes existed does not, and is restarted by up())."""
    return etc.bind_mounted(pid, "/usr/local/bin", f"/{node_dir.name}/{BIN}")
