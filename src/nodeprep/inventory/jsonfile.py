"""JSON read as Ansible reads it, with file:line for every value.

Ansible parses an inventory script's output (`--list`, `--host NAME`) with the json module,
never YAML, and its loader tries JSON first for every file it reads (an inventory, a
group_vars/ file: `from_yaml`), YAML only when that fails. JSON is not a subset of the YAML
PyYAML reads: a tab may indent JSON and never YAML, `1e5` is a number in JSON and a string
in YAML 1.1. So nodeprep does the same: load_json() for program output, load_file() (JSON,
else YAML) for files.

Values load as yamlfile's LineDict and LineList (the json module's own scanner, each mapping
and list told the line it starts on, each key the line it is on), so the readers after this
one do not care which syntax a document had. As in yamlfile, a key given twice in one
mapping is refused (the json module would keep the last one without a word: a host or a
variable would vanish), and so are values nested more than MAX_NESTING deep. A mapping
holding `__ansible_unsafe` is its string, as Ansible's JSON decoder reads it (how
`ansible-inventory --list` writes a value it will not template).
"""

from __future__ import annotations

import bisect
import json
from json import decoder, scanner
from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.inventory.yamlfile import (
    MAX_NESTING,
    LineDict,
    LineList,
    load_text,
    read_input,
    shown_path,
)


class NotJson(InputError):
    """The text is not JSON at all (a syntax error): a file may still be YAML."""


class _TooLong(Exception):
    """An integer over Python's digit limit (json's int() raises a bare ValueError)."""


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _TooLong(text) from None


class _Context:
    """What json.scanner.py_make_scanner reads from a JSONDecoder, with the mapping and list
    parsers replaced by ones that record where each value starts."""

    def __init__(self, text: str, shown: str):
        self.text, self.shown = text, shown
        self.newlines = [i for i, c in enumerate(text) if c == "\n"]
        self.depth = 0
        self.strict = True
        self.object_hook = self.object_pairs_hook = None
        self.parse_float, self.parse_int = float, _int
        self.parse_constant = {
            "-Infinity": float("-inf"),
            "Infinity": float("inf"),
            "NaN": float("nan"),
        }.__getitem__
        self.parse_string = decoder.scanstring
        self.memo: dict = {}
        self.parse_object, self.parse_array = self._object, self._array

    def line(self, index: int) -> int:
        return bisect.bisect_left(self.newlines, index) + 1

    def _nest(self, index: int) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise InputError(
                f"values nested more than {MAX_NESTING} deep",
                "flatten the structure",
                self.shown,
                self.line(index),
            )

    def _object(self, s_and_end, strict, scan_once, *hooks_and_memo):
        s, end = s_and_end
        memo = hooks_and_memo[2] if len(hooks_and_memo) > 2 else self.memo
        self._nest(end - 1)
        starts: list[int] = []

        def scan(string, index):
            starts.append(index)
            return scan_once(string, index)

        pairs, end = decoder.JSONObject(s_and_end, strict, scan, None, list, memo)
        self.depth -= 1
        data = LineDict()
        data.file, data.line = self.shown, self.line(s_and_end[1] - 1)
        if any(key == "__ansible_unsafe" for key, _ in pairs):
            return self._unsafe(dict(pairs)["__ansible_unsafe"], data.line), end
        for (key, value), start in zip(pairs, starts):
            # the key is the string before the ':' before its value
            line = self.line(s.rfind('"', 0, s.rfind(":", 0, start)))
            if key in data:
                raise InputError(
                    f"duplicate key '{key}' (first at line {data.lines[key]})",
                    "remove or merge one of them",
                    self.shown,
                    line,
                )
            data[key] = value
            data.lines[key] = line
        return data, end

    def _unsafe(self, value, line: int) -> str:
        """`{"__ansible_unsafe": TEXT}` is TEXT: how Ansible writes a string it will not
        template (its JSON decoder reads it back so, in any mapping)."""
        if not isinstance(value, str):
            raise InputError(
                "__ansible_unsafe holds no string", "write the text itself", self.shown, line
            )
        return value

    def _array(self, s_and_end, scan_once, *_):
        self._nest(s_and_end[1] - 1)
        starts: list[int] = []

        def scan(string, index):
            starts.append(index)
            return scan_once(string, index)

        values, end = decoder.JSONArray(s_and_end, scan)
        self.depth -= 1
        data = LineList(values)
        data.file, data.line = self.shown, self.line(s_and_end[1] - 1)
        data.lines = [self.line(i) for i in starts[: len(values)]]
        return data, end


def load_json(text: str, shown: str):
    """The JSON document TEXT (a program's output), as LineDict/LineList, or InputError
    naming SHOWN and the line."""
    ctx = _Context(text, shown)
    try:
        return _Decoder(ctx).decode(text)
    except json.JSONDecodeError as exc:
        raise NotJson(
            f"invalid JSON: {exc.msg} (column {exc.colno})",
            "write JSON as json.dumps(...) does: double quotes, no trailing comma",
            shown,
            exc.lineno,
        ) from None
    except _TooLong as exc:
        digits = str(exc)
        raise InputError(
            f"a number {len(digits)} characters long",
            "write a shorter number, or quote it if it is text",
            shown,
            ctx.line(text.find(digits)),
        ) from None
    except RecursionError:
        raise InputError("values nested too deeply", "flatten the structure", shown) from None


class _Decoder(json.JSONDecoder):
    def __init__(self, ctx: _Context):
        super().__init__()
        self.scan_once = scanner.py_make_scanner(ctx)


def load_file(path: Path | str):
    """A file as Ansible's loader reads it: JSON when it parses as JSON, else YAML (None for
    an empty file), or InputError naming file:line. A `.json` file that is neither is shown
    JSON's complaint, any other file YAML's."""
    path = Path(path)
    shown = shown_path(path)
    text = read_input(path, shown)
    try:
        return load_json(text, shown)
    except NotJson as json_error:
        try:
            return load_text(text, shown)
        except InputError:
            if path.suffix == ".json":
                raise json_error from None
            raise
