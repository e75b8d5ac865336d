"""YAML loading that remembers where each value came from, so errors can say `file:line`.

Mappings load as LineDict and sequences as LineList: plain dict/list subclasses with
`.file`, `.line` (1-based start) and `.line_of(key_or_index)`. A key given twice in one
mapping is an error here, because PyYAML would silently keep the last one and a host or
variable would vanish without a word.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from nodeprep.errors import InputError


def display(path: Path | str) -> str:
    """How a path is shown in messages: relative to the working directory when inside it."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
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


class _Loader(yaml.SafeLoader):
    pass


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
            raise InputError(f"duplicate key '{key}' (first at line {seen[key]})",
                             "remove or merge one of them", loader.display_name,
                             key_node.start_mark.line + 1)
        seen[key] = key_node.start_mark.line + 1
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            data[key] = loader.construct_object(value_node, deep=True)
        except TypeError:
            raise InputError("a key must be a plain name, not a list or mapping",
                             "write `name: value`", loader.display_name,
                             key_node.start_mark.line + 1) from None
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


def load_yaml(path: Path | str):
    """The document in `path` (None for an empty file), or InputError naming file:line."""
    path = Path(path)
    shown = display(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("file not found", "check the path", shown) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read: {exc}", "check the file's permissions and encoding",
                         shown) from None
    loader = None
    try:
        loader = _Loader(text)           # the reader refuses control characters here already
        loader.display_name = shown
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        context = exc.context or ""
        if exc.context_mark and mark and exc.context_mark.line != mark.line:
            context += f" (started at line {exc.context_mark.line + 1})"
        problem = ": ".join(p for p in (context, exc.problem) if p)
        raise InputError(f"invalid YAML: {problem}",
                         "check indentation, a missing ':' or quotes around values "
                         "with ':', '#', '[' or '{'",
                         shown, mark.line + 1 if mark else None) from None
    except yaml.reader.ReaderError as exc:
        line = text[:exc.position].count("\n") + 1
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise InputError(f"control character #x{char:02x} in the file",
                         "remove it (a YAML file holds printable text only)", shown, line) from None
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {exc}".splitlines()[0], "check the file's syntax", shown) from None
    finally:
        if loader is not None:
            loader.dispose()
