"""Every program that the lab, the roles, the tests, tasks.py and bench/ run comes from a Debian
package that requirements/bootstrap.sh installs (its list, read here), or from one every Debian 12
has (Essential: yes or Priority: required): a fresh machine has nothing else. Lab nodes run the
host's /usr, so what the nodes run counts too. The programs are found with `ast`: argv literals
given to subprocess, os.exec*, shutil.which or a parameter (name, function) called argv/cmd/
command/script/probe, and every string that reads as a shell script, lexed for its words in
command position; test_bootstrap.yml adds what programs run for us (mmdebstrap: arch-test) and
the few programs only real GPU nodes have. `dpkg -S` maps each to its package; one not on this
machine at all fails too: the bootstrap did not install it."""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = ROOT / "requirements" / "bootstrap.sh"
SOURCES = ("tasks.py", "src", "roles", "tests", "bench")
TABLES = yaml.safe_load(Path(__file__).with_suffix(".yml").read_text())
PY = os.path.basename(
    os.path.realpath("/usr/bin/python3")
)  # Debian's, the nodes' (not this venv's)
ON_BEHALF = [
    (e["program"].format(python=PY), e["in"], e["at"], e["why"]) for e in TABLES["on_behalf"]
]
PULLED_IN, REAL_NODES_ONLY, OPTIONAL = (
    TABLES["pulled_in"],
    TABLES["real_nodes_only"],
    TABLES["optional"],
)
SHELL = TABLES["shell"]
BUILTINS, KEYWORDS, PREFIX = (
    set(SHELL["builtins"].split()),
    set(SHELL["keywords"].split()),
    SHELL["prefix"],
)
SHELL_LIKE = re.compile(
    r"2>|>\s*/dev/null|&&|\|\||\$\(|\"\$|; *(then|do|fi|done)\b|^#!|"
    r"^\s*(exec|set -e|command -v|sudo -n) "
)
PROGRAM = re.compile(r"(/[\w.+-]+)+|[a-z][\w.+-]*")
HOLE = "\x00"  # an f-string's {value}


def bootstrap_packages() -> set[str]:
    """The Debian packages bootstrap.sh installs: its `for pkg in ...; do` list."""
    text = BOOTSTRAP.read_text().replace("\\\n", " ")
    m = re.search(r"^\s*for pkg in ([^;\n]*);\s*do", text, re.M)
    assert m, f"{BOOTSTRAP}: no `for pkg in ...; do` line (the package list this test reads)"
    return set(shlex.split(m.group(1)))


# ---- the shell: words in command position ----


def _split(script: str) -> list[str]:
    """SCRIPT as words and operators (`;` for every separator). The scripts it holds (command
    substitutions, the quoted script after `-c`, `trap` or `eval`) come as `$(` ... `$)`."""
    out, word, i = [], "", 0
    script = re.sub(
        r"<<-?\s*['\"]?(\w+)['\"]?([^\n]*)\n.*?\n\s*\1(?=\n|$)", r"\2", script, flags=re.S
    )
    while i < len(script):
        c = script[i]
        if c == "#" and not word:  # a comment
            i = script.find("\n", i) if "\n" in script[i:] else len(script)
        elif script.startswith("$((", i):  # arithmetic
            end = script.find("))", i)
            word, i = word + "$", (len(script) if end < 0 else end + 2)
        elif script.startswith("$(", i) or c == "`":
            end = _closing(script, i)
            out += ["$(", *_split(script[i + (1 if c == "`" else 2) : end]), "$)"]
            word, i = word + "$", end + 1
        elif c in "'\"":
            end = script.find(c, i + 1) % (len(script) + 1)
            inner = script[i + 1 : end]
            if not word and out[-1:] in (["-c"], ["trap"], ["eval"]) and not _python(inner):
                out += ["$(", *_split(inner), "$)"]
            elif c == '"':  # its command substitutions
                out += [
                    t
                    for m in re.finditer(r"\$\((?!\()", inner)
                    for t in ("$(", *_split(inner[m.end() : _closing(inner, m.start())]), "$)")
                ]
            word, i = word + (inner or "''"), end + 1
        elif script.startswith(";;", i) or c in " \t\n;&|(){}":
            out += [word] if word else []
            out += (
                [";;"]
                if script.startswith(";;", i)
                else []
                if c in " \t"
                else [";" if c in "\n;&|" else c]
            )
            word, i = "", i + (2 if script.startswith(";;", i) else 1)
        else:
            word, i = word + c, i + 1
    return out + ([word] if word else [])


