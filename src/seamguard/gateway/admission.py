"""Token-level admission: what a request reserves, which caps apply, and whether it fits.

Pure functions over numbers (no clock, no I/O); the stores (seamguard.gateway.store) call
`fits` inside one transaction (SQLite) or mirror it in one Lua script (Redis), so the check
and the reservation are atomic. Windows:

- per minute: a sliding window approximated from two fixed one-minute buckets (the
  current one counts fully, the previous one by the share of it still inside the last 60 s),
  as Cloudflare's and Envoy's rate limiters do; no 2x burst across a minute boundary.
- per day: a fixed UTC day.
- concurrency: requests in flight.

A request reserves its prompt estimate plus the output it may generate (`reserve_for`), and
the body the backend gets carries that output as both its caps (`capped_body`), so the
reservation is the backend's hard limit whatever the client asked. The store reconciles it with
the backend's ``usage`` at the end (`charge`: validated, never more completion than reserved,
never a release of more than was reserved). A key's spend can pass its budget only by its
requests' prompt under-estimates, each bounded by `prompt_token_bound` (docs/gateway.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

Priority = Literal["high", "normal", "low"]
MINUTE_S = 60.0
DAY_S = 86400.0
PER_MESSAGE_TOKENS = 4  # role and separators of a chat message (OpenAI's cookbook counts 3-4)


@dataclass(frozen=True)
class Limits:
    """Caps of one scope (a key or a tenant); None is unlimited."""

    tpm: int | None = None
    tpd: int | None = None
    concurrency: int | None = None


def never_fits(amount: int, scopes: list[tuple[str, Limits]]) -> str | None:
    """Why a request of ``amount`` tokens can never be admitted (it asks for more than a scope's
    whole per-minute or per-day budget), or None. Waiting would not help: the caller must ask for
    fewer tokens, so this is an invalid request, not a rate limit with a Retry-After."""
    for name, lim in scopes:
        for cap, per in ((lim.tpm, "minute"), (lim.tpd, "day")):
            if cap is not None and amount > cap:
                return f"{amount} tokens (prompt + max_tokens) exceed {name}'s whole budget of {cap} per {per}"
    return None


@dataclass(frozen=True)
class Counters:
    """What a scope has used, as the store read it at ``now``."""

    minute_cur: int = 0  # tokens charged to the current one-minute bucket
    minute_prev: int = 0  # ... and to the one before it
    day: int = 0  # tokens charged to the current UTC day
    inflight: int = 0


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""  # "" | "tpm" | "tpd" | "concurrency" | "shed" (with the scope, e.g. "tenant tpm")
    retry_after_s: int = 0


# Generation controls: fields a backend never renders into the prompt. Every other field of a
# request (messages, prompt, tools, functions, response_format, documents, suffix, and any field
# this list does not know) is counted as prompt text, so a new or unknown field errs on the side
# of charging, never of admitting for free.
CONTROL_FIELDS = frozenset({
    "model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n", "best_of",
    "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "frequency_penalty",
    "presence_penalty", "repetition_penalty", "length_penalty", "logit_bias", "logprobs", "top_logprobs",
    "prompt_logprobs", "user", "ignore_eos", "min_tokens", "skip_special_tokens",
    "spaces_between_special_tokens", "include_stop_str_in_output", "add_generation_prompt",
    "continue_final_message", "add_special_tokens", "echo", "priority", "request_id", "cache_salt",
    "parallel_tool_calls", "use_beam_search", "allowed_token_ids", "bad_words", "stream_interval",
    "return_token_ids", "return_tokens_as_token_ids", "truncate_prompt_tokens", "truncation_side",
    "service_tier", "store", "metadata", "reasoning_effort", "include_reasoning", "kv_transfer_params",
})
# Fields that let a client make the backend's prompt as long as it likes whatever the body's size
# (a Jinja chat template can loop): refused, since no estimate can bound them.
UNBOUNDED_FIELDS = ("chat_template",)
MEDIA_PART_TYPES = frozenset({"image_url", "input_image", "image", "input_audio", "audio_url", "video_url", "file"})
MEDIA_PART_TOKENS = 85  # estimate of one image/audio/video part (OpenAI's low-detail image)
MEDIA_PART_BOUND_TOKENS = 16_384  # most a backend's count of one media part is believed
ROLE_CHARS_COVERED = 16  # a role name up to this long is covered by PER_MESSAGE_TOKENS
PER_MESSAGE_BOUND_TOKENS = 8  # most a chat template adds per message around its text and role


@dataclass
class PromptSize:
    """The prompt-bearing parts of a request, measured: text as characters (ASCII and other) and
    UTF-8 bytes, chat messages, media parts, and token ids given as such."""

    ascii_chars: int = 0
    other_chars: int = 0
    text_bytes: int = 0
    messages: int = 0
    media_parts: int = 0
    token_ids: int = 0

    def text(self, s: str) -> None:
        n_ascii = len(s) if s.isascii() else len(s.encode("ascii", "ignore"))
        self.ascii_chars += n_ascii
        self.other_chars += len(s) - n_ascii
        self.text_bytes += n_ascii if n_ascii == len(s) else len(s.encode("utf-8", "surrogatepass"))

    def estimate(self, chars_per_token: float) -> int:
        return (math.ceil(self.ascii_chars / chars_per_token) + self.other_chars + PER_MESSAGE_TOKENS * self.messages
                + MEDIA_PART_TOKENS * self.media_parts + self.token_ids)

    def bound(self, template_tokens: int) -> int:
        return (self.text_bytes + PER_MESSAGE_BOUND_TOKENS * self.messages
                + MEDIA_PART_BOUND_TOKENS * self.media_parts + self.token_ids + template_tokens)

    def value(self, v: Any) -> None:
        """A structured value counted as its compact JSON text (what a template's ``tojson`` renders),
        walked without recursion so no nesting depth can break it."""
        stack = [v]
        while stack:
            x = stack.pop()
            if isinstance(x, str):
                self.text(x)
                self.ascii_chars += 2  # its quotes
                self.text_bytes += 2
            elif isinstance(x, dict):
                self.ascii_chars += 1 + 2 * len(x)  # braces, colons and commas
                self.text_bytes += 1 + 2 * len(x)
                for k, item in x.items():
                    stack.append(k)
                    stack.append(item)
            elif isinstance(x, list):
                self.ascii_chars += 1 + len(x)
                self.text_bytes += 1 + len(x)
                stack.extend(x)
            elif x is not None:  # numbers and booleans: their JSON spelling
                n = len(json.dumps(x)) if isinstance(x, bool | float) else len(str(x))
                self.ascii_chars += n
                self.text_bytes += n


def _content(size: PromptSize, content: Any) -> None:
    if isinstance(content, str):
        size.text(content)
    elif isinstance(content, list):  # content parts: a text part's text, a media part a fixed count
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                size.text(part["text"])
            elif isinstance(part, dict) and part.get("type") in MEDIA_PART_TYPES:
                size.media_parts += 1
            else:
                size.value(part)
    else:  # a dict, a number, null: whatever it is, its JSON text
        size.value(content)


def _message(size: PromptSize, m: Any) -> None:
    size.messages += 1
    if not isinstance(m, dict):
        size.value(m)
        return
    for k, v in m.items():
        if k == "content":
            _content(size, v)
        elif k == "role" and isinstance(v, str):
            size.text(v[ROLE_CHARS_COVERED:])
        else:  # name, tool_calls, tool_call_id, reasoning, and keys no spec has
            size.text(str(k))
            if isinstance(v, str):
                size.text(v)
            else:
                size.value(v)


def _prompt(size: PromptSize, p: Any) -> None:
    if isinstance(p, str):
        size.text(p)
        return
    if not isinstance(p, list):
        size.value(p)
        return
    for x in p:  # one prompt of token ids, or a batch of strings, id lists, or a mix of both
        if isinstance(x, int) and not isinstance(x, bool):
            size.token_ids += 1
        elif isinstance(x, str):
            size.text(x)
        elif isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in x):
            size.token_ids += len(x)
        else:
            size.value(x)


def measure_prompt(body: dict[str, Any]) -> PromptSize:
    """Every prompt-bearing field of a request: ``messages`` in any content form, ``prompt`` in any
    of its shapes, and every field that is not a generation control (CONTROL_FIELDS) as JSON text."""
    size = PromptSize()
    for k, v in body.items():
        if k in CONTROL_FIELDS:
            continue
        if k == "messages" and isinstance(v, list):
            for m in v:
                _message(size, m)
        elif k == "prompt":
            _prompt(size, v)
        else:
            size.value(v)
    return size


def estimate_prompt_tokens(body: dict[str, Any], chars_per_token: float = 4.0) -> int:
    """Prompt tokens the request is reserved for: ASCII characters / chars_per_token (about 4 for
    English with BPE tokenizers), one token per other character (CJK and the like are about one a
    character), PER_MESSAGE_TOKENS per chat message, MEDIA_PART_TOKENS per media part, token ids
    exactly; rounded up. The backend's real count replaces it when the request ends, within
    `prompt_token_bound`."""
    return measure_prompt(body).estimate(chars_per_token)


def prompt_token_bound(body: dict[str, Any], template_tokens: int) -> int:
    """The most prompt tokens any byte-level tokenizer can make of this request: a byte-level BPE
    (GPT-2, Llama 3, Qwen) or a SentencePiece with byte fallback (Llama 2, Mistral) never makes
    more tokens than the text has UTF-8 bytes; plus PER_MESSAGE_BOUND_TOKENS per message (the
    chat template's markers and its role), MEDIA_PART_BOUND_TOKENS per media part, and
    ``template_tokens`` for what the template adds once (BOS, a default system prompt, a tools
    preamble). A backend's prompt count above it is not believed."""
    return measure_prompt(body).bound(template_tokens)


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def requested_output_tokens(body: dict[str, Any], default: int) -> int:
    """Output tokens per choice: the larger of ``max_tokens`` and ``max_completion_tokens`` (backends
    disagree on which wins: vLLM's chat takes max_completion_tokens, its completions only
    max_tokens), else the configured default."""
    asked = [body[f] for f in ("max_tokens", "max_completion_tokens") if _positive_int(body.get(f))]
    return max(asked) if asked else default


def request_problem(body: dict[str, Any]) -> str | None:
    """Why a request cannot be given a bounded reservation, or None."""
    for f in UNBOUNDED_FIELDS:
        if body.get(f) is not None:
            return f"'{f}' is not accepted: it lets a request make its prompt as long as it likes"
    for f in ("n", "best_of"):
        if body.get(f) is not None and not _positive_int(body[f]):
            return f"'{f}' must be a positive integer"
    return None


@dataclass(frozen=True)
class Reserved:
    """What admission reserved for one request, and the caps it forwards."""

    prompt_estimate: int
    prompt_bound: int  # most prompt tokens a backend's usage is believed for
    per_choice: int  # max_tokens and max_completion_tokens as forwarded
    choices: int  # n (or best_of): sequences the backend generates

    @property
    def output_tokens(self) -> int:
        """The most completion tokens the backend may generate (and the stream may relay)."""
        return self.per_choice * self.choices

    @property
    def amount(self) -> int:
        return self.prompt_estimate + self.output_tokens


def reserve_for(body: dict[str, Any], default_max_tokens: int, chars_per_token: float,
                template_tokens: int) -> Reserved:
    """The reservation of a request whose `request_problem` is None."""
    choices = max([body[f] for f in ("n", "best_of") if _positive_int(body.get(f))] or [1])
    size = measure_prompt(body)
    return Reserved(size.estimate(chars_per_token), size.bound(template_tokens),
                    requested_output_tokens(body, default_max_tokens), choices)


def capped_body(body: dict[str, Any], r: Reserved) -> dict[str, Any]:
    """The body forwarded to the backend: its output caps set to the reservation, so whichever the
    backend reads, and its default when the client set none, it cannot generate more than was
    reserved. A chat request carries both ``max_tokens`` and ``max_completion_tokens``; a
    completion only ``max_tokens`` (the one field its API has: a stricter server may refuse the
    other). A client's ``kv_transfer_params`` are dropped (only the gateway directs KV transfers)."""
    out = {k: v for k, v in body.items() if k != "kv_transfer_params"}
    out["max_tokens"] = r.per_choice
    if "messages" in body:
        out["max_completion_tokens"] = r.per_choice
    else:
        out.pop("max_completion_tokens", None)
    return out


@dataclass(frozen=True)
class Charge:
    """What a finished request is charged, and why the backend's usage was not taken as given."""

    prompt: int
    completion: int
    problem: str = ""

    @property
    def total(self) -> int:
        return self.prompt + self.completion

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt, "completion_tokens": self.completion, "total_tokens": self.total}


def token_count(v: Any) -> int | None:
    """A token count as a backend may send it: a non-negative integer, an integral float such as
    ``5000.0`` included (as 5000); None for anything else (negative, fractional, NaN, a string, a
    boolean)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if v >= 0 else None
    if isinstance(v, float) and v.is_integer() and v >= 0:
        return int(v)
    return None


def charge(r: Reserved, usage: Any, relayed: int) -> Charge:
    """The charge of a finished request from the backend's ``usage`` (None: it sent none) and the
    completion tokens the gateway itself relayed. Never more completion than was reserved, never
    less than was relayed; a prompt count within `prompt_token_bound`; a malformed usage charges
    the whole reservation."""
    relayed = min(max(0, relayed), r.output_tokens)
    if usage is None:
        return Charge(r.prompt_estimate, relayed)
    p = token_count(usage.get("prompt_tokens")) if isinstance(usage, dict) else None
    c = token_count(usage.get("completion_tokens")) if isinstance(usage, dict) else None
    if p is None or c is None:
        shown = json.dumps(usage, default=str)[:120]
        return Charge(r.prompt_estimate, r.output_tokens,
                      f"usage {shown} is not non-negative integer prompt_tokens and completion_tokens")
    problems = []
    if c > r.output_tokens:
        problems.append(f"completion_tokens {c} over the {r.output_tokens} reserved")
    if p > r.prompt_bound:
        problems.append(f"prompt_tokens {p} over the bound of {r.prompt_bound} for this prompt")
    return Charge(min(p, r.prompt_bound), max(min(c, r.output_tokens), relayed), "; ".join(problems))


def shed_share(priority: Priority, shed_low_at: float, shed_normal_at: float) -> float:
    """The share of its tenant's TPM a request of this priority may bring the tenant to: low
    priority is refused first as the tenant nears its budget, high may use all of it."""
    return {"low": shed_low_at, "normal": shed_normal_at, "high": 1.0}[priority]


def minute_used(c: Counters, elapsed_in_minute_s: float) -> float:
    """Tokens in the sliding last minute: current bucket plus the still-covered part of the previous."""
    return c.minute_cur + c.minute_prev * max(0.0, 1.0 - elapsed_in_minute_s / MINUTE_S)


def _minute_retry(c: Counters, cap: float, amount: int, elapsed: float) -> int:
    """Seconds until the sliding minute has room for ``amount`` if nothing else is charged."""
    room = cap - amount
    if c.minute_cur <= room:  # the previous bucket's share decays within this minute
        t = MINUTE_S * (1.0 - (room - c.minute_cur) / c.minute_prev) if c.minute_prev > 0 else elapsed
        return max(1, math.ceil(t - elapsed))
    # the current bucket alone is too full: at the boundary it becomes the previous one, then decays
    return max(1, math.ceil(MINUTE_S - elapsed + MINUTE_S * (1.0 - room / c.minute_cur)))


def fits(c: Counters, lim: Limits, amount: int, elapsed_in_minute_s: float, elapsed_in_day_s: float,
         tpm_share: float = 1.0, scope: str = "key") -> Verdict:
    """Whether reserving ``amount`` tokens (and one in-flight slot) keeps this scope within its caps.

    ``tpm_share`` scales the TPM cap: below 1 for a lower priority near a tenant's budget (shed)
    or for a throttled key. A reservation larger than the whole cap never fits.
    """
    if lim.concurrency is not None and c.inflight + 1 > lim.concurrency:
        return Verdict(False, f"{scope} concurrency", 1)
    if lim.tpd is not None and c.day + amount > lim.tpd:
        return Verdict(False, f"{scope} tpd", max(1, math.ceil(DAY_S - elapsed_in_day_s)))
    if lim.tpm is not None:
        cap = lim.tpm * tpm_share
        if minute_used(c, elapsed_in_minute_s) + amount > cap:
            why = "shed" if tpm_share < 1.0 and minute_used(c, elapsed_in_minute_s) + amount <= lim.tpm else "tpm"
            if amount > cap:
                return Verdict(False, f"{scope} {why}", int(MINUTE_S))
            return Verdict(False, f"{scope} {why}", min(int(2 * MINUTE_S),
                                                        _minute_retry(c, cap, amount, elapsed_in_minute_s)))
    return Verdict(True)


def windows(now: float) -> tuple[int, float, int, float]:
    """(minute index, seconds into it, UTC day index, seconds into it) of a wall-clock time."""
    m = math.floor(now / MINUTE_S)
    d = math.floor(now / DAY_S)
    return m, now - m * MINUTE_S, d, now - d * DAY_S
