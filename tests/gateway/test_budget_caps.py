"""The reservation as the backend's hard cap: prompt measurement, the forwarded caps, usage
validation (pure functions), and the relay's token deadlines (`relay.bounded`)."""

from __future__ import annotations

import asyncio
import json

import pytest

from seamguard.gateway.admission import (
    Charge,
    capped_body,
    charge,
    estimate_prompt_tokens,
    prompt_token_bound,
    request_problem,
    reserve_for,
    token_count,
)
from seamguard.gateway.proxy import UpstreamError
from seamguard.gateway.relay import ClientGone, OutputCap, bounded, cut_events

CHAT = {"model": "m", "messages": [{"role": "user", "content": "x"}]}


@pytest.mark.parametrize("extra,more_than", [
    ({"tools": [{"type": "function", "function": {"name": "f", "description": "d" * 4000}}]}, 1000),
    ({"functions": [{"name": "f", "description": "d" * 4000}]}, 1000),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"description": "d" * 4000}}}}, 1000),
    ({"documents": [{"title": "t", "text": "d" * 4000}]}, 1000),
    ({"some_future_field": "d" * 4000}, 1000),   # a field no list knows is prompt text too
])
def test_every_prompt_bearing_field_is_counted(extra, more_than):
    assert estimate_prompt_tokens({**CHAT, **extra}) > more_than


@pytest.mark.parametrize("content", ["w" * 4000, [{"type": "text", "text": "w" * 4000}], {"text": "w" * 4000},
                                     [{"type": "mystery", "data": "w" * 4000}], [["w" * 4000]]])
def test_message_content_in_any_form_is_counted(content):
    assert estimate_prompt_tokens({"messages": [{"role": "user", "content": content}]}) >= 1000


@pytest.mark.parametrize("prompt,tokens", [
    ("w" * 400, 100), (["w" * 200, "w" * 200], 100), (list(range(100)), 100), ([list(range(60)), list(range(40))], 100),
    ([list(range(60)), "w" * 160], 100), ([7] * 60 + ["w" * 160], 100), ([{"x": "w" * 396}], 101),  # its compact JSON: 404 characters
])
def test_every_prompt_shape_is_counted(prompt, tokens):
    assert estimate_prompt_tokens({"prompt": prompt}) == tokens


def test_non_ascii_text_counts_a_token_a_character_and_the_bound_its_bytes():
    body = {"prompt": "漢" * 100}
    assert estimate_prompt_tokens(body) == 100
    assert prompt_token_bound(body, 0) == 300   # UTF-8 bytes: no byte-level tokenizer makes more tokens


def test_extra_message_keys_and_long_roles_are_counted():
    assert estimate_prompt_tokens({"messages": [{"role": "r" * 416, "content": ""}]}) == 100 + 4
    assert estimate_prompt_tokens({"messages": [{"role": "user", "content": "", "k" * 400: "v" * 400}]}) == 200 + 4


def test_deeply_nested_fields_are_counted_without_recursion():
    deep: object = "w" * 400
    for _ in range(50_000):
        deep = [deep]
    assert estimate_prompt_tokens({**CHAT, "tools": deep}) > 100


def test_reservation_is_the_larger_cap_times_the_choices_and_the_body_carries_it():
    r = reserve_for({**CHAT, "max_completion_tokens": 1, "max_tokens": 100_000}, 512, 4.0, 256)
    assert r.per_choice == 100_000 and r.output_tokens == 100_000
    r = reserve_for({**CHAT, "best_of": 3, "max_tokens": 10}, 512, 4.0, 256)
    assert r.output_tokens == 30
    r = reserve_for(CHAT, 512, 4.0, 256)
    sent = capped_body({**CHAT, "kv_transfer_params": {"do_remote_prefill": True}}, r)
    assert sent["max_tokens"] == sent["max_completion_tokens"] == 512 and "kv_transfer_params" not in sent
    completion = {"model": "m", "prompt": "x", "max_completion_tokens": 1, "max_tokens": 100_000}
    sent = capped_body(completion, reserve_for(completion, 512, 4.0, 256))
    assert sent["max_tokens"] == 100_000 and "max_completion_tokens" not in sent   # the one field its API has


