"""Builders that tests and benchmarks share and that need the orchestrator's parts (as lhotse ships
`lhotse/testing`): `hosts.Hosts`, several hosts with their own addresses and shaped links on one
machine, each a Ray node (`netns`: their namespaces and links); `cluster`, what a run left on a Ray
cluster, waiting on a condition and a worker node of one's own; `s3`, a real S3 API on loopback;
`groups.FixedLearners`, learner actors outside a job with meetings for their process groups."""
