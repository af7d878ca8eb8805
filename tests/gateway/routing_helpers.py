"""What the seamguard router's decision tables share: an injected clock, requests left in
flight, and a request finished with a given TPOT."""

from __future__ import annotations

from seamguard.gateway.routing import Outcome

FAST = 0.03  # a healthy transfer / first token, seconds


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def hold(router, clock, n, cls="interactive"):
    """n requests of class cls routed and left in flight."""
    out = []
    for _ in range(n):
        clock.t += 0.01
        out.append(router.route(cls, 200))
    return out


def finish(router, route, tpot_s):
    router.first_token(route, FAST)
    router.finished(route, Outcome(True, ttft_s=0.1, tpot_s=tpot_s, decode_first_token_s=FAST, output_tokens=20))
