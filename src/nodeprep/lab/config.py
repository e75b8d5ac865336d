"""What the emulated lab is made of, as data and text: names, addresses, sshd configs,
the files the lab writes into each node's /etc (hosts, shells, sudoers) and the lab key's line
in authorized_keys (the inventory is lab_inventory.py). Pure functions, so the unit
tests can check every generated file without root or a running sshd.
"""

from __future__ import annotations

import base64
import re
import zlib
from dataclasses import KW_ONLY, dataclass
from pathlib import Path

import paramiko

from nodeprep.errors import InputError

LAB_USER = "nodeprep"  # the one Unix user of the rootful lab, on every node
LAB_HOME = Path("/home/nodeprep")  # same absolute home path on every node, as on a cluster
LOCAL_PORT_BASE = 2200  # non-root fallback: node i listens on 127.0.0.1:2200+i
MAX_NODES = 512  # node I at 10.X.(I // 200).(10 + I % 200), inside the lab's 10.X.0.0/16
LOCAL_MAX_NODES = 200  # without root: each lab name has a block of 200 ports on 127.0.0.1
PREFIX = 16  # the lab's subnet, 10.X.0.0/16: the bridge at .0.1, a bastion at .0.5
NODE_PYTHON = "/usr/bin/python3"
# Login shells every node offers (in its /etc/shells and its sudoers rule): bash, zsh and
# tcsh at both of Debian's merged-/usr paths, and sh/dash as Debian lists them.
LOGIN_SHELLS = (
    "/bin/sh",
    "/usr/bin/sh",
    "/bin/bash",
    "/usr/bin/bash",
    "/bin/dash",
    "/usr/bin/dash",
    "/bin/zsh",
    "/usr/bin/zsh",
    "/bin/tcsh",
    "/usr/bin/tcsh",
)
SUDOERS_NAME = "nodeprep-lab"  # /etc/sudoers.d/ file of every rootful node
SUDOERS_SLURM_NAME = "nodeprep-lab-slurm"  # ... and its rule for draining the lab's Slurm nodes
PASSWORD_FLAG = "password-login"  # in a node's directory: its sshd takes passwords
DENY_FLAG = "denied-address"  # in a node's directory: the address its sshd refuses (a bastion lab)


@dataclass
class LabNode:
    name: str  # worker-N
    index: int
    address: str
    _: KW_ONLY
    port: int
    netns: str | None  # None in the non-root fallback
    home: Path  # the node's private home on the host file system
    sshd_pid: int | None  # None while the node's sshd is not running
    arch: str | None = None  # another CPU architecture's userland (lab/foreign.py); None: native


@dataclass
class LabInfo:
    name: str
    nodes: list[LabNode]
    user: str
    _: KW_ONLY
    key: Path  # controller private key for the lab (0600)
    inventory: Path  # the hosts.yml written
    rootful: bool
    bastion: LabNode | None = None  # lab.up --bastion: the jump host in front of the nodes


@dataclass(frozen=True)
class UpOptions:
    """The optional knobs of up(): where the inventory goes (None: inventory/NAME/ of the
    project), the lab's subnet 10.X.0.0/16 (None: derived from the name, see subnet_for),
    Slurm over the nodes (None: as the lab had it)."""

    inventory_dir: Path | None = None
    subnet: int | None = None
    slurm: bool | None = None
    # One home bind-mounted into every node, as an NFS home would be (None: as the lab had it).
    shared_home: bool | None = None
    # Extra inventory nodes that reach the first ALIASES nodes' machines again (the single-box
    # recipe: two inventory names, one machine), named after the last node.
    aliases: int = 0
    # Interface names the nodes get in turn (node I: NIC_NAMES[I % len]), as on a cluster
    # whose nodes differ (eno1 on some, eth0 on others); () is eth0 everywhere (None: as it was).
    nic_names: tuple[str, ...] | None = None
    # Node indices whose user may not sudo (the lab's other nodes may run `sudo usermod -s`).
    no_sudo: tuple[int, ...] = ()
    # Each node's link limited to this rate both ways ("200mbit": tc on both ends of its veth;
    # the bridge is not limited), "" for no limit, None: as the lab had it.
    link_rate: str | None = None
    # --gpu-record values: DIR (every node) or NODE=DIR, `none` to drop (lab/gpu.py);
    # None: as it was.
    gpu_records: tuple[str, ...] | None = None
    # A jump host in front of the nodes, the only way in from the controller (lab/bastion.py);
    # None: as the lab had it.
    bastion: bool | None = None
    # Podman on the nodes, rootless for the lab user (lab/containers.py); None: as it was.
    containers: bool | None = None
    # Environment modules on the nodes: "lmod" or "tcl" (lab/modules.py), "" for none; None: as
    # it was.
    modules: str | None = None
    # --arch values: ARCH (every node) or NODE=ARCH, `native` to go back (lab/foreign.py);
    # None: as the lab had it.
    arch: tuple[str, ...] | None = None


