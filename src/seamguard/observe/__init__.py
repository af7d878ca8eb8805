"""Observation: the Frame every source produces and the signal registry it follows."""

from seamguard.observe.frame import Frame, FrameError, make_frame
from seamguard.observe.history import History
from seamguard.observe.signals import REGISTRY, SIGNALS, Domain, Signal, signals_for

__all__ = ["Domain", "Frame", "FrameError", "History", "REGISTRY", "SIGNALS", "Signal", "make_frame", "signals_for"]
