"""The controller's breaker as the event twin runs it: fleet-wide bounds on what seamguard takes out.

Why this file exists: a what-if on a breaker bound (twin/whatif.py) needs the twin's
controller to be held the way the live one is (decide/breaker.py): every node the controller
restricts — a degraded node drained, a loop's nodes evacuated, a node drained on pre-failure
evidence — counts against a rate bound (nodes newly restricted within the window) and a total
(nodes restricted at once); the first restriction past either trips it and, tripped, it holds
every later one. Only the fleet-wide bounds are modelled (the twin has no racks or leaves to
bound), and nobody resets it inside a run. Called by the simulator's control-plane handlers.
"""

from __future__ import annotations

from collections import deque

from seamguard.twin.events.config import ControllerSettings

__all__ = ["TwinBreaker"]


class TwinBreaker:
    """Admit or hold each restriction the controller asks for, in time order."""

    def __init__(self, c: ControllerSettings, nodes: int) -> None:
        def cap(share: float) -> int:
            return min(max(int(share * nodes), c.breaker_min_nodes), nodes)

        self.rate_cap = cap(c.breaker_max_fleet_fraction)
        self.total_cap = cap(c.breaker_max_in_effect_fleet_fraction)
        self.window_s = c.breaker_window_s
        self._recent: deque[tuple[float, int]] = deque()   # (admitted at, nodes)
        self._effect: list[tuple[float, int]] = []          # (restricted until, nodes)
        self.tripped_at: float | None = None
        self.held_nodes = 0
        self.admitted_nodes = 0

    def admit(self, t: float, n: int, until: float) -> bool:
        """Whether ``n`` nodes may be restricted at ``t`` (until ``until``); a hold is counted."""
        if self.tripped_at is None:
            while self._recent and self._recent[0][0] <= t - self.window_s:
                self._recent.popleft()
            self._effect = [(u, k) for u, k in self._effect if u > t]
            rate = sum(k for _, k in self._recent)
            total = sum(k for _, k in self._effect)
            if rate + n <= self.rate_cap and total + n <= self.total_cap:
                self._recent.append((t, n))
                self._effect.append((until, n))
                self.admitted_nodes += n
                return True
            self.tripped_at = t
        self.held_nodes += n
        return False
