"""YAML that remembers where each key is: ``parse_yaml`` returns the data and the line
of every mapping key and list item, so that a problem at ``rules.stall.params`` can name
its line. Safe loading only: no tags, no recursive aliases, no duplicate keys (YAML
keeps only the last, which hides the first)."""

from __future__ import annotations

from typing import Any

import yaml

#: where a value is: mapping keys and list indexes from the document's root
Loc = tuple[str | int, ...]

_PLAIN_TAGS = {"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"}


class YamlSyntaxError(Exception):
    """A document that is not YAML, or YAML this loader refuses; ``line`` is 1-based."""

    def __init__(self, line: int | None, reason: str) -> None:
        super().__init__(reason)
        self.line, self.reason = line, reason


class DuplicateKeys(Exception):
    """Keys given twice in one mapping: ``(where, line)`` each."""

    def __init__(self, duplicates: list[tuple[Loc, int]]) -> None:
        super().__init__(f"{len(duplicates)} duplicate key(s)")
        self.duplicates = duplicates


class _LineLoader(yaml.SafeLoader):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.lines: dict[Loc, int] = {}
        self.duplicates: list[tuple[Loc, int]] = []

    def load_with_lines(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        self.lines[()] = node.start_mark.line + 1
        return self._build(node, (), set())

    def _build(self, node: yaml.Node, path: Loc, seen: set[int]) -> Any:
        if id(node) in seen:  # an alias of its own ancestor: a loop, not a document
            raise yaml.constructor.ConstructorError(
                None, None, "a recursive alias is not allowed here", node.start_mark)
        seen = seen | {id(node)}
        if isinstance(node, yaml.MappingNode | yaml.SequenceNode) and node.tag not in _PLAIN_TAGS:
            raise yaml.constructor.ConstructorError(
                None, None, f"the tag {node.tag} is not allowed here", node.start_mark)
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)  # merge keys (<<: *defaults)
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str | int | float | bool):
                    raise yaml.constructor.ConstructorError(
                        None, None, "a mapping key must be a plain value", key_node.start_mark)
                where = (*path, key if isinstance(key, str | int) else str(key))
                if key in out:
                    self.duplicates.append((where, key_node.start_mark.line + 1))
                self.lines[where] = key_node.start_mark.line + 1
                out[key] = self._build(value_node, where, seen)
            return out
        if isinstance(node, yaml.SequenceNode):
            items = []
            for i, item in enumerate(node.value):
                self.lines[(*path, i)] = item.start_mark.line + 1
                items.append(self._build(item, (*path, i), seen))
            return items
        return self.construct_object(node, deep=True)


def parse_yaml(text: str) -> tuple[Any, dict[Loc, int]]:
    """The document and the line of every key and item in it (``()`` is the root).
    Raises ``YamlSyntaxError`` or ``DuplicateKeys``."""
    loader = _LineLoader(text)
    try:
        data = loader.load_with_lines()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        reason = "; ".join(s for s in (e.context, e.problem) if s) or "invalid YAML"
        raise YamlSyntaxError(mark.line + 1 if mark is not None else None,
                              f"YAML syntax error: {reason}") from None
    except yaml.YAMLError as e:
        raise YamlSyntaxError(None, f"YAML error: {e}") from None
    finally:
        loader.dispose()
    if loader.duplicates:
        raise DuplicateKeys(loader.duplicates)
    return data, loader.lines


def dotted(loc: Loc) -> str:
    """A location as a reader writes it: ``rules.stall.params``, ``accounts[0]``,
    ``prices["ml.p4d.24xlarge"]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "." in part or " " in part:  # an instance type such as ml.p4d.24xlarge
            out += f'["{part}"]'
        else:
            out += f".{part}" if out else part
    return out


def line_of(loc: Loc, lines: dict[Loc, int]) -> int | None:
    """The line of ``loc``, else of its nearest written parent."""
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None
