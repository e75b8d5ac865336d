#!/bin/sh
# Set up everything nodeprep needs on this machine; safe to run again (does nothing then).
#   - Debian packages: openssh-server/client (the lab's sshd), pdsh and openmpi-bin (launchers),
#     iproute2 (the lab's namespaces), sudo/zsh/tcsh (each lab node's sudo rule and login shells),
#     iperf3 (`invoke bandwidth` measures with it where the nodes have it),
#     slurmd/slurmctld/slurm-client/munge (`lab.up --slurm`: a real Slurm for `--launcher srun`),
#     mmdebstrap/qemu-user-static (`lab.up --arch aarch64`: arm64 nodes under qemu-user; the
#     binfmt_misc registration is lab.up's, removed by lab.down) and arch-test (mmdebstrap runs
#     it for a foreign root and stops without it; it is only a Recommends, which this script
#     does not install), procps (ps/pgrep/kill: the stop of a run's processes, the facts),
#     openssl (the nodes' fast sha256 of wheels), python3/python3-venv (`python3 -m venv`
#     needs ensurepip: this .venv, and the venv role on the lab's nodes, which run this /usr),
#     podman/crun/uidmap (`lab.up --containers`: rootless Podman on the nodes, newuidmap for
#     its subordinate ids; lab/containers.py), skopeo (a registry `container_image` is read and
#     copied on the controller with it: ops/container/registry.py) and docker-registry (the
#     lab's own registry, `lab/registry.py`: Debian's build of the CNCF distribution registry),
#     environment-modules (Environment Modules 5.2, `lab.up --modules tcl`) and Lmod's
#     dependencies (lua5.3, lua-posix, lua-filesystem, lua-term, lua-json, tcl): Debian's lmod
#     and environment-modules packages conflict, so lmod's .deb is unpacked into LMOD_ROOT
#     (below), which `lab.up --modules lmod` binds into its nodes (lab/modules.py); patchelf
#     (the lab's cray-python module: a Python that runs only with its module's LD_LIBRARY_PATH),
#     git (a job's project is synced as git sees it: ops/sync/fileset.py asks git itself),
#     rsync (bench/sync_bench.py's peer)
#   - tests/unit/test_bootstrap.py fails when the code runs a program none of these (nor
#     Debian's Essential or required packages) install: add its package here
#   - .venv/ at the repo root with requirements/tool.txt + test.txt, and src/ on its path
#   - .venv-ansible/ with requirements/ansible.txt: the reference ansible-inventory that the
#     differential inventory test compares nodeprep against (test-only, kept out of .venv/)
set -eu
cd "$(dirname "$0")/.."

missing=""
for pkg in openssh-server openssh-client pdsh openmpi-bin iproute2 util-linux procps sudo zsh tcsh iperf3 \
           openssl python3 python3-venv slurmd slurmctld slurm-client munge mmdebstrap arch-test \
           qemu-user-static podman crun uidmap skopeo docker-registry \
           environment-modules lua5.3 lua-posix lua-filesystem lua-term lua-json tcl patchelf git rsync; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: missing Debian packages:$missing (run as root: apt-get install -y$missing)" >&2
        exit 2
    fi
    echo "installing:$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# Debian's lmod, unpacked (it conflicts with environment-modules; the lab binds it per node).
lmod_root=/var/lib/nodeprep/lmod
if [ ! -x "$lmod_root/usr/share/lmod/lmod/libexec/lmod" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: $lmod_root missing (run this script as root once)" >&2
        exit 2
    fi
    echo "unpacking Debian's lmod into $lmod_root"
    tmp=$(mktemp -d)
    (cd "$tmp" && { apt-get download -q -o APT::Sandbox::User=root lmod >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get download -q -o APT::Sandbox::User=root lmod >/dev/null; }; })
    rm -rf "$lmod_root.new"
    dpkg-deb -x "$tmp"/lmod_*.deb "$lmod_root.new"
    rm -rf "$tmp" "$lmod_root"
    mv "$lmod_root.new" "$lmod_root"
fi

python=${NODEPREP_PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
want=$(cat requirements/tool.txt requirements/test.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.requirements.sha256 2>/dev/null)" != "$want" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check \
        -r requirements/tool.txt -r requirements/test.txt
    echo "$want" > .venv/.requirements.sha256
fi
# src/ on the venv's path: `import nodeprep` works from tasks.py, tests and bench alike.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$(pwd)/src" > "$site/nodeprep-src.pth"
# Invoke never writes bytecode (its --write-pyc is off by default): compiled here, every `invoke`
# starts from .pyc files instead of compiling the sources it imports again each time.
.venv/bin/python -m compileall -q src tasks.py >/dev/null

# The reference Ansible, in a venv of its own (reinstalled only when ansible.txt changes).
if [ ! -x .venv-ansible/bin/python ]; then
    "$python" -m venv .venv-ansible
fi
want=$(sha256sum < requirements/ansible.txt | cut -d' ' -f1)
if [ ! -x .venv-ansible/bin/ansible-inventory ] || \
   [ "$(cat .venv-ansible/.requirements.sha256 2>/dev/null)" != "$want" ]; then
    .venv-ansible/bin/python -m pip install -q --disable-pip-version-check -r requirements/ansible.txt
    echo "$want" > .venv-ansible/.requirements.sha256
fi
