"""Builders that tests and benchmarks share and that need the orchestrator's parts (as lhotse ships
`lhotse/testing`): `hosts.Hosts`, several hosts with their own addresses and shaped links on one
machine, each a Ray node."""