def test_requests_no_estimate_can_bound_are_refused():
    assert "chat_template" in request_problem({**CHAT, "chat_template": "{% for i in range(10**9) %}x{% endfor %}"})
    assert "best_of" in request_problem({**CHAT, "best_of": "3"})
    assert request_problem(CHAT) is None


@pytest.mark.parametrize("v,out", [(5, 5), (0, 0), (5000.0, 5000), (-1, None), (2.5, None), ("5", None),
                                   (True, None), (None, None), (float("nan"), None), (float("inf"), None)])
def test_token_counts_are_non_negative_integers(v, out):
    assert token_count(v) == out


R = reserve_for({**CHAT, "max_tokens": 100}, 512, 4.0, 256)   # estimate 5, output 100, bound 1 + 8 + 256


@pytest.mark.parametrize("usage,relayed,expect", [
    ({"prompt_tokens": 4, "completion_tokens": 60}, 0, (4, 60, False)),
    ({"prompt_tokens": 4.0, "completion_tokens": 60.0}, 0, (4, 60, False)),
    ({"prompt_tokens": 4, "completion_tokens": 100_000}, 0, (4, 100, True)),     # never above the reservation
    ({"prompt_tokens": 4, "completion_tokens": 1}, 30, (4, 30, False)),          # never below what was relayed
    ({"prompt_tokens": 10**9, "completion_tokens": 1}, 0, (265, 1, True)),       # a prompt past the bound
    ({"prompt_tokens": -100_000, "completion_tokens": -5}, 0, (5, 100, True)),    # malformed: the reservation
    ({"prompt_tokens": "4", "completion_tokens": "3"}, 0, (5, 100, True)),
    ({"completion_tokens": 3}, 0, (5, 100, True)),
    ("lots", 0, (5, 100, True)),
    (None, 7, (5, 7, False)),                                                   # no usage: what was relayed
    (None, 10**6, (5, 100, False)),
])
def test_charge_validates_the_backends_usage(usage, relayed, expect):
    c = charge(R, usage, relayed)
    assert (c.prompt, c.completion, bool(c.problem)) == expect
    assert 0 <= c.total and c.completion <= R.output_tokens   # a release never returns more than was reserved


def test_charge_usage_is_what_the_client_sees():
    assert Charge(4, 6).usage() == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}


def test_output_cap_counts_choices_with_output_and_the_cut_finishes_open_choices():
    cap = OutputCap(2)
    tok = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "a"}}]}
    assert not cap.over(tok) and not cap.over({"choices": [{"index": 0, "delta": {}}]}) and not cap.over(tok)
    assert cap.over(tok) and cap.relayed == 2
    events = cut_events(tok, {0}, {"total_tokens": 7})
    assert events[0]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "length"}]
    assert events[1]["usage"] == {"total_tokens": 7} and events[0]["id"] == "c"


async def _feed(items: list[tuple[float, str]]):
    for delay_s, data in items:
        await asyncio.sleep(delay_s)
        yield data


def _token(i: int) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": {"content": f"t{i}"}}]})


async def _read(items, gone=None, first_s=0.3, gap_s=0.3) -> list[str]:
    return [d async for d in bounded(_feed(items), gone, first_s, gap_s)]


def test_bounded_relays_a_stream_that_keeps_its_pace():
    items = [(0.05, _token(i)) for i in range(5)] + [(0.0, "[DONE]")]
    assert asyncio.run(_read(items)) == [d for _, d in items]


def test_chunks_without_output_do_not_reset_the_between_token_deadline():
    empty = json.dumps({"choices": [{"index": 0, "delta": {}}]})
    items = [(0.0, _token(0))] + [(0.1, empty)] * 10 + [(0.0, _token(1))]
    with pytest.raises(UpstreamError) as e:
        asyncio.run(_read(items))
    assert e.value.status == 504 and "next token within 0.3 s" in e.value.message


def test_a_late_first_token_is_a_504():
    with pytest.raises(UpstreamError) as e:
        asyncio.run(_read([(1.0, _token(0))]))
    assert "first token within 0.3 s" in e.value.message


def test_a_client_that_leaves_ends_the_wait():
    async def go():
        gone = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.05, gone.set_result, None)
        return await _read([(5.0, _token(0))], gone, first_s=10.0)
    with pytest.raises(ClientGone):
        asyncio.run(go())
