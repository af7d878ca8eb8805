"""How long a lease holder may act after a renewal: the arithmetic both elections share.

Why this exists: the control plane's HA controller (app/leader.py) and a job's coordinator
election (runtime/election.py) each hold an etcd key on a lease and must stop acting before
etcd can let a successor in, with no message needed. A renewal (or grant) sent at monotonic
time t means the lease ends no earlier than ``t + lease_s``; the holder acts until
``t + lease_s * ACT_SHARE``, a third of a lease before that, whatever delayed the next
renewal (cut off, starved of CPU, etcd down). Both sides use this one definition; it is in
the bottom layer because the runtime may not import the control plane.
"""

from __future__ import annotations

from dataclasses import dataclass

ACT_SHARE = 2.0 / 3.0   # of the lease: how long after a renewal's send the holder may still act
RENEWALS_PER_LEASE = 4  # renewals sent per lease period


@dataclass(frozen=True)
class Term:
    """What a holder last knew: it may act with ``token`` until ``act_until_s`` (monotonic
    seconds), or not at all (token 0)."""

    token: int = 0
    act_until_s: float = 0.0

    def may_act(self, now_s: float) -> bool:
        return self.token > 0 and now_s < self.act_until_s


def renewed(token: int, sent_s: float, lease_s: float) -> Term:
    """The term a lease renewal (or grant) sent at ``sent_s`` gives: acting stops a third of
    a lease before the lease can end."""
    return Term(token, sent_s + lease_s * ACT_SHARE)
