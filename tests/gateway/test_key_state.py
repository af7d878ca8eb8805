"""A replica's key state after a Redis loss: the merge of Redis's record and the durable one, as a decision table."""

from __future__ import annotations

import pytest

from seamguard.gateway.store import KeyRecord, merge_key_records

SUSPENDED = KeyRecord("suspended", None, "leaked", 100.0, "zombie-detector")
THROTTLED = KeyRecord("throttled", 1500, "volume", 100.0, "zombie-detector")
NO_RECORD = KeyRecord()  # what Redis answers once it lost the key's hash


@pytest.mark.parametrize(("shared", "kept", "wins", "downgrade"), [
    (NO_RECORD, None, NO_RECORD, False),                                                   # nothing known anywhere
    (NO_RECORD, SUSPENDED, SUSPENDED, True),                                               # Redis lost a suspension
    (NO_RECORD, THROTTLED, THROTTLED, True),                                               # ... or a throttle
    (KeyRecord("ok", None, "stale", 50.0, "operator"), SUSPENDED, SUSPENDED, True),        # an older record
    (KeyRecord("ok", None, "lifted", 200.0, "operator"), SUSPENDED,
     KeyRecord("ok", None, "lifted", 200.0, "operator"), False),                           # an operator's later unsuspend
    (KeyRecord("ok", None, "no departure", 200.0, "zombie-detector"), THROTTLED,
     KeyRecord("ok", None, "no departure", 200.0, "zombie-detector"), False),              # the throttle lifted itself
    (KeyRecord("ok", None, "", 200.0, ""), SUSPENDED, SUSPENDED, True),                    # no one's step
    (SUSPENDED, KeyRecord("ok", None, "lifted", 50.0, "operator"), SUSPENDED, False),      # stricter in Redis: adopted
    (NO_RECORD, KeyRecord("ok", None, "lifted", 200.0, "operator"),
     KeyRecord("ok", None, "lifted", 200.0, "operator"), False),                           # same rank: the newer
    (KeyRecord("throttled", 900, "v", 300.0, "zombie-detector"), THROTTLED,
     KeyRecord("throttled", 900, "v", 300.0, "zombie-detector"), False),
])
def test_the_stricter_state_wins_unless_a_later_step_lifted_it(shared, kept, wins, downgrade):
    assert merge_key_records(shared, kept) == (wins, downgrade)
