"""ops.stacks: faulthandler dumps of hung ranks parsed, and the rank at fault named.

The dumps in data/stacks are real faulthandler output of real processes (CPython 3.11; how
they were made: data/stacks/generate.py): a rank sleeping in its own loop with a helper thread,
ranks blocked in a library under site-packages and in threading.Event().wait(), two dumps
appended to one file after other text, a dump_traceback(all_threads=False), a stack deeper
than 100 frames, more than 100 threads. No torch dump: torch is not installed here."""

import random
from pathlib import Path

import pytest

from nodeprep.ops.train.tracebacks import (
    Frame,
    Thread,
    culprits,
    in_library,
    main_thread,
    parse,
    waits_in,
    where,
)

DATA = Path(__file__).resolve().parent / "data" / "stacks"
PYLIB = "/root/.pyenv/versions/3.11.7/lib/python3.11"
RANK_PY = (
    "/work/main/src/nodeprep/ops/payloads/rank.py"  # where the recordings ran it (its path then)
)


def text(name: str) -> str:
    return (DATA / name).read_text()


def main_frames(name: str, dump: int = -1) -> list[Frame]:
    return main_thread(parse(text(name))[dump]).frames


# ---------------------------------------------------------------- parsing real dumps


def test_a_rank_sleeping_in_its_own_loop_with_a_helper_thread():
    [dump] = parse(text("rank-sleep.stack"))
    helper, main = dump  # faulthandler writes the newest thread first
    assert (helper.ident, helper.current) == ("0x00007f05b12336c0", False)
    assert [str(f) for f in helper.frames] == [
        "ddp.py:8 in heartbeat",
        "threading.py:982 in run",
        "threading.py:1045 in _bootstrap_inner",
        "threading.py:1002 in _bootstrap",
    ]
    assert (main.ident, main.current) == ("0x00007f05b1fdeb80", True)
    assert main.frames[0] == Frame("/tmp/nodeprep-stacks/ddp/ddp.py", 20, "main")
    assert main.frames[2] == Frame("<frozen runpy>", 88, "_run_code")
    assert main.frames[-1] == Frame(RANK_PY, 171, "<module>")
    assert len(main.frames) == 7
    assert main_thread(dump) is main
    assert where(main.frames) == "ddp.py:20 in main"  # time.sleep leaves no Python frame
    assert where(helper.frames) == "ddp.py:8 in heartbeat"


def test_a_rank_blocked_inside_a_library_under_site_packages():
    [dump] = parse(text("rank-fakelib.stack"))
    assert [t.current for t in dump] == [False, True]
    main = main_thread(dump)
    assert main is dump[1]
    assert [f.func for f in main.frames[:5]] == ["wait", "wait", "_wait_work", "all_reduce", "step"]
    assert [in_library(f) for f in main.frames[:5]] == [True, True, True, True, False]
    assert where(main.frames) == "train.py:10 in step"
    assert waits_in(main.frames) == "fakelib (all_reduce)"
    # a thread that is all library code: its innermost frame
    assert where(dump[0].frames) == "thread.py:81 in _worker"
    assert waits_in(dump[0].frames) == "concurrent.futures.thread (_worker)"


def test_a_rank_waiting_on_a_threading_event():
    [[thread]] = parse(text("rank-event.stack"))
    assert thread.current and thread.frames[0] == Frame(f"{PYLIB}/threading.py", 327, "wait")
    assert where(thread.frames) == "peers.py:12 in wait_for_peers"
    assert waits_in(thread.frames) == "threading (wait)"
    assert waits_in([Frame("/x/peers.py", 12, "wait_for_peers")]) == ""


def test_two_dumps_appended_after_other_text():
    """faulthandler writes nothing between two dumps: the second header follows the first
    dump's last frame line directly."""
    raw = text("rank-appended.stack")
    assert raw.startswith("W0612 ") and raw.count("Current thread 0x00007f84a140fb80") == 2
    first, second = parse(raw)
    assert [len(first), len(second)] == [1, 1]
    assert first[0].ident == second[0].ident == "0x00007f84a140fb80"
    assert where(first[0].frames) == "evaluate.py:12 in load_data"
    assert where(second[0].frames) == "evaluate.py:18 in evaluate"
    assert [str(f) for f in second[0].frames] == [
        "evaluate.py:18 in evaluate",
        "evaluate.py:22 in <module>",
    ]


def test_a_single_thread_stack_dump():
    [[thread]] = parse(text("stack-single.stack"))
    assert (thread.ident, thread.current) == ("", True)
    assert [f.func for f in thread.frames] == ["report", "main", "<module>"]
    assert where(thread.frames) == "report.py:12 in report"


