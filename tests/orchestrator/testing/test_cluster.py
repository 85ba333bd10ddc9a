"""What the tests' per-test check and the benchmarks' per-run check read of a cluster
(orchestrator/testing/cluster.py): what a run added since a `holdings()` (actors, placement
groups, nodes, resources still held), whose it is, and that `take_away` removes all of it."""

import pytest

from orchestrator.testing.cluster import added_since, described, holdings, settled_since, take_away

pytestmark = [pytest.mark.slow, pytest.mark.own_process]  # it adds and removes a node: a cluster of its own


def test_what_a_run_added_is_found_named_and_taken_away(private_cluster):
    import ray
    from ray.util.placement_group import placement_group

    @ray.remote(num_cpus=1)
    class Holder:
        def ping(self) -> int:
            return 1

    before = holdings(nodes=True)
    assert not settled_since(before, grace_s=0.0)
    holder = Holder.options(name="left-behind").remote()
    ray.get(holder.ping.remote())
    group = placement_group([{"CPU": 1}], name="left-group")
    ray.get(group.ready())
    node = private_cluster.add_node(num_cpus=1)
    private_cluster.wait_for_nodes()

    left = added_since(before)
    assert set(left) == {"actors", "placement groups", "nodes", "held resources"}, left
    assert left["nodes"] == {node.node_id} and left["held resources"] == {"CPU 2.0"}
    named = described(left)
    assert [a.rpartition(".")[2] for a in named["actors"]] == ["Holder left-behind"]  # (its qualname)
    assert named["placement groups"] == ["left-group (CREATED)"]
    assert not set(added_since(holdings())) - {"actors", "placement groups"}  # without nodes: those kinds only

    take_away(left, private_cluster)
    assert not settled_since(before, grace_s=30.0), added_since(before)
    assert node not in private_cluster.worker_nodes
