"""One way to report a configuration file that does not validate: file, field, what was expected.

Shared by every file seamguard reads (topology, policy, run config), because the person
reading these messages is editing that file by hand. Pure: text in, data or an error
out. Reading the file itself is the shell's job (``seamguard.app.config``).

YAML is bounded before it is built: an alias expands to a copy of what it names, so a
few kilobytes of nested aliases ("billion laughs") can expand to gigabytes. The node
graph is composed first (aliases stay shared there), its expanded size is counted, and
only a document under ``MAX_YAML_NODES`` is constructed — from that same node graph, so
the text is parsed once.

YAML is strict as it is built: a key given twice in one mapping is refused (plain YAML
keeps the last, so ``mode: dry_run`` followed further down by ``mode: enforce`` would
silently enforce), and so is a scalar no setting can mean — an integer outside 64 bits
(a 5,000-digit one), a float literal that overflows to infinity, NaN, an impossible date.
Each refusal is one line naming the file, the line and the field. Every YAML file
seamguard reads goes through ``parse_yaml``.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

MAX_CONFIG_BYTES = 64 * 1024 * 1024  # a 100k-GPU topology is 8.6 MB
MAX_YAML_NODES = 5_000_000  # nodes after alias expansion; a 100k-GPU topology has 1.03 M

# libyaml's C parser when PyYAML was built with it (several times faster on a 100k-GPU
# topology; it also refuses nesting deeper than 1,000 levels), else the pure-Python one.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"
_STR_TAG = "tag:yaml.org,2002:str"
_INT64 = 2**63  # no setting needs an integer outside [-2**63, 2**63)


class _RefusedNode(Exception):
    """A node the strict loader will not build: which node, and why (located by ``parse_yaml``)."""

    def __init__(self, node: yaml.Node, problem: str) -> None:
        super().__init__(problem)
        self.node, self.problem = node, problem


def _int_range(node: yaml.Node) -> str:
    return f"integer of {len(str(node.value))} characters is out of range (at most 64 bits)"


def _scalar_problem(value: Any, node: yaml.Node) -> str | None:
    """Why a constructed scalar is absurd as a setting, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and not -_INT64 <= value < _INT64:
        return _int_range(node)
    if isinstance(value, float) and value != value:
        return "NaN is not a setting"
    if isinstance(value, float) and value in (float("inf"), float("-inf")) and "inf" not in str(node.value).lower():
        return f"number {str(node.value)[:20]}... overflows to infinity" if len(str(node.value)) > 20 \
            else f"number {node.value} overflows to infinity"
    return None


class _StrictLoader(_SafeLoader):  # type: ignore[misc, valid-type]
    """The safe loader, refusing duplicate keys and absurd scalars (see the module docstring).

    Only the constructors that can meet an absurd scalar are wrapped (int, float, timestamp),
    so the common nodes (strings, mappings) cost what they cost in the safe loader.
    """

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            _refuse_duplicates(self, node)
        return super().construct_mapping(node, deep)


def _checked(construct: Any) -> Any:
    """A scalar constructor whose failures and absurd results become ``_RefusedNode``."""
    def build(loader: _StrictLoader, node: yaml.Node) -> Any:
        try:
            value = construct(loader, node)
        except (ValueError, OverflowError, TypeError) as e:  # int("9"*5000), a 13th month, ...
            if node.tag == _INT_TAG:
                raise _RefusedNode(node, _int_range(node)) from None
            raise _RefusedNode(node, str(e).splitlines()[0] if str(e) else type(e).__name__) from None
        problem = _scalar_problem(value, node)
        if problem:
            raise _RefusedNode(node, problem)
        return value
    return build


for _tag, _construct in (("int", yaml.constructor.SafeConstructor.construct_yaml_int),
                         ("float", yaml.constructor.SafeConstructor.construct_yaml_float),
                         ("timestamp", yaml.constructor.SafeConstructor.construct_yaml_timestamp)):
    _StrictLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _checked(_construct))


def _refuse_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> None:
    """Raise on the second occurrence of a scalar key in this mapping (a ``<<`` merge may be overridden)."""
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
            continue
        # A string key is its text (most keys; no second construction); others are built, so
        # `1` and `01` are the same int key.
        key = key_node.value if key_node.tag == _STR_TAG else loader.construct_object(key_node)
        if key in first_line:
            raise _RefusedNode(key_node, f"duplicate key {str(key_node.value)[:80]!r} "
                                         f"(first given at line {first_line[key]})")
        first_line[key] = key_node.start_mark.line + 1


def _path_to(root: yaml.Node, target: yaml.Node) -> tuple[Any, ...] | None:
    """The field path from ``root`` to ``target`` (a key node names its own key), or None."""
    stack: list[tuple[yaml.Node, tuple[Any, ...]]] = [(root, ())]
    seen: set[int] = set()
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                name = k.value if isinstance(k, yaml.ScalarNode) else "?"
                if k is target:
                    return (*path, name)
                stack.append((v, (*path, name)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((v, (*path, i)) for i, v in enumerate(node.value))
    return None


def _refusal(source: str, root: yaml.Node, e: _RefusedNode) -> str:
    line = e.node.start_mark.line + 1
    path = _path_to(root, e.node)
    where = f"{field_path(path)}: " if path else ""
    return f"{source}: line {line}: {where}{e.problem}"


def field_path(loc: tuple[Any, ...]) -> str:
    """`('racks', 3, 'cooling_loop')` -> `racks[3].cooling_loop`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def format_validation_error(source: str, what: str, err: ValidationError) -> str:
    lines = [f"{source}: invalid {what} ({err.error_count()} problem(s))"]
    for e in err.errors():
        got = e.get("input")
        got_s = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
        lines.append(f"  {field_path(e['loc'])}: {e['msg']}{got_s}")
    return "\n".join(lines)


def _expanded_nodes(root: yaml.Node, limit: int) -> int:
    """Nodes the document would have with every alias expanded (stops counting past ``limit``)."""
    memo: dict[int, int] = {}

    def size(n: yaml.Node) -> int:
        key = id(n)
        if key in memo:
            return memo[key]
        memo[key] = limit + 1  # a cycle (recursive alias) counts as too big
        if isinstance(n, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in n.value)
        elif isinstance(n, yaml.SequenceNode):
            total = 1 + sum(size(v) for v in n.value)
        else:
            total = 1
        memo[key] = min(total, limit + 1)
        return memo[key]

    return size(root)


def parse_yaml(text: str | bytes, source: str, what: str, error: type[Exception] = ValueError) -> Any:
    """Parse bounded YAML; bad syntax, non-UTF-8 bytes or an alias bomb raise ``error`` naming ``source``."""
    if len(text) > MAX_CONFIG_BYTES:
        raise error(f"{source}: {what} is {len(text)} bytes; at most {MAX_CONFIG_BYTES} are read")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise error(f"{source}: {what} is not UTF-8 text (byte {e.start})") from None
    loader = _StrictLoader(text)
    try:
        # Parsed once: the node graph is counted, then that same graph is constructed.
        root = loader.get_single_node()
        if root is None:
            return None
        if _expanded_nodes(root, MAX_YAML_NODES) > MAX_YAML_NODES:
            raise error(f"{source}: {what} expands to more than {MAX_YAML_NODES} YAML nodes "
                        "(nested aliases?); refusing to build it")
        try:
            return loader.construct_document(root)
        except _RefusedNode as e:
            raise error(_refusal(source, root, e)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise error(f"{source}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    except RecursionError:
        raise error(f"{source}: {what} is nested too deeply") from None
    finally:
        loader.dispose()