def test_a_stack_cut_at_100_frames_keeps_the_current_thread_as_main():
    [[thread]] = parse(text("rank-deep.stack"))
    assert text("rank-deep.stack").rstrip().endswith("\n  ...")
    assert len(thread.frames) == 100 and {f.func for f in thread.frames} == {"descend"}
    assert thread.frames[0].line == 13 and thread.frames[1].line == 14
    assert main_thread([Thread("0x1", False, [Frame("/x/a.py", 1, "f")]), thread]) is thread


def test_more_than_100_threads_leave_the_main_thread_out():
    """Threads are written newest first and cut at 100, so the main thread is the one lost;
    no thread is current or at <module>: the last is taken (the main thread is written last)."""
    [dump] = parse(text("rank-many-threads.stack"))
    assert text("rank-many-threads.stack").endswith("\n\n...\n")
    assert len(dump) == 100 and not any(t.current for t in dump)
    assert len({t.ident for t in dump}) == 100
    assert all([str(f) for f in t.frames] == ["threads.py:12 in idle"] for t in dump)
    assert main_thread(dump) is dump[-1]


def test_crlf_reads_the_same():
    names = sorted(p.name for p in DATA.glob("*.stack"))
    assert len(names) >= 5, f"no stack dumps under {DATA}"
    for name in names:
        raw = text(name)
        assert parse(raw.replace("\n", "\r\n")) == parse(raw), name


def test_a_dump_cut_anywhere_gives_a_prefix_of_the_whole():
    """A file read while faulthandler still writes: whatever is cut, no frame is made up."""
    for name in ("rank-sleep.stack", "rank-fakelib.stack", "rank-appended.stack"):
        raw = text(name)
        whole = [t for dump in parse(raw) for t in dump]
        for cut in range(len(raw) + 1):
            part = [t for dump in parse(raw[:cut]) for t in dump]
            assert len(part) <= len(whole)
            for got, full in zip(part, whole):
                assert got.ident == full.ident and got.frames == full.frames[: len(got.frames)], (
                    name,
                    cut,
                )


# ---------------------------------------------------------------- format corners

HEAD = "Thread 0x00007f0000000001 (most recent call first):\n"
CUR = "Current thread 0x00007f0000000002 (most recent call first):\n"
F1 = '  File "/home/u/ddp.py", line 143 in main\n'
F2 = '  File "/home/u/ddp.py", line 150 in <module>\n'


def test_markers_inside_a_block_are_skipped():
    dump = parse(HEAD + "  <no Python frame>\n\n" + CUR + "  Garbage-collecting\n" + F1 + F2)
    assert [[(t.ident[-1], t.current, len(t.frames)) for t in d] for d in dump] == [
        [("1", False, 0), ("2", True, 2)]
    ]
    assert main_thread(dump[0]).frames[0] == Frame("/home/u/ddp.py", 143, "main")


def test_unknown_parts_and_thread_names():
    [[t]] = parse(
        "Current thread 0x00007f0000000002 [python] (most recent call first):\n"
        '  File ???, line ??? in ???\n  File "a b\\xe9 "q".py", line 7 in f\n'
    )
    assert t.current and t.ident == "0x00007f0000000002"
    assert t.frames == [Frame("???", 0, "???"), Frame('a b\\xe9 "q".py', 7, "f")]
    assert str(t.frames[0]) == "???:? in ???"
    assert str(Frame("C:\\work\\ddp.py", 3, "main")) == "ddp.py:3 in main"


def test_what_splits_dumps():
    # other text between dumps; a header without the blank line; a thread seen twice
    assert [len(d) for d in parse("log\n" + HEAD + F1 + "oops\n" + F2 + HEAD + F1)] == [1, 1]
    assert [len(d) for d in parse(HEAD + F1 + CUR + F2)] == [1, 1]
    assert [len(d) for d in parse(HEAD + F1 + "\n" + HEAD + F1)] == [1, 1]
    assert [len(d) for d in parse(CUR + F1 + "\n" + CUR.replace("02", "03") + F1)] == [1, 1]
    assert [len(d) for d in parse(HEAD + F1 + "\n" + CUR + F2 + "\n...\n")] == [2]
    # a dump cut mid-line by a kill, then the next attempt's dump on the same line
    [first, second] = parse(HEAD + F1 + '  File "/usr/lib/pyth' + CUR + F2)
    assert first[0].frames == [Frame("/home/u/ddp.py", 143, "main")]
    assert second[0].current and second[0].frames == [Frame("/home/u/ddp.py", 150, "<module>")]