def _closing(s: str, i: int) -> int:
    """Where the substitution that starts at S[I] ends."""
    if s[i] == "`":
        return s.find("`", i + 1) % (len(s) + 1)
    depth = 0
    for j in range(i + 1, len(s)):
        depth += {"(": 1, ")": -1}.get(s[j], 0)
        if depth == 0:
            return j
    return len(s)


def commands(script: str) -> list[str]:
    """The words of SCRIPT that it runs as programs (builtins included, its functions not)."""
    found, mode, stack, skip, operand = [], "cmd", [], 0, False
    for tok in _split(script):
        if tok in ("$(", "$)"):
            stack.append(mode) if tok == "$(" else None
            mode = "cmd" if tok == "$(" else (stack.pop() if stack else "args")
        elif mode == "pattern":  # case patterns, up to `)`
            mode = "cmd" if tok == ")" else "args" if tok == "esac" else mode
        elif tok in (";;", "(", ")", ";", "{", "}", "esac"):
            mode = {";;": "pattern", "}": "args", "esac": "args", ")": "args"}.get(tok, "cmd")
        elif skip:
            skip -= 1
        elif re.fullmatch(r"\d*(>>?|<<?|>&|<&)", tok):
            skip = 1  # a redirection; then its target
        elif mode == "case":
            mode = "pattern" if tok == "in" else mode
        elif mode == "opts" and found[-1] == "command" and tok in ("-v", "-V"):
            mode = "args"  # `command -v X` only looks X up
        elif mode == "opts" and _option(found[-1], tok) is not None:
            skip = _option(found[-1], tok)
            mode = "cmd" if tok == "--" and not operand else mode
        elif mode == "opts" and operand:
            operand = False  # timeout's duration, chroot's root
        elif mode in ("cmd", "opts") and tok in ("for", "select", "case"):
            mode = "case" if tok == "case" else "args"
        elif (
            mode in ("cmd", "opts")
            and tok not in KEYWORDS
            and not re.match(r"[A-Za-z_]\w*=|\d*[<>]", tok)
        ):
            found.append(tok)
            mode, operand = ("opts" if tok in PREFIX else "args"), tok in SHELL["operand_first"]
    return [w for w in found if w not in shell_functions(script)]


def shell_functions(text: str) -> set[str]:
    """The names TEXT defines as shell functions (`name() { ...; }`)."""
    return set(re.findall(r"(?<![\w.-])([A-Za-z_][\w-]*)\(\) *\{", text))


def _option(prefix: str, tok: str) -> int | None:
    """After PREFIX (a program that runs a command): None when TOK is not one of its options,
    else how many words after it to skip (an option's value)."""
    if tok == "--" or tok.startswith("-") or (prefix == "env" and "=" in tok):
        return int(len(tok) == 2 and tok[1] in (PREFIX[prefix] or ""))
    return None


# ---- the sources: argv literals and scripts ----

COMMAND_NAME = re.compile(r"argv|cmd|command|script|probe|_init$", re.I)  # a name that holds one
EXEC_CALLS = {("subprocess", f): 0 for f in ("run", "Popen", "check_output", "check_call", "call")}
EXEC_CALLS.update({("os", f): 1 for f in ("execv", "execvp", "execve", "execvpe")})
TEST_TREES = ("tests/", "bench/")  # their other strings hold hostile values and expected output
ADVICE = re.compile(r"(as root )?on \S+: ")  # a fix shown to the user: "on NODE: COMMAND"


@cache
def _sources() -> dict[str, str]:
    """file (relative to the repo) -> its text: every .py and .sh file of SOURCES but this one."""
    paths = [
        p
        for n in SOURCES
        for p in (
            [ROOT / n]
            if (ROOT / n).is_file()
            else sorted([*(ROOT / n).rglob("*.py"), *(ROOT / n).rglob("*.sh")])
        )
    ]
    return {str(p.relative_to(ROOT)): p.read_text() for p in paths if p != Path(__file__).resolve()}


