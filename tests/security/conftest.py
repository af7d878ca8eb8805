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


def attack_card(doc: str | None) -> tuple[str, str]:
    """(attack, refusal) from an attack test's docstring; ValueError names what is missing."""
    lines = [ln.strip() for ln in (doc or "").strip().splitlines()]
    attack = lines[0] if lines and lines[0] else ""
    refused = " ".join(ln[len("Refused:"):].strip() for ln in lines if ln.startswith("Refused:"))
    if not attack or not refused:
        raise ValueError("an attack test's docstring needs the attack on its first line and a 'Refused:' line")
    return attack, refused


@pytest.fixture(autouse=True)
def _attack_card(request: pytest.FixtureRequest, record_property: Callable[[str, object], None]) -> None:
    """Records each test's attack and expected refusal beside what it observed."""
    try:
        attack, refused = attack_card(request.function.__doc__)
    except ValueError as e:
        pytest.fail(f"{request.node.nodeid}: {e}")
    record_property("attack", attack)
    record_property("refused", refused)


@pytest.fixture
def observed(record_property: Callable[[str, object], None]) -> Callable[[str], None]:
    """observed(text): what the attack got, recorded for benchmarks/adversary.py's table."""
    def note(text: str) -> None:
        record_property("observed", text)
    return note
