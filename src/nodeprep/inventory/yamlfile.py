"""YAML loading that remembers where each value came from, so errors can say `file:line`.

Mappings load as LineDict and sequences as LineList: plain dict/list subclasses with
`.file`, `.line` (1-based start) and `.line_of(key_or_index)`. A key given twice in one
mapping is an error here, because PyYAML would silently keep the last one and a host or
variable would vanish without a word. So are what no inventory needs and every reader after
this one would trip on: an alias inside the value it names (a loop), aliases that expand to
more than MAX_VALUES values (a "billion laughs"), values nested more than MAX_NESTING deep,
and a value that does not fit its type (`!!int` on a word, a date 2001-13-45, a number of
more than 4300 digits): each is InputError naming file:line, never PyYAML's or Python's
exception.

read_input() is how every reader of a file the user gives gets its text: undecodable bytes
and unreadable files are one InputError naming the file (and the line).
"""

from __future__ import annotations

import codecs
from pathlib import Path

import yaml

from nodeprep.errors import InputError

MAX_VALUES = 1_000_000  # values a document may expand to, aliases followed
MAX_NESTING = 100  # lists and mappings inside one another


def shown_path(path: Path | str) -> str:
    """How a path is shown in messages: relative to the working directory when inside it."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, RuntimeError, OSError):  # RuntimeError: a symlink loop
        return str(path)


class LineDict(dict):
    file: str = "?"
    line: int = 0

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.lines: dict = {}

    def line_of(self, key) -> int:
        return self.lines.get(key, self.line)


class LineList(list):
    file: str = "?"
    line: int = 0

    def __init__(self, *args):
        super().__init__(*args)
        self.lines: list[int] = []

    def line_of(self, index: int) -> int:
        return self.lines[index] if index < len(self.lines) else self.line


# what PyYAML's constructors raise for a value that does not fit its type
_UNFIT = (ValueError, IndexError, KeyError, AttributeError, TypeError)


class _Loader(yaml.SafeLoader):
    def fetch_flow_collection_start(self, TokenClass):
        """`[` and `{` nest at most MAX_NESTING deep, refused as they are read: PyYAML's
        scanner slows down with the cube of their depth (2000 on one line take seconds)."""
        if self.flow_level >= MAX_NESTING:
            raise InputError(
                f"more than {MAX_NESTING} nested '[' or '{{'",
                "flatten the structure",
                self.display_name,
                self.line + 1,
            )
        super().fetch_flow_collection_start(TokenClass)

    def construct_object(self, node, deep=False):
        """A value that does not fit its type is InputError at its line: `!!int` on no digits,
        a date like 2001-13-45, a number of more than 4300 digits (PyYAML lets Python's
        ValueError, IndexError, KeyError... through)."""
        try:
            return super().construct_object(node, deep)
        except _UNFIT as exc:
            raise _unfit(node, exc, self.display_name) from None


def _unfit(node: yaml.Node, exc: Exception, shown: str) -> InputError:
    kind = node.tag.rpartition(":")[2] or node.tag
    scalar = isinstance(node, yaml.ScalarNode)
    if scalar and "Exceeds the limit" in str(exc):
        return InputError(
            f"a number {len(node.value)} characters long",
            "write a shorter number, or quote it if it is text",
            shown,
            node.start_mark.line + 1,
        )
    value = (
        repr(node.value[:40])
        if scalar
        else "a mapping"
        if isinstance(node, yaml.MappingNode)
        else "a list"
    )
    return InputError(
        f"{value} is not a valid {kind}",
        "fix it, or quote it if it is text",
        shown,
        node.start_mark.line + 1,
    )


def _construct_map(loader: _Loader, node: yaml.MappingNode):
    data = LineDict()
    data.file, data.line = loader.display_name, node.start_mark.line + 1
    yield data
    seen: dict = {}
    for key_node, _ in node.value:
        # Only the mapping's own keys: keys pulled in by a `<<:` merge may be overridden.
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = loader.construct_object(key_node)
        if key in seen:
            raise InputError(
                f"duplicate key '{key}' (first at line {seen[key]})",
                "remove or merge one of them",
                loader.display_name,
                key_node.start_mark.line + 1,
            )
        seen[key] = key_node.start_mark.line + 1
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            data[key] = loader.construct_object(value_node, deep=True)
        except TypeError:
            raise InputError(
                "a key must be a plain name, not a list or mapping",
                "write `name: value`",
                loader.display_name,
                key_node.start_mark.line + 1,
            ) from None
        data.lines[key] = key_node.start_mark.line + 1


def _construct_seq(loader: _Loader, node: yaml.SequenceNode):
    data = LineList()
    data.file, data.line = loader.display_name, node.start_mark.line + 1
    yield data
    for item in node.value:
        data.append(loader.construct_object(item, deep=True))
        data.lines.append(item.start_mark.line + 1)


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_Loader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)


def _check_graph(root: yaml.Node, shown: str) -> None:
    """Refuse an alias inside the node it names (a loop), values nested more than
    MAX_NESTING deep, and a document whose values, aliases followed, number more than
    MAX_VALUES (without walking them: each node's count is computed once)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    stack, open_ = [(root, False)], set()
    while stack:
        node, done = stack.pop()
        kids = (
            [n for pair in node.value for n in pair]
            if isinstance(node, yaml.MappingNode)
            else node.value
            if isinstance(node, yaml.SequenceNode)
            else []
        )
        if done:
            open_.discard(id(node))
            size[id(node)] = min(1 + sum(size[id(k)] for k in kids), MAX_VALUES + 1)
            depth[id(node)] = 1 + max((depth[id(k)] for k in kids), default=0) if kids else 0
            _check_node(node, size[id(node)], depth[id(node)], shown)
            continue
        if id(node) in size:
            continue
        if id(node) in open_:
            raise InputError(
                "an alias inside the value it names (a loop)",
                "remove the alias",
                shown,
                node.start_mark.line + 1,
            )
        open_.add(id(node))
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in size)


