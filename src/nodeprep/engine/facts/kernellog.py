"""KERNEL_LOG: the kernel log's lines that matter to GPU health (Xids, SXids, a GPU fallen off
the bus, a PCIe link limited, the NVSwitch driver), with their age; read on nodes with NVIDIA
GPUs only. The checks that judge them are in ops/health/ (gpu.py, xids.py)."""

from __future__ import annotations

import re

from nodeprep.engine.facts.probe import Fact

# `dmesg` needs kernel.dmesg_restrict=0 (or CAP_SYSLOG) for a plain user; `journalctl -k`
# needs the adm or systemd-journal group. Either gives monotonic stamps (seconds since boot),
# compared with /proc/uptime for the age. Only the matching lines travel.
KLOG_PATTERN = (
    r"NVRM: Xid|SXid|fallen off the bus|available PCIe bandwidth, limited by|nvidia-nvswitch"
)
# Only a node with NVIDIA GPUs (or their driver's tool) reads it: the lines looked for are theirs.
KERNEL_LOG_PROBE = (
    "read -r np_up _ < /proc/uptime\n"
    'echo "uptime $np_up"\n'
    "[ -e /dev/nvidia0 ] || command -v nvidia-smi >/dev/null 2>&1 || "
    "{ echo 'via skipped'; exit 0; }\n"
    "if np_out=$(timeout -k 2 10 dmesg 2>&1); then\n"
    "  echo 'via dmesg'\n"
    "elif command -v journalctl >/dev/null 2>&1 &&\n"
    "    np_j=$(timeout -k 2 10 journalctl -k -b -o short-monotonic --no-pager -q 2>&1) &&\n"
    '    [ -n "$np_j" ]; then\n'
    "  np_out=$np_j\n"
    "  echo 'via journalctl'\n"
    "else\n"
    '  echo "unreadable $(printf \'%s\' "$np_out" | head -n 1)"\n'
    "  exit 0\n"
    "fi\n"
    f"printf '%s\\n' \"$np_out\" | grep -E '{KLOG_PATTERN}' | tail -n 500\n"
    "true"
)

_STAMP = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]\s*(.*)$")


def parse_kernel_log(text: str, rc: int) -> dict:
    """{readable, via (dmesg, journalctl, or skipped: no NVIDIA GPU), error, uptime, lines:
    [{age (seconds, None if unstamped), text}]}."""
    uptime = None
    via = None
    lines = []
    error = None
    for line in text.splitlines():
        if line.startswith("uptime "):
            try:
                uptime = float(line.split()[1])
            except (IndexError, ValueError):
                uptime = None
        elif line.startswith("via "):
            via = line[4:].strip()
        elif line.startswith("unreadable"):
            error = line[len("unreadable") :].strip() or "no kernel log could be read"
        elif line.strip():
            m = _STAMP.match(line.strip())
            stamp, msg = (float(m.group(1)), m.group(2)) if m else (None, line.strip())
            age = (uptime - stamp) if (stamp is not None and uptime is not None) else None
            lines.append({"age": None if age is None else max(0.0, age), "text": msg})
    return {"readable": error is None, "via": via, "error": error, "uptime": uptime, "lines": lines}


KERNEL_LOG = Fact("kernel_log", lambda _v: KERNEL_LOG_PROBE, parse_kernel_log)