@cache
def _nodes(rel: str) -> list[ast.AST]:
    return list(ast.walk(ast.parse(_sources()[rel])))


@cache
def _command_params() -> dict[str, set[int]]:
    """function (or dataclass) -> the positions of its parameters (fields) named for a command."""
    out: dict[str, set[int]] = {}
    for rel in _sources():
        for node in _nodes(rel) if rel.endswith(".py") else ():
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = (
                    [a.arg for a in node.args.args if a.arg not in ("self", "cls")]
                    if isinstance(node, ast.FunctionDef)
                    else [
                        getattr(n.target, "id", "")
                        for n in node.body
                        if isinstance(n, ast.AnnAssign)
                    ]
                )
                out.setdefault(node.name, set()).update(
                    i for i, n in enumerate(names) if COMMAND_NAME.search(n)
                )
    return out


def _held(tree: ast.Module, nodes: list[ast.AST]) -> tuple[list[ast.AST], set[int]]:
    """The expressions of TREE that hold an argv or a script by where they go (a subprocess
    call, a parameter or name called argv/command/script..., a function so named returning
    it, shutil.which), and the ids of the strings that run nothing (docstrings, regular
    expressions, asserts' expected values)."""
    held, skip = [], set()
    which = {
        getattr(n.args[0], "id", None)
        for n in nodes  # the names looked up with which()
        if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "which" and n.args
    }
    for node in nodes:
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
        ):
            skip.add(id(body[0].value))
        if isinstance(node, ast.Assert):
            skip.update(id(n) for n in ast.walk(node))
        elif isinstance(node, ast.Call):
            held += _call_args(node, skip)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            held += (
                [node.value]
                if any(COMMAND_NAME.search(getattr(t, "id", "")) for t in targets)
                else []
            )
        elif isinstance(node, ast.FunctionDef) and COMMAND_NAME.search(node.name):
            held += [n.value for n in ast.walk(node) if isinstance(n, ast.Return) and n.value]
        elif (
            isinstance(node, (ast.comprehension, ast.For))
            and getattr(node.target, "id", None) in which
        ):
            items = node.iter  # for X in ("a", "b") (or a module constant): which(X)
            if isinstance(items, ast.Name):
                items = next(
                    (
                        n.value
                        for n in tree.body
                        if isinstance(n, ast.Assign)
                        and any(getattr(t, "id", None) == items.id for t in n.targets)
                    ),
                    None,
                )
            held += [_argv(e) for e in getattr(items, "elts", [])]
    return held, skip


def _argv(word: ast.AST) -> ast.List:
    return ast.List(elts=[word], lineno=word.lineno, end_lineno=word.end_lineno)


def _call_args(call: ast.Call, skip: set[int]) -> list[ast.AST]:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    owner = getattr(getattr(func, "value", None), "id", None)
    if owner == "re":
        skip.update(id(n) for a in call.args for n in ast.walk(a))
        return []
    if (owner, name) in EXEC_CALLS:
        return call.args[EXEC_CALLS[owner, name] :][:1]
    if (owner, name) == ("shutil", "which"):
        return [_argv(a) for a in call.args[:1]]
    positions = _command_params().get(name, set())
    return [a for i, a in enumerate(call.args) if i in positions] + [
        k.value for k in call.keywords if k.arg and COMMAND_NAME.search(k.arg)
    ]


def _text(node: ast.AST) -> str | None:
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _python(text: str) -> bool:
    """TEXT is Python code (a `python -c` program), not a shell script."""
    try:
        tree = ast.parse(text.replace(HOLE, "x"))
    except SyntaxError:
        return False
    return any(
        isinstance(n, (ast.Import, ast.ImportFrom, ast.Call, ast.FunctionDef))
        for n in ast.walk(tree)
    )


