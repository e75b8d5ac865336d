"""The emulated lab cluster: one network namespace, one sshd and one private home per node.

Rootful (the real thing; README.md, section "The emulated lab"): lab NAME is a bridge
`np-NAME` on 10.X.0.0/16 and, per node, a netns `np-NAME-I` whose eth0 is 10.X.0.(10+I) (past
node 199: 10.X.1.10 and on; up to 512 nodes),
with no default route, so nothing inside can reach past the lab. Each node's sshd runs in
its own mount and UTS namespaces where the one lab user's home (/home/nodeprep, the same
path everywhere) and /etc are bind mounts of that node's own directories: same user and
paths, different contents (login shell, password, /etc/hosts), IPs and hostnames, as on a
real cluster. Every node's /etc (etc.py) offers bash, zsh and tcsh in /etc/shells and
lets the lab user `sudo -n usermod -s SHELL nodeprep` (its own shell, nothing else), as a
cloud image's default user could. Node operations (node_shell, stop/restart, host key,
password login, authorized_keys; silence, a small file system, a read-only home, a small
/dev/shm, a memlock limit, a slow link) are in nodes.py and exported here; gpu.py makes
GPU-shaped nodes (a stand-in nvidia-smi over a real machine's recording).
Without root, local.py gives a lower-fidelity stand-in (sshds on 127.0.0.1 ports).

The package's modules: config (names, addresses and generated text, pure), lab_inventory (the lab's
hosts.yml, pure), net (ip batches, namespaces, processes, keys, files), etc (each node's /etc copy),
host (the lab user, node files, starting and removing nodes), nodes (operations on one node), gpu
(GPU-shaped nodes), slurm (lab --slurm), foreign (lab --arch aarch64: nodes of another CPU
architecture under qemu-user), binfmt (the architectures foreign knows, qemu-user's registration),
leftovers (what a lab left behind, for doctor), bastion (lab --bastion: a jump host in front, the
only way in), containers (lab --containers: rootless Podman on the nodes), registry (a real
image registry at the lab's bridge, Debian's docker-registry), modules (lab --modules: Lmod or
Environment Modules and a module tree), images (the lab's test
image, built once with mmdebstrap and saved as a docker-archive), local (the non-root stand-in),
state (a rootful lab's directory and lab.json, what runs now, what one up() works on);
cluster puts them together as up, down and status.

Everything the lab keeps lives in <lab_root>/NAME (0700: nodes must not read each other's
files through it): the controller key, and per node its home, /etc, host key, sshd config,
pid file and log. Homes, /etc and host keys survive down/up (only purge removes them); host
keys are pinned in the project's known_hosts by up(), since the lab made them.
"""

from .cluster import down, status, up
from .config import LabInfo, LabNode, UpOptions
from .leftovers import leftovers
from .nodes import (
    disable_password,
    enable_password,
    limit_link,
    limit_memlock,
    limit_shm,
    limit_space,
    node_shell,
    readonly_home,
    regenerate_host_key,
    remove_authorized_key,
    restart_node,
    silence_node,
    stop_node,
)

__all__ = [
    "LabInfo",
    "LabNode",
    "UpOptions",
    "up",
    "down",
    "status",
    "leftovers",
    "node_shell",
    "stop_node",
    "restart_node",
    "regenerate_host_key",
    "enable_password",
    "disable_password",
    "remove_authorized_key",
    "silence_node",
    "limit_space",
    "readonly_home",
    "limit_shm",
    "limit_memlock",
    "limit_link",
]
