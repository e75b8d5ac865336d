"""Engine pieces that need no ssh: the shell wrapper, output sinks, result bookkeeping."""

import io
import json
import subprocess

from nodeprep.cli.display import Display
from nodeprep.engine import results as report
from nodeprep.engine import session


def test_posix_wrapper_runs_under_any_shell():
    script = "export A='x y'; echo \"$A\" $(echo sub)\necho line2\n"
    cmd = session.posix(script)
    assert set(cmd.split()[1]) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
    )
    out = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True).stdout
    assert out == "x y sub\nline2\n"


def test_line_sink_prefixes_complete_lines_and_logs_everything():
    log, shown = io.StringIO(), []
    sink = session._LineSink(log, shown.append)
    sink.write("a\nb")
    sink.write("c\n")
    sink.write("tail")
    sink.flush()  # Invoke flushes after every chunk: a partial line waits
    assert shown == ["a", "bc"]
    sink.finish()  # the command ended
    assert shown == ["a", "bc", "tail"]
    assert log.getvalue() == "a\nbc\ntail"


def test_node_result_status_ranks_and_counts():
    r = report.NodeResult("n1")
    r.add_step(report.StepResult("file.block", "ok"))
    r.add_step(report.StepResult("file.block", "changed"))
    assert (r.status, r.changed, r.failed) == ("changed", 1, 0)
    r.add_step(report.StepResult("pip.install", "failed", "exit 1"), "E: boom")
    assert (r.status, r.failed, r.stderr_tail) == ("failed", 1, "E: boom")
    r.mark("changed")  # a later, milder status never hides a failure
    assert r.status == "failed"
    u = report.NodeResult("n2")
    u.mark("unreachable", "no route")
    assert (u.status, u.failed) == ("unreachable", 0)


def test_report_shape_and_run_dir(tmp_path):
    log = report.RunLog.create(tmp_path, "facts")
    log.node_log("n1", "facts").write("hello\n")
    ok, bad = report.NodeResult("n1"), report.NodeResult("n2")
    bad.mark("failed", "x")
    rep = log.write_report({"n1": ok, "n2": bad}, inventory="lab")
    on_disk = json.loads((log.path / "report.json").read_text())
    assert on_disk == rep
    assert rep["nodes"]["n1"] == {"status": "ok", "changed": 0, "failed": 0}
    assert (rep["changed"], rep["failed"], rep["unreachable"]) == (0, 1, 0)
    assert (log.path / "n1" / "facts.log").read_text() == "hello\n"
    assert (tmp_path / "latest").resolve() == log.path.resolve()


def test_plain_display_lines():
    buf = io.StringIO()
    d = Display(buf)
    d.start(["worker-0", "w1"])
    d.status("w1", "facts", "running")
    d.status("w1", "facts", "failed", "boom")
    d.line("worker-0", "hello")
    assert buf.getvalue() == "w1        facts: failed  boom\n[worker-0] hello\n"


def test_closed_stdout_pipe_is_no_traceback():
    """`invoke verify-parity --json | head`: the reader leaves early; no traceback, and the
    command's own exit code (cli/__init__.py; every task: test_closed_stdout.py)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.path.insert(0, 'src'); from nodeprep import cli\n"
        "@cli.guarded\ndef big():\n    print('x' * 100 + '\\n' * 1, end='')\n"
        "    for _ in range(20000): print('y' * 100)\n"
        "sys.exit(big())\n"
    )
    # bash reads the pipeline from its arguments: "$0" is the interpreter, "$1" the program
    p = subprocess.run(
        [
            "/bin/bash",
            "-c",
            '"$0" -c "$1" | head -c 10; echo " rc=${PIPESTATUS[0]}"',
            sys.executable,
            code,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.stdout.endswith(" rc=0\n"), p.stdout
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr


def test_bad_verify_choices_are_one_line_input_errors(capsys):
    from nodeprep import cli
    from nodeprep.commands.options import VerifyOptions

    assert cli.verify_parity(VerifyOptions(inventory="local", via="bogus")) == 2
    assert capsys.readouterr().err.strip() == "error: --via 'bogus': expected auto, direct or slurm"
    assert cli.verify_parity(VerifyOptions(inventory="local", mesh="ring")) == 2
    assert capsys.readouterr().err.strip() == "error: --mesh 'ring': expected auto, full or head"


def test_runs_of_one_process_in_one_second_get_their_own_directories(tmp_path):
    logs = [report.RunLog.create(tmp_path / "runs", "verify") for _ in range(3)]
    paths = [lg.path for lg in logs]
    assert len(set(paths)) == 3 and all(p.is_dir() for p in paths)
    logs[0].node_log("worker-1", "probe").write("first run\n")
    logs[2].node_log("worker-1", "probe").write("third run\n")
    for lg in logs:
        lg.close("worker-1", "probe")
    assert (paths[0] / "worker-1" / "probe.log").read_text() == "first run\n"
    assert (paths[2] / "worker-1" / "probe.log").read_text() == "third run\n"
    assert (tmp_path / "runs" / "latest").resolve() == paths[2].resolve()