@dataclass(frozen=True)
class SshdAccess:
    """Who may log in to a node's sshd, and where sshd finds their keys (None: the user's own
    ~/.ssh/authorized_keys, the default)."""

    user: str = LAB_USER
    authorized_keys: Path | None = None
    deny_from: str | None = None  # an address no login is taken from (a bastion lab's controller)


def validate_name(name: str) -> str:
    # The bridge is `np-<name>` and a host veth `np-<name>-<i>`: Linux caps interface
    # names at 15 bytes, and no dash inside the name keeps `np-a-1` from meaning two labs.
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9]{0,5}", name):
        raise InputError(
            f"lab name {name!r} is not usable",
            hint="use 1-6 lowercase letters or digits, starting with a letter",
        )
    return name


def validate_count(nodes) -> int:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise InputError(
            f"--nodes {nodes!r} is out of range", hint=f"give a whole number from 1 to {MAX_NODES}"
        )
    return nodes


_RATE_UNITS = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9}


def validate_link_rate(rate) -> str:
    """A node link rate as tc writes it ("200mbit"), "" for none; one-line InputError else.
    1 kbit/s to 100 gbit/s, a whole number with a unit (what tbf is given as)."""
    if rate in (None, "", "none", "off"):
        return ""
    m = re.fullmatch(r"([1-9][0-9]{0,8})(kbit|mbit|gbit)", str(rate).strip().lower())
    if not m or int(m.group(1)) * _RATE_UNITS[m.group(2)] > 100 * 10**9:
        raise InputError(
            f"--link-rate {str(rate)[:40]!r} is not a rate",
            hint="give a whole number with kbit, mbit or gbit, e.g. 200mbit "
            "(at most 100gbit), or none",
        )
    return f"{int(m.group(1))}{m.group(2)}"


def link_rates(state: dict | None, running: bool, option) -> tuple[str, str]:
    """(the link rate the lab's veths have now, the one wanted): a running lab has what its
    state says (a veth made anew has none); OPTION None keeps the state's."""
    stored = str((state or {}).get("link_rate") or "")
    return (stored if running else ""), (stored if option is None else validate_link_rate(option))


