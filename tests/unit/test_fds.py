"""A run over many nodes raises its open-file soft limit as far as the hard limit lets it, and
keeps a node's stage log open only while the node works on that stage."""

import subprocess
import sys

from nodeprep.engine.results import RunLog


def test_soft_limit_raised_for_a_big_fleet_but_never_past_the_hard_limit():
    code = (
        "import resource; from nodeprep.engine.fds import ensure_open_files as e; "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 4096)); "
        "print(e(500), resource.getrlimit(resource.RLIMIT_NOFILE)); "
        "print(e(5000), resource.getrlimit(resource.RLIMIT_NOFILE)); "
        "print(e(10), resource.getrlimit(resource.RLIMIT_NOFILE))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines() == [
        "(2256, 2256) (2256, 4096)",  # 256 + 4 per node
        "(4096, 20256) (4096, 4096)",  # capped: the caller warns
        "(4096, 296) (4096, 4096)",
    ]  # never lowered


def test_stage_log_closed_then_appended(tmp_path):
    log = RunLog(tmp_path / "run")
    log.node_log("w0", "facts").write("one\n")
    log.close("w0", "facts")
    log.close("w0", "facts")  # twice is harmless
    assert ("w0", "facts") not in log._files
    log.node_log("w0", "facts").write("two\n")
    log.write_report({})
    assert (tmp_path / "run" / "w0" / "facts.log").read_text() == "one\ntwo\n"
