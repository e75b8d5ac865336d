"""The emulated lab for integration tests: lab "t", 3 nodes, on its own subnet, with its
known_hosts, lab directory and inventory in a temporary directory (the project's own
known_hosts and labs are never touched). Under several pytest-xdist workers each worker has
its own lab: "t" on 10.199.0.0/16 for the first, "t1" on 10.189, "t2" on 10.188, ...

Fixtures:
  lab_settings  Settings whose state_dir (known_hosts) and lab_root are temporary
  lab           the session's LabInfo (3 nodes); kept current by lab_up()
  lab_up        lab_up(nodes=3, log=...) -> LabInfo: converge the lab to N nodes (restarts
                dead nodes too); a test that changes the lab must put it back to 3
  lab_ssh       lab_ssh(node, command) -> CompletedProcess through the OpenSSH client
  lab_ssh_argv  lab_ssh_argv(node, command) -> that OpenSSH command line (node: LabNode|index)
  site          the lab provisioned ONCE per worker with every role, one controller key and
                ssh config for the whole run: its value is those --set overrides
  provisioned   per module: the site applied again (a no-op unless an earlier module changed
                a node, which it then repairs): what train tests start from; same value
  own_settings  own_settings(base, **kw) -> Settings of a module's own lab (its state and lab
                directories under BASE) whose controller wheelhouse is the run's: the real
                stack is resolved, and deepspeed built, once per run
  site_copy     site_copy(home): the site's provisioned Python stack (venv, wheelhouse) copied
                into a node's HOME: a provisioned node without provisioning it cold again
  lab_restore   for tests that change nodes (login shell, password, authorized_keys): yields
                reset(index); after the test every node is put back as the lab makes it
                (reset_node on each, after lab_up() restarts dead nodes and the lab key)

The lab needs root and sshd; CI has both, so without them these tests FAIL (not skip).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nodeprep import lab as labmod
from nodeprep.errors import NodeprepError
from nodeprep.lab import net as lab_net
from nodeprep.lab.config import LabInfo, LabNode
from nodeprep.settings import Settings

LAB_NAME = "t"
LAB_SUBNET = 199  # 10.199.0.0/16: apart from "local" (200) and derived names (201-250)
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
if _WORKER:  # 10.189, 10.188, ...: below the fixed subnets of other modules (194-199)
    LAB_NAME, LAB_SUBNET = f"t{_WORKER}", 190 - _WORKER
# NODEPREP_TEST_LAB=NAME:SUBNET runs a tier on a lab of its own beside another run's lab "t"
# (a developer's second terminal); modules that name lab "t" themselves still need the default.
if os.environ.get("NODEPREP_TEST_LAB"):
    LAB_NAME, _subnet = os.environ["NODEPREP_TEST_LAB"].split(":")
    LAB_SUBNET = int(_subnet)
LAB_NODES = 3


@pytest.fixture(scope="session", autouse=True)
def _lab_prerequisites():
    if os.geteuid() != 0:
        pytest.fail(
            "integration tests need root: the lab uses network and mount namespaces "
            "(run them as root, as CI does)",
            pytrace=False,
        )
    try:
        lab_net.require_tools()
    except NodeprepError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="session")
def lab_settings(tmp_path_factory) -> Settings:
    base = tmp_path_factory.mktemp("lab")
    # lock_wait: a lock a test leaks fails the next test in two minutes, not fifteen
    return Settings(state_dir=str(base / "state"), lab_root=str(base / "labs"), lock_wait=120)


@pytest.fixture(scope="session")
def own_settings(lab_settings):
    shared = lab_settings.state / "wheelhouse"

    def make(base: Path, **kw) -> Settings:
        settings = Settings(state_dir=str(base / "state"), lab_root=str(base / "labs"), **kw)
        shared.mkdir(parents=True, exist_ok=True)
        settings.state.mkdir(parents=True, exist_ok=True)
        (settings.state / "wheelhouse").symlink_to(shared, target_is_directory=True)
        return settings

    return make


@pytest.fixture(scope="session")
def lab_inventory_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("inventory")


@pytest.fixture(scope="session")
def _lab_session(lab_settings, lab_inventory_dir):
    # A lab "t" left running by a killed earlier session would hold the addresses.
    labmod.down(LAB_NAME, lab_settings, log=lambda msg: None)
    holder: dict[str, LabInfo] = {}

    def lab_up(
        nodes: int = LAB_NODES,
        log=lambda msg: None,
        slurm: bool | None = None,
        gpu_records: tuple[str, ...] | None = None,
    ) -> LabInfo:
        options = labmod.UpOptions(
            inventory_dir=lab_inventory_dir, subnet=LAB_SUBNET, slurm=slurm, gpu_records=gpu_records
        )
        info = labmod.up(nodes, LAB_NAME, lab_settings, options, log=log)
        if "info" in holder:  # keep the session's `lab` object current
            vars(holder["info"]).update(vars(info))
        else:
            holder["info"] = info
        return info

    lab_up()
    yield holder, lab_up
    labmod.down(LAB_NAME, lab_settings, log=lambda msg: None)


@pytest.fixture(scope="session")
def lab(_lab_session) -> LabInfo:
    return _lab_session[0]["info"]


@pytest.fixture(scope="session")
def lab_up(_lab_session):
    return _lab_session[1]


def reset_node(info: LabInfo, index: int) -> None:
    """Node INDEX as the lab makes it: login shell /bin/bash, no password login (its sshd
    restarted only if it took passwords). The lab key comes back with lab_up()."""
    node_dir = info.nodes[index].home.parent
    entry = [ln.split(":") for ln in (node_dir / "etc" / "passwd").read_text().splitlines()]
    if any(f[0] == info.user and f[-1] != "/bin/bash" for f in entry):
        # --prefix: that node's /etc only, whether or not the node runs.
        subprocess.run(
            ["usermod", "--prefix", str(node_dir), "--shell", "/bin/bash", info.user],
            check=True,
            capture_output=True,
        )
    labmod.disable_password(info, index)


@pytest.fixture
def lab_restore(lab, lab_up):
    yield lambda index: reset_node(lab, index)
    lab_up()
    for node in lab.nodes:
        reset_node(lab, node.index)


def ssh_argv(info: LabInfo, node: LabNode, settings: Settings, command: str) -> list[str]:
    """The OpenSSH command line for NODE: pinned host keys only, never a prompt."""
    return [
        "ssh",
        "-F",
        "none",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={settings.known_hosts}",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "ConnectTimeout=5",
        "-i",
        str(info.key),
        "-p",
        str(node.port),
        f"{info.user}@{node.address}",
        command,
    ]


@pytest.fixture
def lab_ssh_argv(lab, lab_settings):
    def argv(node: LabNode | int, command: str) -> list[str]:
        return ssh_argv(
            lab, lab.nodes[node] if isinstance(node, int) else node, lab_settings, command
        )

    return argv


@pytest.fixture
def lab_ssh(lab_ssh_argv):
    def run(node: LabNode | int, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            lab_ssh_argv(node, command),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    return run


def _provision_site(lab, settings, sets) -> None:
    from nodeprep import cli as api
    from nodeprep.commands.options import ProvisionOptions

    code = api.provision(ProvisionOptions(inventory=str(lab.inventory), sets=sets), settings)
    assert code == 0


@pytest.fixture(scope="session")
def site(lab, lab_settings, lab_up, tmp_path_factory):
    """The lab provisioned with every role, once per worker: one controller key and ssh config
    (kept apart from the real ones) for every module. Its value: those --set overrides (a later
    provision with them changes nothing)."""
    lab_up()
    ctl = tmp_path_factory.mktemp("ctl")
    sets = (f"controller_key={ctl}/id", f"controller_ssh_config={ctl}/config")
    _provision_site(lab, lab_settings, sets)
    return sets


@pytest.fixture(scope="module")
def provisioned(site, lab, lab_settings, lab_up):
    """The site as each module starts: applied again with the same settings (nothing to change
    unless an earlier module changed a node: then it is put back), whatever ran before."""
    lab_up()
    _provision_site(lab, lab_settings, site)
    return site


@pytest.fixture(scope="session")
def site_copy(site, lab):
    """copy(home): ~/.nodeprep/venv and ~/.nodeprep/wheelhouse of the site's worker-0 into
    HOME (a lab node's home on this host; every lab node sees its home as /home/nodeprep, so
    the venv's paths hold), owned as HOME is (an arm64 root's user may have another uid). The
    next provision there verifies them (and changes what differs) instead of installing the
    stack cold."""
    source = lab.nodes[0].home / ".nodeprep"

    def copy(home: Path) -> None:
        (home / ".nodeprep").mkdir(exist_ok=True)
        for part in ("venv", "wheelhouse"):
            subprocess.run(
                ["cp", "-aT", str(source / part), str(home / ".nodeprep" / part)], check=True
            )
        subprocess.run(
            ["chown", "-R", "--reference", str(home), str(home / ".nodeprep")], check=True
        )

    return copy


@pytest.fixture(scope="module")
def real_slurm(provisioned, lab_up):
    """The provisioned lab with its real Slurm (slurmctld + munged on the host, slurmd in each
    node) for a whole module; Slurm stopped again after it."""
    from nodeprep.lab import slurm as lab_slurm

    if not lab_slurm.cgroup_controllers():
        pytest.skip(
            "this host mounts no cgroup v1 controllers: "
            "Slurm 22.05's slurmd cannot start in the lab"
        )
    lab_up(slurm=True)
    yield
    lab_up(slurm=False)