def _check_node(node: yaml.Node, size: int, depth: int, shown: str) -> None:
    if size > MAX_VALUES:
        raise InputError(
            f"the aliases here expand to more than {MAX_VALUES} values",
            "write the values out, or use fewer aliases",
            shown,
            node.start_mark.line + 1,
        )
    if depth > MAX_NESTING:
        raise InputError(
            f"values nested more than {MAX_NESTING} deep",
            "flatten the structure",
            shown,
            node.start_mark.line + 1,
        )


def _document(loader: _Loader, shown: str):
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_graph(node, shown)
        try:
            return loader.construct_document(node)
        except _UNFIT as exc:  # in what PyYAML constructs last: the top's own tag
            raise _unfit(node, exc, shown) from None
    except RecursionError:
        raise InputError(
            "values nested too deeply", "flatten the structure", shown, loader.line + 1
        ) from None


def read_input(path: Path | str, shown: str | None = None) -> str:
    """The text of a file the user gave (a UTF-8 byte-order mark dropped), or InputError
    naming the file: not found, unreadable, or the line and column of a byte that is not
    UTF-8."""
    path = Path(path)
    shown = shown or shown_path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError("file not found", "check the path", shown) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise InputError(
            f"cannot read: {getattr(exc, 'strerror', None) or exc}",
            "check the path and the file's permissions",
            shown,
        ) from None
    data = data[3:] if data.startswith(codecs.BOM_UTF8) else data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = data.rfind(b"\n", 0, exc.start) + 1
        column = len(data[start : exc.start].decode("utf-8", "replace")) + 1
        raise InputError(
            f"byte 0x{data[exc.start]:02x} at column {column} is not UTF-8 text",
            "save the file as UTF-8",
            shown,
            data.count(b"\n", 0, exc.start) + 1,
        ) from None


def load_yaml(path: Path | str):
    """The document in `path` (None for an empty file), or InputError naming file:line."""
    path = Path(path)
    shown = shown_path(path)
    return load_text(read_input(path, shown), shown)


def load_text(text: str, shown: str):
    """The document in TEXT (a program's output: an inventory script's JSON), SHOWN in errors."""
    loader = None
    try:
        loader = _Loader(text)  # the reader refuses control characters here already
        loader.display_name = shown
        return _document(loader, shown)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        context = exc.context or ""
        if exc.context_mark and mark and exc.context_mark.line != mark.line:
            context += f" (started at line {exc.context_mark.line + 1})"
        problem = ": ".join(p for p in (context, exc.problem) if p)
        raise InputError(
            f"invalid YAML: {problem}",
            "check indentation, a missing ':' or quotes around values with ':', '#', '[' or '{'",
            shown,
            mark.line + 1 if mark else None,
        ) from None
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise InputError(
            f"control character #x{char:02x} in the file",
            "remove it (a YAML file holds printable text only)",
            shown,
            line,
        ) from None
    except yaml.YAMLError as exc:
        raise InputError(
            f"invalid YAML: {exc}".splitlines()[0], "check the file's syntax", shown
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
