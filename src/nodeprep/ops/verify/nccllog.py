"""What NCCL's own log (NCCL_DEBUG=INFO, subsystems INIT,NET) says about one node's ranks: the
net plugin it loaded (or that it found none), the network it used, the transports of its
channels, and the version the rank-0 process announced. Only NCCL knows whether
aws-ofi-nccl really loaded: torch reports the NCCL it was built with.

Pure: lines in, values out. Formats of NCCL 2.4 to 2.29 and aws-ofi-nccl 1.4 to 1.16, each
from a real log in tests/facts/nccl_log/: "NET/Plugin : No plugin found (libnccl-net.so)."
(2.4), "... returned 2 : ..." + "No plugin found, using internal implementation" (2.18),
"NET/Plugin: Using internal network plugin." (2.21), "NET/Plugin: Could not find:" (2.29),
"NET/Plugin: Loaded net plugin NAME (vN)" (2.16+), "Successfully loaded external plugin"
(2.27), "Plugin Path :" (HPC-X's plugin), "NET/OFI Initializing aws-ofi-nccl V"."""

from __future__ import annotations

import re

# host:pid:tid [dev] [file.cc:123] NCCL INFO|WARN text, after any launcher or timestamp prefix
_LINE = re.compile(r"(?:(\S+):(\d+):\d+ \[\d+\] (?:\S+ )?)?NCCL (?:INFO|WARN) (.*?)\s*$")
_VERSION = re.compile(r"\bNCCL version (\d+\.\d+\.\d+)")
_OFI = re.compile(r"^NET/OFI (?:Initializing|Using) aws-ofi-nccl (\S+)")
_LOADED = re.compile(r"^NET/Plugin ?: Loaded net plugin (.+?)(?: \(v\d+\))?$")
_EXTERNAL = re.compile(r"^Successfully loaded external (?:network )?plugin (\S+)")
_PATH = re.compile(r"^Plugin Path : (\S+)")
_NONE = re.compile(
    r"^(?:NET/Plugin ?: .*(?:No plugin found|Plugin load|Could not find|internal"
    r"|dlerror=)|Unable to load libnccl-net)"
)
_FAILED = re.compile(r"^(?:NET/OFI .*initialization failed|Failed to initialize NET plugin (\S+))")
_NETWORK = re.compile(r"^Using (?:internal )?[Nn]etwork (.+)$")
_VIA = re.compile(r"^(?:Channel|Ring) \d+(?:/\d+)? : .* via (\S.*)$")
INTERNAL = ("IB", "Socket")  # NCCL's own networks; any other name is a plugin's


def transport(via: str) -> str:
    """'NET/IB/0/GDRDMA' -> 'NET/IB/GDRDMA', 'NET/AWS Libfabric/1(2)/GDRDMA/Shared' ->
    'NET/AWS Libfabric/GDRDMA', 'P2P/IPC/read' -> 'P2P/IPC', 'SHM/direct/direct' -> 'SHM':
    the kind and the network or mechanism, without device numbers and modes."""
    parts = via.split("/")
    if parts[0] == "NET" and len(parts) > 1:
        return f"NET/{parts[1]}" + ("/GDRDMA" if "GDRDMA" in parts[2:] else "")
    if parts[0] == "P2P" and len(parts) > 1:
        return f"P2P/{parts[1]}"
    return parts[0]


class _Proc:
    """What one process (pid) of the node said."""

    def __init__(self):
        self.ofi = None
        self.loaded = None
        self.path = None
        self.ofi_seen = False
        self.none = False
        self.failed = False
        self.networks: set[str] = set()
        self.transports: set[str] = set()

    def feed(self, text: str) -> None:
        for rx, attr in ((_OFI, "ofi"), (_LOADED, "loaded"), (_EXTERNAL, "path"), (_PATH, "path")):
            m = rx.match(text)
            if m:
                setattr(self, attr, m.group(1))
        self.ofi_seen = self.ofi_seen or text.startswith("NET/OFI ")
        self.none = self.none or bool(_NONE.match(text))
        m = _FAILED.match(text)
        self.failed = self.failed or bool(m and m.group(1) not in INTERNAL)
        m = _NETWORK.match(text)
        if m:
            self.networks.add(m.group(1))
        m = _VIA.match(text)
        if m:
            self.transports.add(transport(m.group(1)))

    def plugin(self) -> str | None:
        """Its net plugin: the plugin's own banner (aws-ofi-nccl and version) before NCCL's
        name for it, with where it came from when NCCL said; 'none' when NCCL found none."""
        name = (
            f"aws-ofi-nccl {self.ofi}"
            if self.ofi
            else self.loaded or ("aws-ofi-nccl" if self.ofi_seen else None)
        )
        where = self.path if self.path and "/" in self.path else None
        value = f"{name} ({where})" if name and where else name or where
        if value:
            return value + (" (initialization failed)" if self.failed else "")
        return "none" if self.none else None


def parse(lines) -> dict:
    """One node's lines -> {'net_plugin', 'network', 'transport', 'version'}, each only when
    the log said it (none of them on gloo, where NCCL never runs). Ranks that disagree are
    all shown: values joined, sorted."""
    procs: dict[str | None, _Proc] = {}
    version = None
    for line in lines:
        v = _VERSION.search(line)
        version = version or (v.group(1) if v else None)
        m = _LINE.search(line)
        if m:
            key = f"{m.group(1)}:{m.group(2)}" if m.group(1) else None
            procs.setdefault(key, _Proc()).feed(m.group(3))
    ofi = {p.ofi for p in procs.values() if p.ofi}
    for p in procs.values():  # one install per node: its version for ranks whose banner
        if p.ofi_seen and len(ofi) == 1:  # the log (or its excerpt) lacks
            p.ofi = p.ofi or next(iter(ofi))
    out = {
        "net_plugin": "; ".join(sorted({p.plugin() for p in procs.values()} - {None})),
        "network": ", ".join(sorted({n for p in procs.values() for n in p.networks})),
        "transport": ", ".join(sorted({t for p in procs.values() for t in p.transports})),
        "version": version,
    }
    return {k: v for k, v in out.items() if v}
