"""seamguard: keeps large AI clusters productive when they fail gray, not cleanly.

The package follows one direction of data flow (see docs/architecture.md):
fleet -> observe -> assess -> decide -> act, with every step recorded by ledger.
twin, runtime and service sit on top of that core and never the other way round.
"""

__version__ = "0.1.0"
