#!/usr/bin/python3
"""A stand-in `nvidia-smi` (and `dmesg`) for the lab's GPU-shaped nodes: it answers from a
recording of a real machine (lab.up --gpu-record DIR), so facts, torch-plan, verify-parity and
health read a lab node as they read that machine. Installed by lab/gpu.py as
/usr/local/bin/nvidia-smi (and /usr/local/bin/dmesg when the recording has a kernel log) in
the node's own mount namespace; the recording sits beside it in .gpu-record/:

  nvidia-smi-q.xml   `nvidia-smi -q -x` of the machine (required)
  nvidia-smi-q.txt   `nvidia-smi -q` (optional; else a plain rendering of the XML)
  nvlink-s.txt       `nvidia-smi nvlink -s` (optional; else nothing, as on a GPU without NVLink)
  topo-m.txt         `nvidia-smi topo -m` (optional)
  kernel.log         kernel log lines (optional): `dmesg` replays them as logged a minute ago
  query.json         the --query-gpu / --query-compute-apps fields, made by lab/gpu.py
  hang               (a lab fault) nvidia-smi never answers

Answers: -q, -q -x, --query-gpu=F,... and --query-compute-apps=F,... with
--format=csv[,noheader][,nounits], nvlink -s, topo -m; anything else exits 2 with nvidia-smi's
own kind of message. Standard library only."""

import json
import os
import sys
import time
import xml.etree.ElementTree as ET

HERE = os.path.join(os.path.dirname(os.path.realpath(__file__)), ".gpu-record")


def _read(name):
    try:
        with open(os.path.join(HERE, name), encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _text_q(xml_text):
    """`nvidia-smi -q` as plain `Key : value` lines when no text recording exists."""
    out = []

    def walk(el, depth):
        for child in el:
            name = child.tag.replace("_", " ").title()
            if len(child):
                out.append("    " * depth + name)
                walk(child, depth + 1)
            else:
                out.append("    " * depth + f"{name:<40}: {(child.text or '').strip()}")

    walk(ET.fromstring(xml_text), 0)
    return "\n".join(out) + "\n"


def _csv(kind, fields, fmt):
    data = json.loads(_read("query.json") or "{}")
    table, known = data.get(kind, []), set(data.get(kind + "_fields", []))
    for f in fields:
        if f not in known:
            print(f'Field "{f}" is not a valid field to query.', file=sys.stderr)
            return 2
    opts = set(fmt.split(",")[1:])
    if "noheader" not in opts:
        print(", ".join(data.get("headers", {}).get(f, f) for f in fields))
    for row in table:
        print(", ".join(row[f][1 if "nounits" in opts else 0] for f in fields))
    return 0


def nvidia_smi(argv):
    if os.path.exists(os.path.join(HERE, "hang")):
        while True:
            time.sleep(3600)
    xml_text = _read("nvidia-smi-q.xml")
    if xml_text is None:
        print(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            file=sys.stderr,
        )
        return 9
    query = next((a for a in argv if a.startswith(("--query-gpu=", "--query-compute-apps="))), None)
    fmt = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), "")
    if query:
        kind, fields = query[2:].split("=", 1)
        if not fmt.startswith("csv"):
            print("Option --format is required with --query-* options", file=sys.stderr)
            return 2
        return _csv(
            "gpus" if kind == "query-gpu" else "apps", [f.strip() for f in fields.split(",")], fmt
        )
    if argv[:1] == ["nvlink"]:
        sys.stdout.write(_read("nvlink-s.txt") or "")
        return 0
    if argv[:1] == ["topo"]:
        text = _read("topo-m.txt")
        if text is None:
            print("topo -m is not in this lab node's recording", file=sys.stderr)
            return 2
        sys.stdout.write(text)
        return 0
    if "-q" in argv or "--query" in argv:
        xml = "-x" in argv or "--xml-format" in argv
        sys.stdout.write(xml_text if xml else (_read("nvidia-smi-q.txt") or _text_q(xml_text)))
        return 0
    if not argv:
        sys.stdout.write(_text_q(xml_text))
        return 0
    print(f"Invalid combination of input arguments: {' '.join(argv)}", file=sys.stderr)
    return 2


def dmesg(argv):
    """The recorded lines, stamped as logged a minute ago (seconds since boot, as dmesg)."""
    log = _read("kernel.log") or ""
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    lines = [ln for ln in log.splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        msg = (
            line.split(" kernel: ", 1)[1] if " kernel: " in line else line
        )  # a syslog/journal line
        if msg.startswith("[") and "]" in msg:  # dmesg's own stamp
            msg = msg.split("]", 1)[1].strip()
        stamp = max(0.0, uptime - 60 + i * 0.001)
        print(f"[{stamp:12.6f}] {msg}")
    return 0


if __name__ == "__main__":
    prog = os.path.basename(sys.argv[0])
    sys.exit(dmesg(sys.argv[1:]) if prog == "dmesg" else nvidia_smi(sys.argv[1:]))
