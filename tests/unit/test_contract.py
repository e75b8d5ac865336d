"""The launch contract's decisions (ops/train/contract.py): programs each launcher needs on the
non-interactive PATH, ~/.deepspeed_env as DeepSpeed reads it, variables the runner drops."""

from __future__ import annotations

import os
import subprocess

from nodeprep.engine import facts as factmod
from nodeprep.ops.train import contract


def test_programs_fact_parses_what_the_shell_found():
    out = subprocess.run(
        ["sh", "-c", factmod.PROGRAMS.command(None)], capture_output=True, text=True
    ).stdout
    found = factmod.PROGRAMS.parse(out, 0)
    assert found <= set(factmod.jobs.PROGRAM_NAMES)
    assert factmod.PROGRAMS.parse("have pdsh\nhave orted\nnoise\n", 0) == {"pdsh", "orted"}


def test_each_launcher_names_the_missing_program_and_the_node():
    have = {"w0": {"pdsh"}, "w1": set()}
    assert contract.missing_programs("deepspeed", "pdsh", have, "w0") == []
    miss = contract.missing_programs("deepspeed", "openmpi", have, "w0")
    assert [m.split(":")[0] for m in miss] == ["w0", "w0", "w1"]
    assert any(
        m.startswith("w0: `mpirun` is not on the PATH a non-interactive ssh login gets")
        for m in miss
    )
    assert any("`orted`" in m and m.startswith("w1:") for m in miss)
    assert contract.missing_programs("torchrun", "pdsh", have, "w0") == []
    assert contract.missing_programs("srun", "pdsh", have, "w0")[0].startswith("w0: `srun`")


def test_deepspeed_env_lines_deepspeed_would_crash_on_and_dropped_exports():
    ds = {"exists": True, "content": "NCCL_SOCKET_IFNAME==eth0\n\nPATH=/v/bin:/usr/bin\n"}
    env = {
        "exists": True,
        "content": "# BEGIN nodeprep nccl\nexport NCCL_SOCKET_IFNAME==eth0\n"
        'export FI_PROVIDER=efa\nexport PATH=/v/bin:"$PATH"\n',
    }
    problems = contract.deepspeed_env_problems("w0", ds, env, "pdsh", gpus=0)
    assert any(p.startswith("w0:~/.deepspeed_env:2: ") for p in problems), (
        problems
    )  # the blank line
    dropped = [p for p in problems if "FI_PROVIDER" in p]
    assert len(dropped) == 1 and "add it to deepspeed_env in the inventory" in dropped[0]
    assert not any("NCCL_SOCKET_IFNAME is set" in p for p in problems)  # it is in the file
    assert contract.deepspeed_env_problems("w0", {"exists": False}, None, "pdsh", 0) == []


def test_env_exports_reads_export_lines_only():
    assert contract.env_exports("export A=1\n# export B=2\nC=3\n  export D='x y'\n") == {
        "A": "1",
        "D": "'x y'",
    }


def test_listen_and_connect_scripts_really_meet(tmp_path):
    """The listener takes as many connections as there are other machines, then lets the port
    go by itself (no round trip to stop it before the launch binds the port)."""
    import socket
    import time

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    (tmp_path / ".nodeprep").mkdir()
    r = subprocess.run(
        ["sh", "-c", contract.listen_script("python3", port, accepts=2, seconds=10)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert "ready" in r.stdout
    pid = int(next(ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("pid ")))

    def connect() -> str:
        return subprocess.run(
            ["sh", "-c", contract.connect_script("python3", "127.0.0.1", port)],
            capture_output=True,
            text=True,
        ).stdout.strip()

    assert connect() == "ok"
    time.sleep(0.3)
    assert os.path.exists(f"/proc/{pid}")  # one of two: still listening
    assert connect() == "ok"
    for _ in range(50):  # the second was the last it waited for: it ends
        if not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the listener still runs after every node connected")
    assert connect().startswith("fail")  # the port is free for the launch
