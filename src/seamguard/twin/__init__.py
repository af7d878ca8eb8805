"""The digital twin: the same cluster model, simulated (a source and an actuator)."""
