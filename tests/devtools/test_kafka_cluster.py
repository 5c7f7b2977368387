"""devtools/kafka_cluster.py without starting it: what each node's server.properties says."""

from __future__ import annotations

from devtools.kafka_cluster import KafkaCluster
from devtools.kafka_distribution import KafkaDistribution


def test_three_nodes_share_a_static_quorum_a_cluster_id_and_production_topic_settings(tmp_path) -> None:
    cluster = KafkaCluster(KafkaDistribution(tmp_path / "unresolved"), run_dir=tmp_path / "cluster")
    rendered = [node.properties.as_dict() for node in cluster.nodes.values()]
    assert [props["node.id"] for props in rendered] == ["1", "2", "3"]
    voters = {props["controller.quorum.voters"] for props in rendered}
    assert len(voters) == 1 and voters.pop().count("@127.0.0.1:") == 3
    assert all("controller.quorum.bootstrap.servers" not in props for props in rendered)
    assert len({node.cluster_id for node in cluster.nodes.values()}) == 1
    for props in rendered:
        assert props["default.replication.factor"] == "3"
        assert props["min.insync.replicas"] == "2"
        assert props["unclean.leader.election.enable"] == "false"
        assert props["offsets.topic.replication.factor"] == "3"
        assert props["transaction.state.log.min.isr"] == "2"
        assert props["auto.create.topics.enable"] == "false"
    assert cluster.bootstrap_servers.count(",") == 2