def test_cut_lines_and_odd_input_do_not_raise():
    assert parse("") == [] and parse("no dump here\n") == []
    assert parse(HEAD + F1[:-8]) == [
        [Thread("0x00007f0000000001", False, [])]
    ]  # line still being written
    assert parse(HEAD + '  File "/x.py", line ' + "9" * 5000 + " in f\n" + F1)[0][0].frames == [
        Frame("/home/u/ddp.py", 143, "main")
    ]
    assert parse((HEAD + F1).encode()) == parse(HEAD + F1)
    assert parse(None) == []


def test_main_thread_fallbacks():
    a, b = Thread("0x1", False, [Frame("/x/a.py", 1, "f")]), Thread("0x2", True, [])
    assert main_thread([a, b]) is b and main_thread([a]) is a and main_thread([]) is None


# ---------------------------------------------------------------- library or user code


@pytest.mark.parametrize(
    "path, lib",
    [
        (f"{PYLIB}/threading.py", True),
        ("/usr/lib/python3.11/threading.py", True),
        ("/usr/lib64/python3.9/queue.py", True),
        ("/opt/conda/lib/python3.13t/selectors.py", True),
        ("<frozen runpy>", True),
        ("/home/u/venv/lib/python3.11/site-packages/torch/autograd/graph.py", True),
        ("/usr/lib/python3/dist-packages/yaml/reader.py", True),
        ("/home/u/venv/lib/python3.11/site-packages/six.py", True),
        ("/home/u/DeepSpeed/deepspeed/runtime/engine.py", True),
        ("/home/u/pytorch/torch/distributed/distributed_c10d.py", True),
        ("/home/u/ddp.py", False),
        ("/home/u/torchtune_exp/train.py", False),
        ("/home/u/lib/python/train.py", False),
        ("<string>", False),
        (RANK_PY, False),
    ],
)
def test_in_library(path, lib):
    assert in_library(Frame(path, 1, "f")) is lib


def test_where_without_user_code_and_without_frames():
    lib = [Frame(f"{PYLIB}/threading.py", 327, "wait"), Frame(f"{PYLIB}/threading.py", 629, "wait")]
    assert where(lib) == "threading.py:327 in wait"
    assert where([]) == ""


# ---------------------------------------------------------------- the rank at fault

SITE = "/opt/conda/lib/python3.11/site-packages"
BACKWARD = [
    Frame(f"{SITE}/torch/autograd/graph.py", 768, "_engine_run_backward"),
    Frame(f"{SITE}/torch/autograd/__init__.py", 267, "backward"),
    Frame(f"{SITE}/torch/_tensor.py", 522, "backward"),
    Frame("/work/ddp.py", 120, "train_step"),
    Frame("/work/ddp.py", 160, "<module>"),
]
ALL_REDUCE = [
    Frame(f"{SITE}/torch/distributed/distributed_c10d.py", 2288, "all_reduce"),
    Frame(f"{SITE}/torch/distributed/c10d_logger.py", 83, "wrapper"),
    Frame("/work/ddp.py", 125, "train_step"),
    Frame("/work/ddp.py", 160, "<module>"),
]
USER = [Frame("/work/ddp.py", 143, "main"), Frame("/work/ddp.py", 160, "<module>")]


def test_the_call_a_waiting_rank_made():
    assert waits_in(BACKWARD) == "torch (backward)"
    assert waits_in(ALL_REDUCE) == "torch (all_reduce)"  # past the decorator's wrapper


def test_two_ranks_one_in_user_code():
    assert culprits({0: BACKWARD, 1: USER}) == (
        [1],
        "rank 1 is in ddp.py:143 in main while rank 0 waits in torch (backward)",
    )
    assert culprits({0: USER, 1: ALL_REDUCE})[0] == [0]


def test_four_ranks_one_in_user_code_the_others_in_torch():
    assert culprits({3: BACKWARD, 1: USER, 0: BACKWARD, 2: BACKWARD}) == (
        [1],
        "rank 1 is in ddp.py:143 in main while ranks 0,2,3 wait in torch (backward)",
    )


def test_four_real_ranks():
    ranks = {
        0: main_frames("rank-fakelib.stack"),
        1: main_frames("rank-sleep.stack"),
        2: main_frames("rank-fakelib.stack"),
        3: main_frames("rank-event.stack"),
    }
    assert culprits(ranks) == (
        [1],
        "rank 1 is in ddp.py:20 in main while ranks 0,2,3 wait in "
        "fakelib (all_reduce), threading (wait)",
    )


