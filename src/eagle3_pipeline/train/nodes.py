"""Training over several nodes: which node this is, the torchrun agent's arguments, and
what a failed rendezvous or a lost node means, in one line.

Every node runs the same train stage on the same ``params.yaml`` (``hardware.nodes=N``);
what differs between nodes is not a parameter but where the stage runs, so it comes from
the environment, as torchrun's own ``MASTER_ADDR`` does::

    EAGLE3_NODE_RANK=r EAGLE3_MASTER_ADDR=$NODE0 python -m eagle3_pipeline.stages.train --params params.yaml

Each node's stage starts one torchrun agent (``--nnodes N --node_rank r``, the static
rendezvous on ``$NODE0:EAGLE3_MASTER_PORT``); node 0's stage records the run (the draft,
the details, the curves), the others only train. torchrun itself reports a node that never
came as a traceback that does not say which one, and a node that died as a worker's
``ChildFailedError``: :func:`failure` turns both into the line the stage prints last.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from eagle3_pipeline.core.errors import StageError

NODE_RANK_ENV = "EAGLE3_NODE_RANK"
MASTER_ADDR_ENV = "EAGLE3_MASTER_ADDR"
MASTER_PORT_ENV = "EAGLE3_MASTER_PORT"
JOIN_TIMEOUT_ENV = "EAGLE3_JOIN_TIMEOUT_S"
MASTER_PORT = 29500  # torchrun's default
JOIN_TIMEOUT_S = 600  # torchrun's static rendezvous default: nodes start by hand


@dataclass(frozen=True)
class Node:
    """This node's place in a run over ``nodes`` nodes."""

    nodes: int
    rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = MASTER_PORT
    join_timeout_s: int = JOIN_TIMEOUT_S

    @property
    def main(self) -> bool:
        """Node 0: hosts the rendezvous and records the run."""
        return self.rank == 0

    @property
    def endpoint(self) -> str:
        return f"{self.master_addr}:{self.master_port}"

    def torchrun_args(self) -> list[str]:
        """The agent's rendezvous arguments (``--standalone`` for one node)."""
        if self.nodes <= 1:
            return ["--standalone"]
        return [
            f"--nnodes={self.nodes}",
            f"--node_rank={self.rank}",
            f"--master_addr={self.master_addr}",
            f"--master_port={self.master_port}",
            f"--rdzv_conf=timeout={self.join_timeout_s}",
            "--max_restarts=0",  # a lost node stops the run; the rerun resumes
        ]


def node_env(rank: int | str, master_addr: str, master_port: int = MASTER_PORT) -> str:
    """The environment prefix of node ``rank``'s command, as the plan prints it."""
    return f"{NODE_RANK_ENV}={rank} {MASTER_ADDR_ENV}={master_addr} {MASTER_PORT_ENV}={master_port}"


def this_node(nodes: int, env: dict[str, str] | None = None) -> Node:
    """This node from ``EAGLE3_*`` (see the module doc); one node needs none of them. A
    missing or malformed variable is a :class:`StageError` naming it."""
    env = dict(os.environ) if env is None else env
    if nodes <= 1:
        return Node(1)
    hint = (
        f"hardware.nodes={nodes}: every node runs the stage with {NODE_RANK_ENV} (0..{nodes - 1}) "
        f"and {MASTER_ADDR_ENV} (node 0's address) set; `eagle3-plan` prints each node's command"
    )
    for name in (NODE_RANK_ENV, MASTER_ADDR_ENV):
        if not env.get(name):
            raise StageError(f"{name} is not set: {hint}")
    try:
        rank = int(env[NODE_RANK_ENV])
        port = int(env.get(MASTER_PORT_ENV) or MASTER_PORT)
        timeout = int(env.get(JOIN_TIMEOUT_ENV) or JOIN_TIMEOUT_S)
    except ValueError as exc:
        raise StageError(f"{exc}: {hint}") from None
    if not 0 <= rank < nodes:
        raise StageError(f"{NODE_RANK_ENV}={rank} is not in 0..{nodes - 1}: {hint}")
    if timeout < 1:
        raise StageError(f"{JOIN_TIMEOUT_ENV}={timeout} must be >= 1 (seconds)")
    return Node(nodes, rank, env[MASTER_ADDR_ENV], port, timeout)


_JOINED = re.compile(r"waiting for clients\. (\d+)/(\d+) clients joined")
_NO_MASTER = re.compile(r"timed out after \d+ms while trying to connect to|Connection refused")
_PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|lost contact with another rank|"
    r"DistNetworkError|DistBackendError"
)


def failure(node: Node, rc: int, stderr_tail: str) -> str:
    """The stage's last line when this node's torchrun exited with ``rc``, from what it
    printed (``stderr_tail``)."""
    where = f"node {node.rank} of {node.nodes}" if node.nodes > 1 else "this node"
    if node.nodes > 1:
        joined = _JOINED.search(stderr_tail)
        if joined:
            n, total = int(joined.group(1)), int(joined.group(2))
            missing = "node rank 1" if total == 2 else f"{total - n} of node ranks 1..{total - 1}"
            return (
                f"{where}: only {n} of {total} nodes joined the rendezvous at {node.endpoint} "
                f"within {node.join_timeout_s} s: {missing} never joined; start "
                f"{'its command (' + NODE_RANK_ENV + '=1 ...)' if total == 2 else 'their commands'}"
                f" or check that they reach {node.endpoint}"
            )
        if (
            not node.main
            and _NO_MASTER.search(stderr_tail)
            and "ChildFailedError" not in stderr_tail
        ):
            return (
                f"{where}: node rank 0 never answered at {node.endpoint} within "
                f"{node.join_timeout_s} s: start node 0's command ({NODE_RANK_ENV}=0 ...), "
                f"or check {MASTER_ADDR_ENV}/{MASTER_PORT_ENV}"
            )
        if _PEER_LOST.search(stderr_tail):
            return (
                f"{where}: the training stopped because another node's worker was lost "
                f"(torchrun exit code {rc}): rerun every node's command; training resumes "
                "from the last checkpoint"
            )
    if rc < 0 or rc > 128:
        sig = -rc if rc < 0 else rc - 128
        return (
            f"torchrun on {where} was stopped by signal {sig}: rerun the stage; training "
            "resumes from the last checkpoint"
        )
    return f"training workers failed on {where} (torchrun exit code {rc}); see above"
