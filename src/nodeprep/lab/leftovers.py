"""What a lab left behind, for `invoke doctor`'s labs check."""

from __future__ import annotations

import os
import re
from pathlib import Path

from nodeprep.settings import Settings

from . import net
from .config import bridge_name
from .state import STATE, _node, _ours, _read_state, _sshd_pid


def leftovers(settings: Settings = Settings()) -> list[tuple[str, str, str]]:
    """[(lab, what is left, the command that clears it)] for `invoke doctor`: a lab whose
    nodes are partly gone (a stopped sshd, a missing namespace), namespaces without their
    bridge, namespaces of a lab nodeprep has no directory for when nothing runs in them. A
    lab fully up or fully down is none, and so is a lab whose namespaces hold processes but
    whose directory is not under this lab root: one run from another lab root (setting
    nodeprep.lab_root, INVOKE_NODEPREP_LAB_ROOT), which this check cannot see into and must
    never tell anyone to delete."""
    if os.geteuid() != 0:
        return []
    root = Path(settings.lab_root)
    out = []
    names = {p.parent.name for p in root.glob(f"*/{STATE}")}
    stray = {m.group(1) for ns in net.netns_list() if (m := re.fullmatch(r"np-(\w+)-\d+", ns))}
    for name in sorted(names | stray):
        state, present = _read_state(root / name), _ours(name)
        if state is None:
            if present and not any(net.netns_pids(list(present.values())).values()):
                out.append(
                    (
                        name,
                        f"{len(present)} namespace(s) np-{name}-* with no lab directory in {root}",
                        " && ".join(f"ip netns del {ns}" for ns in present.values()),
                    )
                )
            continue
        bridge = net.link_exists(bridge_name(name))
        if not bridge and present:
            out.append(
                (
                    name,
                    f"{len(present)} node namespace(s) left without the lab's bridge",
                    f"invoke lab.down --name {name}",
                )
            )
        elif bridge:
            dead = [_node(name, root / name, state["subnet"], i) for i in range(state["nodes"])]
            dead = [n.name for n in dead if n.index not in present or _sshd_pid(n) is None]
            if dead:
                out.append(
                    (
                        name,
                        f"{', '.join(dead)} down while the lab is up",
                        f"invoke lab.up --name {name} --nodes {state['nodes']}  "
                        f"(or invoke lab.down --name {name})",
                    )
                )
    return out
