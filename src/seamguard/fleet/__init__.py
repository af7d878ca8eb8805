"""The cluster model: entities, containment, fabric, storage, jobs (see fleet.model)."""

from seamguard.fleet.generate import FleetShape, generate_fleet
from seamguard.fleet.model import JOB_CLASS_SYNCHRONY, Fleet, JobClass, Kind, SwitchTier
from seamguard.fleet.topology import TopologyError, fleet_to_topology, parse_topology

__all__ = ["Fleet", "FleetShape", "JOB_CLASS_SYNCHRONY", "JobClass", "Kind", "SwitchTier", "TopologyError",
           "fleet_to_topology", "generate_fleet", "parse_topology"]
