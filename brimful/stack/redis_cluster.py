"""Forming a Redis Cluster out of ``redis-server`` processes started in cluster mode: the
hash slots split evenly between the masters, which then meet over their cluster bus."""

from __future__ import annotations

from dataclasses import dataclass

import redis

SLOTS = 16384


@dataclass(frozen=True)
class ClusterNode:
    """One master: its client port and its cluster-bus port."""

    port: int
    bus_port: int


def server_args(node: ClusterNode) -> list[str]:
    """What ``redis-server`` needs, beyond port and storage, to run as this node."""
    return [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",  # in the node's own --dir
        "--cluster-port",
        str(node.bus_port),  # explicit: port + 10000 may be taken or out of range
        "--cluster-node-timeout",
        "2000",
    ]


def form_cluster(nodes: list[ClusterNode]) -> None:
    """Give each node an equal share of the slots and introduce it to the first node.
    Each node must be up and empty; ``cluster_ready`` says when the cluster serves."""
    share = SLOTS // len(nodes)
    for index, node in enumerate(nodes):
        first = index * share
        last = SLOTS - 1 if index == len(nodes) - 1 else first + share - 1
        with redis.Redis(port=node.port, socket_timeout=5) as client:
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
    with redis.Redis(port=nodes[0].port, socket_timeout=5) as client:
        for node in nodes[1:]:
            client.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port)


def cluster_ready(nodes: list[ClusterNode]) -> bool:
    """Every node knows every other and serves all the slots."""
    try:
        for node in nodes:
            with redis.Redis(port=node.port, socket_timeout=1) as client:
                info = client.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text or f"cluster_known_nodes:{len(nodes)}" not in text:
                    return False
    except redis.RedisError:
        return False
    return True
