"""One way to report a configuration file that does not validate: file, field, what was expected.

Shared by every file seamguard reads (topology, policy, run config), because the person
reading these messages is editing that file by hand. Pure: text in, data or an error
out. Reading the file itself is the shell's job (``seamguard.app.config``).

YAML is bounded before it is built: an alias expands to a copy of what it names, so a
few kilobytes of nested aliases ("billion laughs") can expand to gigabytes. The node
graph is composed first (aliases stay shared there), its expanded size is counted, and
only a document under ``MAX_YAML_NODES`` is constructed — from that same node graph, so
the text is parsed once.
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
    loader = _SafeLoader(text)
    try:
        # Parsed once: the node graph is counted, then that same graph is constructed.
        root = loader.get_single_node()
        if root is None:
            return None
        if _expanded_nodes(root, MAX_YAML_NODES) > MAX_YAML_NODES:
            raise error(f"{source}: {what} expands to more than {MAX_YAML_NODES} YAML nodes "
                        "(nested aliases?); refusing to build it")
        return loader.construct_document(root)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise error(f"{source}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    except RecursionError:
        raise error(f"{source}: {what} is nested too deeply") from None
    finally:
        loader.dispose()
