"""engine/runners: the runners nodeprep's commands run under keep multibyte characters whole
across reads, read big chunks, skip the stock runners' quadratic re-join of the output when
there are no watchers, and still answer watchers when a caller gives some."""

from invoke import Config, Context, Responder

from nodeprep.engine import runners


def chunks_of(data: bytes, size: int):
    parts = [data[i : i + size] for i in range(0, len(data), size)] + [b""]
    return lambda _n: parts.pop(0)


def decoded(data: bytes, size: int) -> str:
    r = runners.Local(Context())
    r.encoding = "utf-8"
    return "".join(r.read_proc_output(chunks_of(data, size)))


def test_a_character_split_across_reads_stays_whole():
    text = "a" + "é€😀" * 50 + "ü"
    for size in (1, 2, 3, 5, 7):
        assert decoded(text.encode(), size) == text


def test_bytes_that_are_not_utf8_become_one_replacement_each_as_before():
    assert decoded(b"ok \xff\xfe end", 3) == "ok \ufffd\ufffd end"
    assert decoded(b"cut \xc3", 2) == "cut \ufffd"  # a sequence the stream never finished


def test_no_watchers_no_join(monkeypatch):
    r = runners.Local(Context())
    r.watchers = []
    joined = []
    monkeypatch.setattr(runners._Local, "respond", lambda self, b: joined.append(b))
    r.respond(["x"] * 10)
    assert joined == []
    r.watchers = [object()]
    r.respond(["x"])
    assert joined == [["x"]]


def test_a_real_command_through_the_lean_local_runner():
    ctx = Context(Config(overrides={"runners": dict(runners.RUNNERS)}))
    big = 200_000
    r = ctx.run(
        f"head -c {big} /dev/zero | tr '\\0' a; printf 'é'; printf 'ü' >&2",
        hide=True,
        in_stream=False,
    )
    assert r.stdout == "a" * big + "é" and r.stderr == "ü"
    assert runners.Local.read_chunk_size == 64 * 1024


def test_watchers_still_answer_prompts():
    ctx = Context(Config(overrides={"runners": dict(runners.RUNNERS)}))
    r = ctx.run(
        "printf 'name? '; read x; echo \"got $x\"",
        hide=True,
        in_stream=False,
        watchers=[Responder(pattern=r"name\? ", response="ada\n")],
        pty=False,
    )
    assert r.stdout.endswith("got ada\n")
