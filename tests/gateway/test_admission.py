"""Decision tables for the pure admission arithmetic (seamguard.gateway.admission)."""

from __future__ import annotations

import pytest

from seamguard.gateway.admission import (
    Counters,
    Limits,
    estimate_prompt_tokens,
    fits,
    minute_used,
    requested_output_tokens,
    shed_share,
    windows,
)


@pytest.mark.parametrize("counters,limits,amount,elapsed,share,ok,reason", [
    (Counters(), Limits(), 10**9, 0, 1.0, True, ""),                                    # unlimited
    (Counters(900, 0, 900, 0), Limits(tpm=1000), 100, 30, 1.0, True, ""),               # exactly fits
    (Counters(900, 0, 900, 0), Limits(tpm=1000), 101, 30, 1.0, False, "key tpm"),
    (Counters(0, 1000, 1000, 0), Limits(tpm=1000), 100, 5, 1.0, False, "key tpm"),      # 917 of prev still in
    (Counters(0, 1000, 1000, 0), Limits(tpm=1000), 100, 6, 1.0, True, ""),              # 900 of prev: just fits
    (Counters(0, 0, 0, 0), Limits(tpm=1000), 1001, 0, 1.0, False, "key tpm"),           # never fits
    (Counters(0, 0, 990, 0), Limits(tpd=1000), 11, 0, 1.0, False, "key tpd"),
    (Counters(0, 0, 0, 4), Limits(concurrency=4), 1, 0, 1.0, False, "key concurrency"),
    (Counters(0, 0, 0, 3), Limits(concurrency=4), 1, 0, 1.0, True, ""),
    (Counters(700, 0, 700, 0), Limits(tpm=1000), 150, 0, 0.8, False, "key shed"),       # within tpm, over share
    (Counters(700, 0, 700, 0), Limits(tpm=1000), 350, 0, 0.8, False, "key tpm"),        # over tpm itself
    (Counters(700, 0, 700, 0), Limits(tpm=1000), 100, 0, 0.8, True, ""),
])
def test_fits(counters, limits, amount, elapsed, share, ok, reason):
    v = fits(counters, limits, amount, elapsed, 0.0, share)
    assert (v.ok, v.reason) == (ok, reason)
    if not ok:
        assert v.retry_after_s >= 1


@pytest.mark.parametrize("counters,amount,elapsed,retry", [
    (Counters(0, 1000, 0, 0), 100, 0, 6),      # previous bucket must decay to 900: 6 s in
    (Counters(500, 1000, 0, 0), 100, 30, 6),   # 500 + 1000 (1 - t/60) <= 900 -> t = 36
    (Counters(1000, 0, 0, 0), 100, 30, 36),    # boundary in 30 s, then 1000 decays to 900 in 6 s
])
def test_retry_after_is_when_it_would_fit(counters, amount, elapsed, retry):
    v = fits(counters, Limits(tpm=1000), amount, elapsed, 0.0)
    assert not v.ok and v.retry_after_s == retry
    assert minute_used(counters, elapsed + retry) + amount <= 1000 or elapsed + retry >= 60


def test_tpd_retry_after_is_the_next_utc_day():
    assert fits(Counters(day=1000), Limits(tpd=1000), 1, 0, 86400 - 100).retry_after_s == 100


@pytest.mark.parametrize("body,tokens", [
    ({"messages": [{"role": "user", "content": "x" * 400}]}, 104),
    ({"messages": [{"role": "system", "content": "abc"}, {"role": "user", "content": "abcd"}]}, 2 + 8),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "y" * 40},
                                                  {"type": "image_url", "image_url": {"url": "u"}}]}]}, 10 + 85 + 4),
    ({"prompt": "z" * 9}, 3),
    ({"prompt": ["ab", "cd"]}, 1),
    ({"prompt": [101, 2023, 2003, 102]}, 4),
    ({"prompt": [[1, 2, 3], [4, 5]]}, 5),
    ({}, 0),
])
def test_prompt_estimate(body, tokens):
    assert estimate_prompt_tokens(body) == tokens


@pytest.mark.parametrize("body,out", [({}, 512), ({"max_tokens": 7}, 7), ({"max_completion_tokens": 9,
                                                                          "max_tokens": 7}, 9),
                                      ({"max_tokens": True}, 512), ({"max_tokens": 0}, 512)])
def test_requested_output(body, out):
    assert requested_output_tokens(body, 512) == out


def test_shed_order_and_windows():
    assert shed_share("low", 0.8, 0.95) < shed_share("normal", 0.8, 0.95) < shed_share("high", 0.8, 0.95) == 1.0
    assert windows(86400.0 * 3 + 61.5) == (3 * 1440 + 1, 1.5, 3, 61.5)