def _words(node: ast.AST, held: bool, test: bool) -> list[str]:
    """The programs NODE runs: an argv literal's first word, a script's commands (a string not
    known to hold a script only when it reads as one; in the tests never)."""
    while isinstance(node, (ast.BinOp, ast.Lambda)):
        node = node.body if isinstance(node, ast.Lambda) else node.left
    if isinstance(node, (ast.List, ast.Tuple)):
        first = _text(node.elts[0]) if node.elts and held else None
        return [first] if first else []
    text = _text(node)
    if not text or not (held and (" " in text or not test) or SHELL_LIKE.search(text) and not test):
        return []
    return (
        []
        if ADVICE.match(text) or text.rstrip().endswith(".py") or _python(text)
        else commands(text)
    )


def _line(lines: list[str], first: int, last: int, word: str) -> int:
    """The line from FIRST to LAST that names WORD (not in a comment)."""
    pattern = re.compile(rf"(?<![\w/.-]){re.escape(word)}(?![\w/.-])")
    return next(
        (
            n
            for n in range(first, last + 1)
            if pattern.search(lines[n - 1]) and not lines[n - 1].lstrip().startswith("#")
        ),
        first,
    )


@cache
def _functions() -> set[str]:
    """The shell functions the sources define (one script defines, another calls them)."""
    return set().union(*(shell_functions(text) for text in _sources().values()))


@cache
def calls() -> dict[str, list[str]]:
    """program -> the places (file:line) that run it."""
    out: dict[str, list[str]] = {}
    for rel, text in _sources().items():
        lines = text.splitlines()
        found = (
            _found(rel, lines)
            if rel.endswith(".py")
            else [(w, _line(lines, 1, len(lines), w)) for w in commands(text)]
        )
        for word, line in found:
            if PROGRAM.fullmatch(word) and len(word) > 1 and word not in BUILTINS | _functions():
                out.setdefault(word, []).append(f"{rel}:{line}")
    return out


def _found(rel: str, lines: list[str]) -> list[tuple[str, int]]:
    nodes = _nodes(rel)
    held, skip = _held(nodes[0], nodes)
    held_ids, test = {id(h) for h in held}, rel.startswith(TEST_TREES)
    seen, out = set(skip), []
    for node in [*held, *nodes]:
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, ast.JoinedStr):
            seen.update(id(v) for v in node.values)
        out += [
            (w, _line(lines, node.lineno, node.end_lineno or node.lineno, w))
            for w in _words(node, id(node) in held_ids, test)
        ]
    return out


# ---- programs -> Debian packages ----

SEARCH = "/usr/sbin:/usr/bin:/sbin:/bin"  # Debian's own directories (not /usr/local, not a venv)


def _paths(program: str) -> list[str]:
    """Where PROGRAM is on this machine, as dpkg may know it: the path, the file a link (an
    alternative) leads to, and each under /usr and / (merged /usr). Empty: not installed."""
    found = program if program.startswith("/") else shutil.which(program, path=SEARCH)
    if not found or not os.path.exists(found):
        return []
    bare = {p.removeprefix("/usr") for p in (found, os.path.realpath(found))}
    return sorted(bare | {"/usr" + p for p in bare})


def owners(programs: list[str]) -> dict[str, set[str]]:
    """program -> the packages that own it here (empty: not installed); ONE dpkg -S."""
    paths = {p: _paths(p) for p in programs}
    every = sorted({q for qs in paths.values() for q in qs})
    text = (
        subprocess.run(["dpkg-query", "-S", *every], capture_output=True, text=True).stdout
        if every
        else ""
    )
    owned: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line.startswith("diversion by "):
            pkgs, _, path = line.partition(": ")
            owned.setdefault(path, set()).update(p.strip().split(":")[0] for p in pkgs.split(","))
    return {p: set().union(*(owned.get(q, set()) for q in qs)) for p, qs in paths.items()}


def base_install(packages: set[str]) -> set[str]:
    """Those of PACKAGES every Debian 12 has: Essential: yes or Priority: required."""
    if not packages:
        return set()
    text = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package}\t${Essential}\t${Priority}\n", *sorted(packages)],
        capture_output=True,
        text=True,
    ).stdout
    return {
        f[0]
        for f in (ln.split("\t") for ln in text.splitlines())
        if f[1] == "yes" or f[2] == "required"
    }


