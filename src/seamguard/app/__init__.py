"""The shell: everything that reads flags, files, environment and the wall clock.

The CLI, the run config, the one runner (used by `run`, `serve` and the twin service),
replay and the HTTP service live here; the stages below never reach up into them.
"""
