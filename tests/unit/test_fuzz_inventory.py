"""Fuzz (issue 16, "no input crashes"): valid inventories of every format, mutated byte by
byte and line by line, either load or fail with ONE InputError line (exit 2) naming the file;
what loads also renders as `invoke inventory` renders it (table, graph, --host, --json).

The seeds are the valid examples of tests/inventories/, inventory/ and the hostfile tests.
The runs are derandomized (the same examples on every run, no example database), so CI is
reproducible; NODEPREP_FUZZ=N runs N random examples per format instead, to look further.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

import nodeprep.cli as cli
from nodeprep.commands import inventory as inventory_cmd
from nodeprep.commands.options import InventoryOptions
from nodeprep.errors import InputError
from nodeprep.inventory import model
from nodeprep.inventory.schema import load_schema
from nodeprep.settings import Settings, find_project

ROOT = find_project(Path(__file__).parent)
SCHEMA = load_schema([ROOT])          # what load(spec, root=ROOT) reads, read once
SETTINGS = Settings(project_root=str(ROOT))
CORPUS = ROOT / "tests" / "inventories"
CANARY = Path(tempfile.gettempdir()) / "nodeprep-fuzz-canary"
_EXPLORE = int(os.environ.get("NODEPREP_FUZZ", "0"))


def fuzz(examples: int):
    return settings(max_examples=_EXPLORE or examples, derandomize=not _EXPLORE,
                    database=None, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# -- seeds --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Seed:
    files: dict[str, bytes]      # relative path -> content
    spec: str                    # the --inventory value; {dir} is where the files are written
    env: str = ""                # "home": HOME is {dir} (sshconfig:)

    @property
    def targets(self) -> list[str]:
        """The files a mutation may change (every inventory or vars file)."""
        return sorted(name for name in self.files if not name.endswith((".md", ".txt")))


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def _corpus(pattern: str, spec: str = "{dir}/{name}") -> list[Seed]:
    return [Seed({p.name: p.read_bytes()}, spec.format(dir="{dir}", name=p.name))
            for p in sorted(CORPUS.glob(pattern))]


def _text(text: str, name: str, *specs: str) -> list[Seed]:
    return [Seed({name: text.encode()}, spec.format(dir="{dir}", name=name)) for spec in specs]


_DEEPSPEED = "# DeepSpeed hostfile\nworker-0 slots=8\n\nworker-1 slots=4   # smaller node\n"
_OPENMPI = ("# the cluster\nnode01 slots=2 max_slots=4\nnode02   # no slots: the GPU count\n"
            "node03 max-slots=8\nnode04 count=6\nbob@node05 cpu=2 port=2222\n")
_SSH = ("Host gpu1 gpu2\n  HostName 10.0.0.%h\n  User ops\nHost gpu1\n  Port 2201\n"
        "Host login\n  HostName login.example.com\n  ProxyJump bastion\n"
        "Host *.internal !skip\n  User nobody\nHost *\n  IdentityFile ~/.ssh/id_cluster\n")
SEEDS: dict[str, list[Seed]] = {
    "native-yaml": [Seed({"hosts.yml": (ROOT / "inventory" / n / "hosts.yml").read_bytes()}, spec)
                    for n in ("lab", "local")
                    for spec in ("{dir}/hosts.yml", "yaml:{dir}/hosts.yml")]
    + _text("hosts:\n  worker-[0-3]: {user: lab}\n"
            "  gpu01: {address: 10.0.0.5, port: 2222, slots: 8}\n"
            "groups:\n  gpus: {hosts: [gpu01, \"worker-[2-3]\"], vars: {cpu_only: false}}\n",
            "hosts", "{dir}/{name}", "yaml:{dir}/{name}"),
    "ansible-yaml": _corpus("yaml_*.yml") + _corpus("json_inventory.json"),
    "ansible-ini": _corpus("ini_*.ini") + _corpus("ini_[dhk]*.ini", "ini:{dir}/{name}")
    + [Seed({"inventory": s.files[n]}, "{dir}/inventory") for s in _corpus("ini_[cgi]*.ini")
       for n in s.files],
    "vars-dir": [Seed(_tree(ROOT / "inventory" / "lab"), "{dir}")]
    + [Seed(_tree(p), "{dir}") for p in sorted(CORPUS.glob("dir_*"))],
    "deepspeed-hostfile": _text(_DEEPSPEED, "hostfile", "{dir}/{name}", "hostfile:{dir}/{name}")
    + _text("worker-0 slots=8\nworker-1 slots=8\n", "hosts", "{dir}/{name}"),
    "openmpi-hostfile": _text(_OPENMPI, "hostfile", "{dir}/{name}", "hostfile:{dir}/{name}"),
    "mpich-hostfile": _text("n1:4\nn2:2\nn3\n", "hostfile", "hostfile:{dir}/{name}"),
    "nodefile": _text("gpu02\ngpu01\ngpu02\ngpu02\n", "nodefile", "{dir}/{name}",
                      "pbs:{dir}/{name}", "nodefile:{dir}/{name}"),
    "sshconfig": [Seed({".ssh/config": _SSH.encode()}, spec, env="home")
                  for spec in ("sshconfig:", "sshconfig:gpu*")],
    "slurm": [Seed({"": text.encode()}, "slurm:") for text in
              ("gpu[01-02,05],cpu1", "rack[1-2]-node[01-02]", "a[1-2]-ib,b[3,5]",
               "login1,gpu[01-04],gpu10,cpu[1-2]")],
}


# -- mutations ----------------------------------------------------------------------------------

# valid UTF-8: shell and ssh metacharacters, quotes, YAML/INI/hostfile syntax, big numbers
# and ranges, deep nesting, a very long line
TOKENS = [
    "\r", "\r\n", "\n", "\t", "\x00", "\x1b[31m", "\x7f", "\ufeff", "\u00e9\u65e5\u672c",
    "\u2028", "\U0001f600", f"$(touch {CANARY})", f"`touch {CANARY}`", f"; touch {CANARY}",
    "-oProxyCommand=x", "%h", "%%", "'", '"', "\\", "#", ";", "=", ":", ": ", "- ", "[", "]",
    "{", "}", ",", "&a ", "*a", "<<: *a", "!!python/object/apply:os.system", "!!binary", "!!int",
    "!!set", "? ", "~", "~nosuchuser/id", "null", ".inf", "1e400", "0x1F", "9" * 5000, "-1", "0",
    "[1:", "[0-99999999]", "[0:99999999]", "[1-9999]", "[a:Z]", "[01:1000]", "[" * 2000,
    "{" * 2000, "- " * 300, "::1", "[::1]:22", "fe80::1%eth0", "user@", "slots=", "max_slots=-1",
    "port=99999", "ansible_host=", "ansible_port=x", "x" * 10000,
]
# whole lines, of every format
LINES = [
    "[g:vars]", "[g:children]", "[all:vars]", "[g]", "[ungrouped]", "g", "x=1", "a b=c",
    "node1 slots=2", "node1:4", "n1 port=22", "Host x", "Host *", "Match all", "Match host x",
    'Match host "x', "Match canonical all", "Match final x", "HostName %h.x", "Port x",
    "IdentityFile ~nosuchuser/id", "CanonicalizeHostname yes", "CanonicalizeMaxDots x",
    "hosts:", "vars:", "children:", "groups:", "all:", "  hosts:", "    x:", "  vars:", "- x",
    "---", "...", "%YAML 1.1", "%TAG ! tag:x,2000:", "a: &a [*a]", "a: &a {b: *a}", "<<: [*a]",
    "key: ~nosuchuser/id", "slots: 99999999999999999999999", "port: 0x16", "user: null",
    "x: !!python/name:os.system", "? [a]\n: b", '"a\\nb": c', "  python: [1, {2: 3}]",
]
_BYTES = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xef\xbb\xbf", b"\x80", b"\xe2\x80"]


def _pos(draw, data: bytes) -> int:
    return draw(st.integers(0, len(data)))


def _token(draw) -> bytes:
    """Mostly valid text: most inputs must get past the decoder to find anything."""
    kind = draw(st.integers(0, 9))
    if kind < 8:
        return draw(st.sampled_from(TOKENS)).encode("utf-8", "surrogatepass")
    return draw(st.sampled_from(_BYTES) if kind == 8 else st.binary(min_size=1, max_size=8))


def _flip(draw, data: bytes) -> bytes:
    if not data:
        return data
    at = draw(st.integers(0, len(data) - 1))
    mask = draw(st.integers(1, 127) if draw(st.integers(0, 4)) else st.integers(128, 255))
    return data[:at] + bytes([data[at] ^ mask]) + data[at + 1:]


def _insert(draw, data: bytes) -> bytes:
    at = _pos(draw, data)
    return data[:at] + _token(draw) + data[at:]


def _delete(draw, data: bytes) -> bytes:
    at = _pos(draw, data)
    return data[:at] + data[at + draw(st.integers(1, 40)):]


def _replace(draw, data: bytes) -> bytes:
    at = _pos(draw, data)
    return data[:at] + _token(draw) + data[at + draw(st.integers(1, 12)):]


def _lines_op(draw, data: bytes) -> bytes:
    """Duplicate, delete, swap or re-indent a line, or add a hostile value at its end."""
    lines = data.split(b"\n")
    i, j = (draw(st.integers(0, len(lines) - 1)) for _ in range(2))
    kind = draw(st.sampled_from(["dup", "del", "swap", "indent", "dedent", "value", "split",
                                 "line", "line"]))
    if kind == "line":
        lines.insert(j, draw(st.sampled_from(LINES)).encode())
    elif kind == "dup":
        lines.insert(j, lines[i])
    elif kind == "del":
        del lines[i]
    elif kind == "swap":
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == "indent":
        lines[i] = draw(st.sampled_from([b" ", b"  ", b"    ", b"\t"])) + lines[i]
    elif kind == "dedent":
        lines[i] = lines[i].lstrip()
    elif kind == "value":
        lines[i] = lines[i] + draw(st.sampled_from([b" ", b"=", b": ", b""])) + _token(draw)
    else:                          # a newline inside a value
        at = draw(st.integers(0, len(lines[i])))
        lines[i] = lines[i][:at] + b"\n" + lines[i][at:]
    return b"\n".join(lines)


_VALUE = re.compile(rb"(=|: |\s)([^\s#]+)")


def _revalue(draw, data: bytes) -> bytes:
    """A value (after `=`, `: ` or a space) or a host name (a line's first word) replaced."""
    spots = [m.span(2) for m in _VALUE.finditer(data)] + [
        m.span() for m in re.finditer(rb"^\s*[^\s#=:]+", data, re.M)]
    if not spots:
        return data
    start, end = draw(st.sampled_from(spots))
    keep = draw(st.sampled_from([b"", data[start:end]]))
    return data[:start] + keep + _token(draw) + data[end:]


def _encoding(draw, data: bytes) -> bytes:
    kind = draw(st.sampled_from(["bom", "crlf", "cr", "utf16", "latin1", "truncate"]))
    if kind == "bom":
        return b"\xef\xbb\xbf" + data
    if kind in ("crlf", "cr"):
        return data.replace(b"\n", b"\r\n" if kind == "crlf" else b"\r")
    if kind == "utf16":
        return data.decode("utf-8", "replace").encode("utf-16")
    if kind == "latin1":
        return data.decode("utf-8", "replace").encode("latin-1", "replace").replace(b"?", b"\xe9")
    return data[:_pos(draw, data)]


_OPS = [_flip, _insert, _delete, _replace, _lines_op, _lines_op, _revalue, _revalue, _encoding]


@st.composite
def mutated(draw, seeds: list[Seed]) -> tuple[Seed, str, bytes]:
    """A seed, the file of it that changes, and that file's new content (1 to 3 mutations)."""
    seed = draw(st.sampled_from(seeds))
    target = draw(st.sampled_from(seed.targets))
    data = seed.files[target]
    for _ in range(draw(st.integers(1, 3))):
        data = draw(st.sampled_from(_OPS))(draw, data)
    return seed, target, data


# -- the property -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir():
    base = Path(tempfile.mkdtemp(prefix="nodeprep-fuzz-"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


# paramiko runs `Match exec` commands through invoke: a mutated ssh config runs none here
_NO_EXEC = mock.Mock(run=mock.Mock(return_value=mock.Mock(ok=False)))


@contextlib.contextmanager
def written(base: Path, seed: Seed, target: str, data: bytes):
    """The spec for the seed's files under a fresh directory, TARGET holding DATA."""
    where = Path(tempfile.mkdtemp(dir=base))
    files = {**seed.files, target: data}
    spec = seed.spec.replace("{dir}", str(where))
    if "" in files:                         # the spec itself is the input (slurm:LIST)
        spec += files.pop("").decode("utf-8", "surrogateescape")
    for rel, content in files.items():
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        (where / rel).write_bytes(content)
    home = {"HOME": str(where)} if seed.env == "home" else {}
    try:
        with mock.patch.dict(os.environ, home), mock.patch("paramiko.config.invoke", _NO_EXEC):
            yield spec
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _render(inv: model.Inventory) -> None:
    """Every view `invoke inventory` has, through the cli (stdout as a UTF-8 terminal's)."""
    views = [InventoryOptions(), InventoryOptions(graph=True), InventoryOptions(json=True),
             InventoryOptions(graph=True, json=True)]
    views += [InventoryOptions(host=h.name, json=json) for h in inv.hosts[:2]
              for json in (False, True)]
    for opts in views:
        out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
        err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
        with mock.patch.object(inventory_cmd, "load", return_value=inv), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.inventory(opts, SETTINGS)
            out.flush()
        assert code == 0, f"{opts}: exit {code}"


# Tracebacks whose cause is in a module this fuzz's fixes leave alone (the inventory model
# and schema, changed elsewhere): tolerated here, reported, and reproduced by the strict xfail
# test_known_tracebacks below, which fails as soon as one is fixed (then drop it here).
KNOWN: list = []    # both found by this fuzz (schema's 4300-digit int, model's ~nosuchuser) are fixed


def _known(exc: BaseException) -> bool:
    frames = [f.filename for f in traceback.extract_tb(exc.__traceback__)
              if f"{os.sep}nodeprep{os.sep}" in f.filename]
    last = Path(frames[-1]).name if frames else ""
    return any(isinstance(exc, kind) and last == name and words in str(exc)
               for kind, name, words in KNOWN)


def check(spec: str, file_based: bool = True, known_ok: bool = True, record=lambda what: None):
    """The property: load succeeds and renders, or InputError: exit 2, one line, the file
    named; and no hostile string ran. RECORD gets the outcome (Hypothesis' statistics)."""
    CANARY.unlink(missing_ok=True)
    try:
        inv = model.load(spec, schema=SCHEMA, root=ROOT)
    except InputError as exc:
        text = str(exc)
        record("InputError")
        assert exc.exit_code == 2
        assert "\n" not in text and "\r" not in text and "Traceback" not in text, repr(text)
        assert not file_based or exc.file, f"the error names no file: {text!r}"
    except Exception as exc:
        if not (known_ok and _known(exc)):
            raise
        record(f"known traceback (reported): {type(exc).__name__}")
    else:
        record("loaded and rendered")
        _render(inv)
    assert not CANARY.exists(), "a hostile string was executed"


EXAMPLES = 210          # per format: 2,100 in all


@pytest.mark.parametrize("fmt", sorted(SEEDS))
@fuzz(EXAMPLES)
@given(data=st.data())
def test_mutated_inventory_loads_or_is_one_input_error(fmt, workdir, data):
    seed, target, content = data.draw(mutated(SEEDS[fmt]), label="seed, file, content")
    with written(workdir, seed, target, content) as spec:
        check(spec, file_based=fmt != "slurm", record=event)


@pytest.mark.parametrize("fmt", sorted(SEEDS))
def test_the_seeds_are_valid(fmt, workdir):
    """The fuzz starts from valid inventories: the seeds load and render unchanged (a few
    corpus entries may be refused by checks stricter than Ansible's: not most of them)."""
    valid = 0
    for seed in SEEDS[fmt]:
        target = seed.targets[0]
        with written(workdir, seed, target, seed.files[target]) as spec:
            try:
                inv = model.load(spec, schema=SCHEMA, root=ROOT)
            except InputError:
                continue
            _render(inv)
            valid += 1
    assert valid >= 0.8 * len(SEEDS[fmt])


# -- what the fuzz found: each was a traceback or a hang, and is now one line ------------------

_LAUGHS = b"all:\n  hosts: {a: }\n  vars:\n    x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + b"".join(
    b"    x%d: &a%d [%s]\n" % (i, i, b", ".join([b"*a%d" % (i - 1)] * 10)) for i in range(1, 7))
_DEEP_KEYS = b"all:\n  vars:\n    x:\n" + b"".join(b" " * (i + 6) + b"k%d:\n" % i
                                                 for i in range(600))
_SSH_CANON = "host 'a': the ssh config cannot be resolved for it:"
# name: (spec, the file (or {file: content}), its content, how the message starts)
FOUND = {
    "slurm list with a newline (two lines)": (
        "slurm:a\nb[", None, None, "bad Slurm node list 'a\\nb[': bad node range"),
    "slurm range of 10^8 names (hang)": (
        "slurm:gpu[0-99999999]", None, None,
        "bad Slurm node list 'gpu[0-99999999]': bad node range 'gpu[0-99999999]': more than "
        "100000 names"),
    "--inventory ~nosuchuser/x (RuntimeError)": (
        "~nosuchuser/x", None, None, "inventory '~nosuchuser/x' not found"),
    "hostfile:~nosuchuser/x (RuntimeError)": (
        "hostfile:~nosuchuser/x", None, None, "~nosuchuser/x: file not found"),
    "ini range of 10^8 names (hang)": (
        "{d}/h.ini", "h.ini", b"[g]\na[0:99999999]\n",
        "h.ini:2: bad host range 'a[0:99999999]': more than 100000 names"),
    "yaml range of 10^8 names (hang)": (
        "{d}/h.yml", "h.yml", b"hosts:\n  a[0-99999999]:\n",
        "h.yml:2: bad node range 'a[0-99999999]': more than 100000 names"),
    "yaml 2000 nested [ (RecursionError, after seconds)": (
        "{d}/h.yml", "h.yml", b"hosts:\n  a: {python: " + b"[" * 2000 + b"}\n",
        "h.yml:2: more than 100 nested '[' or '{'"),
    "yaml 600 nested keys (RecursionError)": (     # the line: where Python's stack ended
        "{d}/h.yml", "h.yml", _DEEP_KEYS, re.compile(r"h\.yml:\d+: values nested too deeply")),
    "yaml aliases of 10^7 values (a JSON of 10^7)": (
        "{d}/h.yml", "h.yml", _LAUGHS, "h.yml:9: the aliases here expand to more than 1000000"),
    "yaml number of 5000 digits (ValueError)": (
        "{d}/h.yml", "h.yml", b"hosts:\n  a: {port: " + b"9" * 5000 + b"}\n",
        "h.yml:2: a number 5000 characters long"),
    "yaml empty !!int (IndexError)": (
        "{d}/h.yml", "h.yml", b"all:\n  vars:\n    x: !!int\n", "h.yml:3: '' is not a valid int"),
    "yaml !!bool on a word (KeyError)": (
        "{d}/h.yml", "h.yml", b"all:\n  vars:\n    x: !!bool x\n",
        "h.yml:3: 'x' is not a valid bool"),
    "yaml date 2001-13-45 (ValueError)": (
        "{d}/h.yml", "h.yml", b"all:\n  vars:\n    x: 2001-13-45\n",
        "h.yml:3: '2001-13-45' is not a valid timestamp"),
    "yaml !!seq on a word (AttributeError)": (
        "{d}/h.yml", "h.yml", b"!!seq x\n", "h.yml:1: 'x' is not a valid seq"),
    "yaml key with a newline (two lines)": (
        "{d}/h.yml", "h.yml", b'hosts:\n  "a\\nb":\n  "a\\nb":\n',
        "h.yml:3: duplicate key 'a\\nb' (first at line 2)"),
    "yaml not UTF-8 (no line)": (
        "{d}/h.yml", "h.yml", b"hosts:\n  a: {user: \xff}\n",
        "h.yml:2: byte 0xff at column 13 is not UTF-8 text"),
    "vars dir, a host name of 300 bytes (OSError)": (
        "{d}", {"hosts.ini": b"[g]\na" + b"b" * 300 + b"\n", "host_vars/other.yml": b"port: 22\n"},
        None, "hosts.ini:2: host name 'abbb"),
    "ssh config unclosed quote (ValueError)": (
        "sshconfig:", ".ssh/config", b'Host a\nMatch host "x\n',
        ".ssh/config:2: cannot read the ssh config: No closing quotation"),
    "ssh config Canonicalize without domains (KeyError)": (
        "sshconfig:", ".ssh/config", b"Host a\n  CanonicalizeHostname yes\n",
        f".ssh/config:1: {_SSH_CANON} canonicaldomains is not set"),
    "ssh config CanonicalizeMaxDots x (ValueError)": (
        "sshconfig:", ".ssh/config", b"Host a\n  CanonicalizeMaxDots x\n",
        f".ssh/config:1: {_SSH_CANON} invalid literal"),
    "ssh config not UTF-8 (no line)": (
        "sshconfig:", ".ssh/config", b"Host a\n  User \xff\n",
        ".ssh/config:2: byte 0xff at column 8 is not UTF-8 text"),
}


def _write(tmp_path: Path, monkeypatch, spec: str, rel, data: bytes | None) -> str:
    """Write DATA as REL (or REL's {path: content}) under tmp_path; the spec for it."""
    for path, content in (rel if isinstance(rel, dict) else {rel: data} if rel else {}).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(content)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)                  # messages show paths relative to it
    return spec.replace("{d}", str(tmp_path))


@pytest.mark.parametrize("name", FOUND)
def test_what_the_fuzz_found_is_one_input_error(name, tmp_path, monkeypatch):
    """Each was a traceback, a hang or a two-line message before this fuzz; kept as cases
    that run in a moment, whatever examples the fuzz draws."""
    spec, rel, data, words = FOUND[name]
    spec = _write(tmp_path, monkeypatch, spec, rel, data)
    check(spec, file_based=rel is not None, known_ok=False)
    with pytest.raises(InputError) as err:
        model.load(spec, schema=SCHEMA, root=ROOT)
    assert re.match(words if isinstance(words, re.Pattern) else re.escape(words), str(err.value))


@pytest.mark.parametrize("spec", ["hostfile:{d}/loop", "{d}/loop", "{d}"])
def test_a_symlink_loop_is_not_found_or_skipped(spec, tmp_path, monkeypatch):
    """`hostfile:LOOP` was a RuntimeError from Path.resolve (showing the path in the error);
    in an inventory directory a loop, or a link to the directory itself, is skipped."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "self").symlink_to(tmp_path)
    (tmp_path / "hosts").write_text("[g]\na\n")
    spec = spec.replace("{d}", str(tmp_path))
    check(spec, file_based=False, known_ok=False)
    if spec == str(tmp_path):
        assert [h.name for h in model.load(spec, schema=SCHEMA, root=ROOT).hosts] == ["a"]
    else:
        with pytest.raises(InputError, match=r"loop(: file|') not found"):
            model.load(spec, schema=SCHEMA, root=ROOT)


@pytest.mark.parametrize("spec, rel, data", [
    # schema._number: int() of a digit string over Python's 4300-digit limit
    ("{d}/hosts", "hosts", b"n1 slots=" + b"9" * 5000 + b"\n"),
    ("{d}/h.ini", "h.ini", b"[g]\na ansible_port=" + b"9" * 5000 + b"\n"),
    # model._host: Path(key).expanduser() of an unknown user's ~
    ("{d}/h.yml", "h.yml", b"hosts:\n  a: {key: ~nosuchuser/id}\n"),
], ids=["hostfile-slots-5000-digits", "ini-port-5000-digits", "yaml-key-unknown-user"])
def test_former_tracebacks_are_one_line_errors(spec, rel, data, tmp_path, monkeypatch):
    check(_write(tmp_path, monkeypatch, spec, rel, data), known_ok=False)
