"""`seamguard agent`: the per-node Prometheus exporter (docs/agent.md).

One process per node exports what the controller reads and no standard exporter gives:
kernel-log XID/SXID/fallen-off-the-bus counts, NIC state in node_exporter's names, a
storage probe per checkpoint path, a Pingmesh-style fabric probe per rail, and host
pressure. The parsers here are pure functions (text in, records out); the samplers and
collectors around them do the I/O. Nothing in the control-plane core imports this package.
"""
