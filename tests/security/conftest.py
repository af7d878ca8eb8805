"""Attacks on every port and input seamguard opens, one test each.

Each test is one attack, written the way `benchmarks/adversary.py` reads it back:
- the docstring's first line names the attack;
- a docstring line starting ``Refused:`` says what seamguard must do instead;
- the test calls ``observed("...")`` with what actually happened (status, tokens charged,
  what was logged) *before* it asserts, so a bypass is reported with its evidence.

Gateway attacks go through the real HTTP gateway with the ``openai`` client, against the
vLLM-like stand-in backend (`seamguard.testbed.openai_backend`), with Redis started here.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.conftest import backend, gateway_factory, redis_url  # noqa: F401  (fixtures shared with tests/gateway)


@pytest.fixture
def observed(record_property: Callable[[str, object], None]) -> Callable[[str], None]:
    """observed(text): what the attack got, recorded for benchmarks/adversary.py's table."""
    def note(text: str) -> None:
        record_property("observed", text)
    return note
