"""The variable schema: every variable a node can have, read from the defaults files.

src/nodeprep/defaults.yml holds the core variables (how to reach a node), each
roles/<role>/defaults.yml its role's. The default's YAML type sets the variable's kind,
and the `#` lines right above a key are its documentation, which is required: a variable
nobody explained is one nobody can set correctly. Two roles defining one name is an
error, because a single value would then silently configure both.
"""

from __future__ import annotations

import re
from dataclasses import KW_ONLY, dataclass
from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.inventory.yamlfile import LineDict, load_yaml, shown_path
from nodeprep.settings import find_project

CORE = Path(__file__).with_name("defaults.yml")

# Core variables whose default is null still feed typed Host fields, so they get a kind
# that a null default cannot express.
_NULL_KINDS = {
    "address": "str",
    "user": "str",
    "key": "str",
    "slots": "int",
    "cpu_slots": "int",
    "train_min_nodes": "int",
}
_BOUNDS = {
    "port": (1, 65535),
    "slots": (1, None),
    "cpu_slots": (1, None),
    "train_restarts": (0, None),
    "train_min_nodes": (1, None),
}
_WORDS = {
    "bool": "true or false",
    "int": "a whole number",
    "float": "a number",
    "str": "a string",
    "list": "a list",
    "dict": "a mapping",
}
_BOOL_WORDS = {"yes", "no", "true", "false", "on", "off", "y", "n"}


@dataclass(frozen=True)
class VarSpec:
    name: str
    default: object
    kind: str  # bool, int, float, str, list, dict, or any
    _: KW_ONLY
    doc: str
    source: str  # "file:line" of the definition


def load_schema(roots: list[Path] | None = None) -> dict[str, VarSpec]:
    """Core variables plus those of every roles/*/defaults.yml under each root (default: the
    project, settings.find_project())."""
    files = [CORE]
    for root in roots if roots is not None else [find_project()]:
        files.extend(sorted(Path(root).glob("roles/*/defaults.yml")))
    schema: dict[str, VarSpec] = {}
    for path in files:
        for spec in _read(path, core=path == CORE):
            if spec.name in schema:
                file, line = spec.source.rsplit(":", 1)
                raise InputError(
                    f"variable '{spec.name}' is already defined at {schema[spec.name].source}",
                    "variables are shared by all roles: rename one, "
                    "e.g. with the role name as prefix",
                    file,
                    int(line),
                )
            schema[spec.name] = spec
    return schema


def _read(path: Path, core: bool) -> list[VarSpec]:
    data = load_yaml(path)
    if data is None:
        return []
    shown = shown_path(path)
    if not isinstance(data, LineDict):
        raise InputError(
            "a defaults file must be a mapping of variable: default",
            "write one `name: default` per variable",
            shown,
            getattr(data, "line", 1),
        )
    lines = path.read_text(encoding="utf-8").splitlines()
    specs = []
    for name, default in data.items():
        line = data.line_of(name)
        doc = _comment_above(lines, line)
        if not doc:
            raise InputError(
                f"variable '{name}' has no documentation",
                "add a `# what it does` comment line directly above it",
                shown,
                line,
            )
        kind = _NULL_KINDS.get(name, "any") if core and default is None else _kind(default)
        specs.append(VarSpec(str(name), default, kind, doc=doc, source=f"{shown}:{line}"))
    return specs


def _comment_above(lines: list[str], line: int) -> str:
    doc: list[str] = []
    index = line - 2
    while index >= 0 and lines[index].lstrip().startswith("#"):
        doc.insert(0, lines[index].lstrip().lstrip("#").strip())
        index -= 1
    return " ".join(part for part in doc if part)


def _kind(default) -> str:
    for kind, types in (
        ("bool", bool),
        ("int", int),
        ("float", float),
        ("str", str),
        ("list", list),
        ("dict", dict),
    ):
        if isinstance(default, types):
            return kind
    return "any"


def _show(value) -> str:
    if isinstance(value, str):
        return f'the string "{value}"'
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "a mapping"
    return f"the number {value}"


def check_value(spec: VarSpec, value) -> str | None:
    """None if `value` suits the variable, else a short reason saying what to write."""
    kind = spec.kind
    if kind == "any" or (value is None and spec.default is None):
        return None
    if value is None:
        return (
            f"expected {_WORDS[kind]}, got null "
            f"(remove the line to use the default {spec.default!r})"
        )
    got = f"expected {_WORDS[kind]}, got {_show(value)}"
    if kind == "bool":
        if isinstance(value, bool):
            return None
        if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
            return f"{got}: use true or false without quotes"
        return got
    if kind in ("int", "float"):
        number = _number(value, kind)
        if number is None:
            return got
        low, high = _BOUNDS.get(spec.name, (None, None))
        if (low is not None and number < low) or (high is not None and number > high):
            upper = f"..{high}" if high is not None else " or more"
            return f"{spec.name} must be {low}{upper}, got {number}"
        return None
    if kind == "str":
        if isinstance(value, float):
            return f"{got}: quote it, so that e.g. 2.10 is not read as 2.1"
        if isinstance(value, bool):
            return f"{got}: quote it if you mean the word"
        return None if isinstance(value, (str, int)) else got
    return None if isinstance(value, list if kind == "list" else dict) else got


def _number(value, kind: str):
    """The value as a number if it is one (digit strings too, as the CLI gives them)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) or (kind == "float" and isinstance(value, float)):
        return value
    if isinstance(value, str):
        pattern = r"-?[0-9]+" if kind == "int" else r"-?[0-9]+(\.[0-9]*)?"
        # more than 30 digits is no port, count or size; int() refuses > 4300 anyway
        if len(value.strip()) <= 30 and re.fullmatch(pattern, value.strip()):
            return int(value) if kind == "int" else float(value)
    return None


def normalize(spec: VarSpec, value):
    """The value with digit strings turned into numbers; call after check_value passed."""
    if spec.kind in ("int", "float") and isinstance(value, str):
        return _number(value, spec.kind)
    return value
