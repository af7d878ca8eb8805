"""The durable record of transitions, decisions, actions and controller state."""

from seamguard.ledger.sqlite import Ledger

__all__ = ["Ledger"]
