"""A completion request's body, parsed and type-checked before anything reads it.

Why this exists: admission, the relay and the proxy each read fields of the body
(``stream_options.include_usage``, ``max_tokens``, ``tools``, ...). A field of the wrong type,
JSON nested deeper than Python recurses, a ``NaN`` or a lone UTF-16 surrogate must be the
client's one-line 400 here, not a 500 from whichever code touches it first (the proxy's own
JSON encoder refuses NaN and surrogates). `parse` and `wrong_field` are pure; the app
(seamguard.gateway.app) turns what they say into OpenAI's error shape.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 64  # arrays and objects inside each other; OpenAI's own bodies need under 10

# field -> the JSON kinds it may have ("null": the field may be sent as null)
COMMON_FIELDS: dict[str, tuple[str, ...]] = {
    "model": ("string",), "stream": ("boolean", "null"), "stream_options": ("object", "null"),
    "max_tokens": ("integer", "null"), "n": ("integer", "null"), "seed": ("integer", "null"),
    "temperature": ("number", "null"), "top_p": ("number", "null"),
    "frequency_penalty": ("number", "null"), "presence_penalty": ("number", "null"),
    "stop": ("string", "array", "null"), "user": ("string", "null"), "logit_bias": ("object", "null"),
}
CHAT_FIELDS: dict[str, tuple[str, ...]] = {
    **COMMON_FIELDS, "messages": ("array",), "max_completion_tokens": ("integer", "null"),
    "tools": ("array", "null"), "tool_choice": ("string", "object", "null"), "functions": ("array", "null"),
    "function_call": ("string", "object", "null"), "response_format": ("object", "null"),
    "logprobs": ("boolean", "null"), "top_logprobs": ("integer", "null"),
    "parallel_tool_calls": ("boolean", "null"),
}
COMPLETION_FIELDS: dict[str, tuple[str, ...]] = {
    **COMMON_FIELDS, "prompt": ("string", "array"), "logprobs": ("integer", "null"), "echo": ("boolean", "null"),
    "best_of": ("integer", "null"), "suffix": ("string", "null"),
}
STREAM_OPTIONS: dict[str, tuple[str, ...]] = {"include_usage": ("boolean", "null"),
                                              "continuous_usage_stats": ("boolean", "null")}


def kind(v: Any) -> str:
    """The JSON kind of a parsed value (a bool is not an integer; an integer is also a number)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def _fits(v: Any, kinds: tuple[str, ...]) -> bool:
    k = kind(v)
    return k in kinds or (k == "integer" and "number" in kinds)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _walk_problem(doc: Any, limit: int) -> str | None:
    """Nesting past ``limit``, or a number too large for a float (``1e400`` parses as infinity)."""
    stack = [(doc, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return "the request body holds a number too large for a float"
        if isinstance(v, dict | list):
            if depth > limit:
                return f"the request body is nested deeper than {limit} levels"
            stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
    return None


def parse(raw: bytes) -> Any | str:
    """The parsed body, or (a str) one line saying why it is not acceptable JSON."""
    try:
        doc = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:
        return f"the request body is nested deeper than {MAX_DEPTH} levels"
    except ValueError as e:   # bad JSON, bad UTF-8, NaN/Infinity, an integer of thousands of digits
        return f"the request body is not valid JSON: {str(e).splitlines()[0][:200]}"
    problem = _walk_problem(doc, MAX_DEPTH)
    if problem is not None:
        return problem
    try:
        json.dumps(doc, ensure_ascii=False).encode("utf-8")   # as the proxy will forward it
    except UnicodeEncodeError:
        return "the request body holds a lone UTF-16 surrogate (\\ud800-\\udfff) that is no character"
    return doc


def wrong_field(body: dict[str, Any], endpoint: str) -> tuple[str, str] | None:
    """(field, one line) for the first known field of the wrong JSON kind, or None."""
    fields = CHAT_FIELDS if endpoint == "chat" else COMPLETION_FIELDS
    for name, kinds in fields.items():
        if name in body and not _fits(body[name], kinds):
            return name, f"'{name}' must be {' or '.join(kinds)}, not {kind(body[name])}"
    opts = body.get("stream_options")
    for name, kinds in STREAM_OPTIONS.items():
        if isinstance(opts, dict) and name in opts and not _fits(opts[name], kinds):
            return (f"stream_options.{name}",
                    f"'stream_options.{name}' must be {' or '.join(kinds)}, not {kind(opts[name])}")
    for i, m in enumerate(body.get("messages") or () if endpoint == "chat" else ()):
        if isinstance(m, dict) and not isinstance(m.get("role"), str):
            return f"messages[{i}].role", f"'messages[{i}].role' must be a string"
        parts = m.get("content") if isinstance(m, dict) else None
        for j, part in enumerate(parts if isinstance(parts, list) else ()):
            if isinstance(part, dict) and not isinstance(part.get("type"), str):
                where = f"messages[{i}].content[{j}].type"
                return where, f"'{where}' must be a string (text, image_url, input_audio, ...)"
    return None