def tc_lines(dev: str, rate: str) -> list[str]:
    """`tc -batch` lines limiting DEV's egress to RATE (a token bucket of 10 ms of traffic,
    at least 32 KB, so a burst never exceeds the rate for long), or removing the limit."""
    if not rate:
        return [f"qdisc del dev {dev} root"]
    m = re.fullmatch(r"(\d+)(kbit|mbit|gbit)", rate)
    bps = int(m.group(1)) * _RATE_UNITS[m.group(2)]
    burst = max(32 * 1024, bps // 8 // 100)
    return [f"qdisc replace dev {dev} root tbf rate {rate} burst {burst} latency 50ms"]


def subnet_for(name: str, subnet: int | None = None) -> int:
    """Second octet of the lab's 10.X.0.0/16: 200 for "local", a stable 201-250 per name
    (so two labs can be up at once), or the caller's choice."""
    if subnet is not None:
        if isinstance(subnet, bool) or not isinstance(subnet, int) or not 1 <= subnet <= 254:
            raise InputError(
                f"subnet {subnet!r} is out of range", hint="give X of 10.X.0.0/16, 1 to 254"
            )
        return subnet
    if name == "local":
        return 200
    return 201 + zlib.crc32(name.encode()) % 50


def bridge_name(name: str) -> str:
    return f"np-{name}"


def netns_name(name: str, index: int) -> str:
    return f"np-{name}-{index}"


def node_name(index: int) -> str:
    return f"worker-{index}"


def node_address(octet: int, index: int) -> str:
    """Nodes 0-199 at 10.X.0.10-209 (as when the lab was one /24), the next 200 at
    10.X.1.10-209, and so on: no address ends in .0 or .255."""
    return f"10.{octet}.{index // 200}.{10 + index % 200}"


def lab_network(octet: int) -> str:
    return f"10.{octet}.0.0/{PREFIX}"


def node_mac(address: str) -> str:
    """The MAC of the lab interface that holds ADDRESS: locally administered (02:00) and made
    of the address, so a node removed and made again has the same one. The host's and the
    other nodes' ARP caches then still hold it; with a random MAC a node regrown within the
    cache's reachable time (15-45 s) got no packet from them (seen: `lab_up(4)` right after
    `lab_up(3)`, worker-3's sshd unanswered for 10 s)."""
    return "02:00:" + ":".join(f"{int(b):02x}" for b in address.split("."))


def bridge_address(octet: int) -> str:
    return f"10.{octet}.0.1"


def local_port_base(name: str) -> int:
    # Non-root labs share 127.0.0.1: give every lab name its own block of 200 ports.
    return LOCAL_PORT_BASE if name == "local" else LOCAL_PORT_BASE + 200 * (subnet_for(name) - 200)


_COMMON = [
    "PubkeyAuthentication yes",
    "KbdInteractiveAuthentication no",
    "UsePAM no",  # without PAM an account with password `!` is locked
    "PermitRootLogin no",
    "StrictModes yes",
    "MaxStartups 100:30:200",  # the default 10:30:100 drops connections under fan-out
    "MaxSessions 50",
    "Subsystem sftp internal-sftp",
    "LogLevel INFO",  # with -e this goes to stderr = the node's sshd.log
]


def sshd_config(
    node_dir: Path,
    address: str,
    port: int = 22,
    node: str = "",
    password: bool = False,
    login: SshdAccess = SshdAccess(),
) -> str:
    """sshd_config for one node. LOGIN: the lab user by default; the non-root fallback gives
    its own user and an authorized_keys file in the lab directory, since its nodes share the
    user's real home and must not touch its ~/.ssh. PASSWORD: this node takes password logins
    (each node's sshd has its own config and listens only on its own address, so this
    concerns that one node)."""
    lines = [
        f"# generated by nodeprep lab for {node or address}; rewritten by `invoke lab.up`",
        f"Port {port}",
        f"ListenAddress {address}",
        f"HostKey {node_dir / 'ssh_host_ed25519_key'}",
        f"PidFile {node_dir / 'sshd.pid'}",
        f"AllowUsers {login.user}",
        f"PasswordAuthentication {'yes' if password else 'no'}",
    ] + _COMMON
    if login.authorized_keys is not None:
        lines.append(f"AuthorizedKeysFile {login.authorized_keys}")
    if login.deny_from:  # a bastion lab: nobody logs in from the controller's address
        lines += [f"Match Address {login.deny_from}", "    DenyUsers *"]
    return "\n".join(lines) + "\n"


def hosts_text(octet: int, count: int, aliases: int = 0) -> str:
    """/etc/hosts of every node: every node name resolves on every node (torchrun's c10d
    and DeepSpeed hand node names around), and nothing else is needed. Alias node
    worker-(COUNT+k) names node k's machine."""
    lines = [
        "# generated by nodeprep lab: every node of the lab",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
    ]
    lines += [
        f"{node_address(octet, i)}\t{node_name(i)}"
        + "".join(f" {node_name(count + k)}" for k in range(aliases) if k == i)
        for i in range(count)
    ]
    return "\n".join(lines) + "\n"


# The shell that becomes one node, run as `ip netns exec NS unshare --mount --uts
# --propagation private /bin/sh -c NODE_INIT sh HOSTNAME ETC HOME_SRC HOME CONFIG BIN`.
# Values come in as positional arguments, so nothing is quoted into the script.
# ETC is the node's own copy of /etc (its passwd, shells, sudoers, hosts, resolv.conf), bound
# as a whole directory: `usermod` replaces /etc/passwd by renaming /etc/passwd+ over it, which
# a bind mount of the single file would refuse (EBUSY).
# `umount -l /run/netns`: the private copy of the host's mount table would otherwise hold
# every other node's netns alive after `ip netns del` (and with it that node's veth).
# BIN, the node's own /usr/local/bin (lab/gpu.py: the stand-in nvidia-smi of a GPU-shaped
# node, else empty).
NODE_INIT = (
    'hostname "$1" && mount --bind "$2" /etc && mount --bind "$3" "$4" && '
    'mount --bind "$6" /usr/local/bin && { umount -l /run/netns 2>/dev/null; '
    'exec /usr/sbin/sshd -D -e -f "$5"; }'
)


BIN = "usr-local-bin"  # in each node's directory, bound over /usr/local/bin (lab/gpu.py)


def node_argv(netns: str, hostname: str, node_dir: Path, home_src: Path, home: Path) -> list[str]:
    """NODE_DIR holds the node's etc/, sshd_config and BIN."""
    return [
        "ip",
        "netns",
        "exec",
        netns,
        "unshare",
        "--mount",
        "--uts",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        NODE_INIT,
        "sh",
        hostname,
        str(node_dir / "etc"),
        str(home_src),
        str(home),
        str(node_dir / "sshd_config"),
        str(node_dir / BIN),
    ]


def shells_text(current: str, shells: list[str] | tuple[str, ...]) -> str:
    """/etc/shells with SHELLS appended where missing; the node's own lines are kept."""
    have = {ln.strip() for ln in current.splitlines()}
    missing = [s for s in shells if s not in have]
    if not missing:
        return current
    sep = "" if not current or current.endswith("\n") else "\n"
    return current + sep + "".join(f"{s}\n" for s in missing)


def sudoers_text(user: str = LAB_USER, shells: list[str] | tuple[str, ...] = LOGIN_SHELLS) -> str:
    """The lab user's sudo rule: change its OWN login shell, to a listed shell, nothing else.
    Each shell is spelled out: a sudoers `*` in arguments matches across spaces, so
    `usermod -s * USER` would also allow `usermod -s /bin/sh -G sudo USER` or `-o -u 0`."""
    cmds = [f"/usr/sbin/usermod -s {s} {user}" for s in shells]
    cmds += [f"/usr/bin/chsh -s {s} {user}" for s in shells]
    return (
        f"# generated by nodeprep lab: {user} may change its own login shell, "
        "nothing else (as cloud images' default user, least privilege)\n"
        f"{user} ALL=(root) NOPASSWD: " + ", \\\n    ".join(cmds) + "\n"
    )


def sudoers_slurm_text(user: str = LAB_USER) -> str:
    """The lab user's rule for `invoke health --drain/--undrain` on the lab's Slurm (where
    only root and the SlurmUser may drain): scontrol with exactly nodeprep's drain (its own
    reason form, ops/health/drain.py) or a resume, nothing else (a sudoers regular
    expression, sudo >= 1.9.10; `*` would match any argument)."""
    return (
        f"# generated by nodeprep lab: {user} may drain a Slurm node with nodeprep's reason "
        "or resume one, nothing else (as a site lets its operators)\n"
        f"{user} ALL=(root) NOPASSWD: /usr/bin/scontrol ^update NodeName\\=[A-Za-z0-9._-]+ "
        "State\\=(DRAIN Reason\\=nodeprep\\: [A-Z0-9_\\,]+ [(]invoke health[)]|RESUME)$\n"
    )


def authorized_keys_text(current: str, pub: str) -> str:
    """CURRENT authorized_keys with the lab key appended when no line holds it. Nothing
    else is touched: roles keep their own managed blocks in this file."""
    blob = pub.split()[1]
    if any(blob in ln.split() for ln in current.splitlines()):
        return current
    sep = "" if not current or current.endswith("\n") else "\n"
    return current + sep + pub.strip() + "\n"


def pubkey(path: Path) -> paramiko.PKey:
    """The public key in an OpenSSH .pub file (what the lab pins for a node)."""
    kind, b64 = path.read_text().split()[:2]
    return paramiko.PKey.from_type_string(kind, base64.b64decode(b64))