def test_several_ranks_in_user_code():
    other = [Frame("/work/data.py", 40, "load")] + USER[1:]
    assert culprits({0: USER, 1: other, 2: ALL_REDUCE, 3: ALL_REDUCE}) == (
        [0, 1],
        "ranks 0,1 are in user code (ddp.py:143 in main; data.py:40 in load) "
        "while ranks 2,3 wait in torch (all_reduce)",
    )


def test_the_odd_position_out():
    late, early = main_frames("rank-appended.stack", -1), main_frames("rank-appended.stack", 0)
    assert culprits({0: late, 1: late, 2: early, 3: late}) == (
        [2],
        "rank 2 at evaluate.py:12 in load_data while the others are at evaluate.py:18 in evaluate",
    )
    # every rank waits in a library, one at another call
    assert culprits({0: ALL_REDUCE, 1: BACKWARD, 2: ALL_REDUCE}) == (
        [1],
        "rank 1 at ddp.py:120 in train_step while the others are at ddp.py:125 in train_step",
    )


def test_no_single_group_stands_out():
    ranks, reason = culprits({0: ALL_REDUCE, 1: ALL_REDUCE, 2: BACKWARD, 3: BACKWARD})
    assert ranks == [] and reason == (
        "no rank stands out: ranks 0,1 at ddp.py:125 in train_step; "
        "ranks 2,3 at ddp.py:120 in train_step"
    )


def test_a_rank_without_a_stack():
    assert culprits({0: USER, 1: USER, 2: None, 3: USER}) == ([2], "no stack from rank 2")
    assert culprits({0: None, 1: USER, 2: None}) == ([0, 2], "no stack from ranks 0,2")


def test_every_rank_at_the_same_place():
    sleep = main_frames("rank-sleep.stack")
    assert culprits({r: sleep for r in range(4)}) == ([], "every rank is at ddp.py:20 in main")
    assert culprits({0: ALL_REDUCE, 1: ALL_REDUCE}) == (
        [],
        "every rank is at ddp.py:125 in train_step",
    )
    assert culprits({0: None, 1: None}) == ([], "no stacks") and culprits({}) == ([], "no stacks")


# ---------------------------------------------------------------- fuzz


def _mutate(rng: random.Random, raw: str) -> str:
    lines = raw.splitlines(keepends=True)
    for _ in range(rng.randint(1, 6)):
        op, i = rng.randrange(7), rng.randrange(len(lines) + 1)
        if op == 0 and lines:
            del lines[min(i, len(lines) - 1)]
        elif op == 1:
            lines.insert(i, rng.choice(lines or ["x\n"]))
        elif op == 2 and lines:
            s = lines[min(i, len(lines) - 1)]
            k = rng.randrange(len(s) + 1)
            lines[min(i, len(lines) - 1)] = (
                s[:k] + rng.choice(['"', "\r", "\x00", "\n", "(", "9" * 30, "]", "", "é"]) + s[k:]
            )
        elif op == 3:
            lines.insert(i, "".join(chr(rng.randrange(1, 0x250)) for _ in range(rng.randrange(40))))
        elif op == 4 and lines:
            lines[min(i, len(lines) - 1)] = lines[min(i, len(lines) - 1)][: rng.randrange(60)]
        elif op == 5:
            lines.insert(
                i,
                rng.choice(
                    [HEAD, CUR, F1, "\n", "...\n", "  ...\n", "Stack (most recent call first):\n"]
                ),
            )
        else:
            rng.shuffle(lines)
    return "".join(lines)


def test_parse_never_raises_on_mutated_dumps():
    rng = random.Random(20240612)
    corpus = [text(p.name) for p in sorted(DATA.glob("*.stack"))]
    seen_frames = 0
    for case in range(3000):
        raw = (
            _mutate(rng, rng.choice(corpus))
            if case % 10
            else "".join(chr(rng.randrange(0, 0x3000)) for _ in range(rng.randrange(300)))
        )
        dumps = parse(raw)
        assert all(
            isinstance(t, Thread) and all(isinstance(f, Frame) and f.line >= 0 for f in t.frames)
            for d in dumps
            for t in d
        )
        assert all(dumps)  # a dump has at least its first thread
        stacks = {r: (main_thread(d).frames if d else None) for r, d in enumerate(dumps[:8])}
        ranks, reason = culprits(stacks)
        assert set(ranks) <= set(stacks) and "\n" not in reason and reason
        seen_frames += sum(len(t.frames) for d in dumps for t in d)
    assert seen_frames > 10000  # the mutations kept most dumps readable: the parser was exercised