def required() -> dict[str, list[str]]:
    """program (or file) -> the places that run it (ON_BEHALF's: what runs it there, and why)."""
    out = {p: list(where) for p, where in calls().items()}
    for program, rel, anchor, why in ON_BEHALF:
        lines = (ROOT / rel).read_text().splitlines()
        line = next((n for n, text in enumerate(lines, 1) if anchor in text), 0)
        out.setdefault(program, []).append(f"{rel}:{line} ({why})")
    return out


def test_every_program_the_lab_and_the_tests_run_is_installed_by_the_bootstrap():
    named = bootstrap_packages()
    needed = {p: w for p, w in required().items() if p not in REAL_NODES_ONLY and p not in OPTIONAL}
    own = owners(sorted(needed))
    every = set().union(*own.values())
    ok = (
        named
        | base_install(every)
        | {p for p in every for k, v in PULLED_IN.items() if v in named and re.fullmatch(k, p)}
    )
    problems = []
    for program, where in sorted(needed.items()):
        shown = f"{program} ({where[0]}{f' and {len(where) - 1} more' if len(where) > 1 else ''})"
        if not own[program]:
            problems.append(
                f"{shown}: not on this machine, so requirements/bootstrap.sh did not install it: "
                f"add its package to the list there (apt-cache policy {os.path.basename(program)})"
            )
        elif not own[program] & ok:
            pkg = " or ".join(sorted(own[program]))
            add = sorted(
                {
                    next((v for k, v in PULLED_IN.items() if re.fullmatch(k, p)), p)
                    for p in own[program]
                }
            )
            problems.append(
                f"{shown}: from {pkg}, which requirements/bootstrap.sh does not install "
                "(nor is it Essential or Priority: required): "
                f"add {' or '.join(add)} to the list there"
            )
    assert not problems, "\n".join(problems)


def test_the_tables_are_true():
    """The bootstrap's list is read; no stale entry in test_bootstrap.yml: each exemption is
    run, each ON_BEHALF text is where it says, each PULLED_IN package comes with the one named."""
    named = bootstrap_packages()
    assert {"mmdebstrap", "openssh-server"} <= named and all(
        re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", p) for p in named
    )
    assert sorted(p for p in [*REAL_NODES_ONLY, *OPTIONAL] if p not in calls()) == []
    for program, rel, anchor, _ in ON_BEHALF:
        assert anchor in (ROOT / rel).read_text(), (
            f"ON_BEHALF {program}: {anchor!r} is not in {rel}"
        )
    for pattern, pkg in PULLED_IN.items():
        assert pkg in named, f"PULLED_IN {pattern}: bootstrap.sh installs no {pkg}"
        depends = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Depends} ${Pre-Depends}", pkg],
            capture_output=True,
            text=True,
        ).stdout
        assert re.search(rf"(^|[ ,|]){pattern}([ ,:]|$)", depends), (
            f"{pkg} does not depend on {pattern}: {depends}"
        )


@pytest.mark.parametrize("script, programs", TABLES["shell_cases"])
def test_the_shell_reading_finds_the_programs(script, programs):
    assert commands(script) == programs


def test_a_missing_arch_test_is_named_with_the_command_that_installs_it(monkeypatch):
    """lab.up --arch once said only 'Debian's package mirror must be reachable' when mmdebstrap
    stopped for want of arch-test: the hint names the package, the mirror only when it failed."""
    from nodeprep.errors import InputError
    from nodeprep.lab import foreign

    hint = foreign.build_hint("E: install arch-test for foreign architecture support")
    assert "apt-get install arch-test" in hint and "bootstrap.sh" in hint and "mirror" not in hint
    assert "mirror" in foreign.build_hint(
        "W: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease"
    )
    assert "mirror" not in foreign.build_hint(
        "E: arm64 can neither be executed natively nor via qemu user emulation"
    )
    monkeypatch.setattr(
        foreign.shutil, "which", lambda t: None if t == "arch-test" else f"/usr/bin/{t}"
    )
    with pytest.raises(InputError, match="needs arch-test") as e:
        foreign.require({"aarch64"})
    assert "arch-test" in e.value.hint
