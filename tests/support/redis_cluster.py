"""A real local Redis Cluster for tests and benchmarks: 3 masters + 3 replicas on loopback.

    with running_cluster() as cluster:
        cluster.url                     # seed URL for budgets.store: redis-cluster
        cluster.nodes                   # [ClusterNodeProc(host, port, pid, role), ...]
        cluster.kill(node)              # SIGKILL one node (pause/resume: SIGSTOP/SIGCONT)
        cluster.wait_for_failover()     # a replica took over its slots, cluster_state ok

Each node is `redis-server --cluster-enabled yes` in its own temp dir (no persistence), joined by
`redis-cli --cluster create ... --cluster-replicas 1`; `node_timeout_ms` is small so a replica
takes over about a second after its master dies. Everything started is stopped on exit.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.support.ports import free_port
from tests.support.waiting import wait_for

HOST = "127.0.0.1"


@dataclass
class ClusterNodeProc:
    host: str
    port: int
    pid: int
    role: str  # "master" | "replica" (as of the last refresh()); "dead" once killed
    proc: subprocess.Popen[bytes] = field(repr=False)
    directory: Path = field(repr=False, default=Path("."))

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def client(self) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, socket_timeout=2)


class RunningCluster:
    def __init__(self, nodes: list[ClusterNodeProc], node_timeout_ms: int) -> None:
        self.nodes = nodes
        self.node_timeout_ms = node_timeout_ms

    @property
    def url(self) -> str:
        live = [n for n in self.nodes if n.role != "dead"]
        return f"redis://{live[0].address}/0"

    def masters(self) -> list[ClusterNodeProc]:
        return [n for n in self.nodes if n.role == "master"]

    def client(self) -> redis.RedisCluster:
        """A synchronous cluster client (for setup and checks in tests)."""
        live = next(n for n in self.nodes if n.role != "dead")
        return redis.RedisCluster(host=live.host, port=live.port, socket_timeout=2)

    def delete_prefix(self, prefix: str) -> None:
        """Remove every key under `prefix` from every master (a test's throw-away prefix)."""
        with self.client() as client:
            for key in list(client.scan_iter(match=f"{prefix}:*", count=1000)):
                client.delete(key)

    def master_of_slot(self, slot: int) -> ClusterNodeProc:
        for node in self.nodes:
            if node.role == "dead":
                continue
            with node.client() as c:
                for start, end, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
                    if int(start) <= slot <= int(end):
                        port = int(master[1])
                        return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no node serves slot {slot}")

    def kill(self, node: ClusterNodeProc) -> None:
        """SIGKILL the node: whatever it had not yet sent its replica is gone."""
        node.proc.kill()
        node.proc.wait()
        node.role = "dead"

    def restart(self, node: ClusterNodeProc) -> None:
        """Start a killed node again from its directory: it rejoins as a replica of the master
        that took over (call wait_for_failover first)."""
        node.proc = _start_node(node.directory, node.port, self.node_timeout_ms)
        node.pid = node.proc.pid
        wait_for(lambda: _pings(node.port), timeout_s=30, what=f"redis node {node.port}")
        node.role = "replica"
        wait_for(
            lambda: self.state_ok() and self.replicas_synced(),
            timeout_s=30,
            what=f"node {node.port} to rejoin as a replica",
        )

    def pause(self, node: ClusterNodeProc) -> None:
        """SIGSTOP: the node stops reading (a replica falls behind, as across a slow link)."""
        node.proc.send_signal(signal.SIGSTOP)

    def resume(self, node: ClusterNodeProc) -> None:
        node.proc.send_signal(signal.SIGCONT)

    def replica_of(self, master: ClusterNodeProc) -> ClusterNodeProc:
        with master.client() as c:
            info = c.info("replication")
        port = int(info["slave0"]["port"])
        return next(n for n in self.nodes if n.port == port)

    def state_ok(self) -> bool:
        """cluster_state:ok on every live node and all 16384 slots served by a live master."""
        for node in self.nodes:
            if node.role == "dead":
                continue
            try:
                with node.client() as c:
                    info = c.execute_command("CLUSTER", "INFO")
            except redis.RedisError:
                return False
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text or "cluster_slots_ok:16384" not in text:
                return False
        return True

    def replicas_synced(self) -> bool:
        """Every live replica's link to its master is up (else it cannot take over)."""
        for node in self.nodes:
            if node.role != "replica":
                continue
            with node.client() as c:
                if c.info("replication").get("master_link_status") != "up":
                    return False
        return True

    def refresh(self) -> None:
        """Re-read every live node's role (after a failover a replica is a master)."""
        for node in self.nodes:
            if node.role == "dead":
                continue
            with node.client() as c:
                role = c.execute_command("ROLE")[0]
            node.role = (
                "master"
                if (role.decode() if isinstance(role, bytes) else role) == "master"
                else "replica"
            )

    def wait_for_failover(self, timeout_s: float = 30.0) -> None:
        """Block until every slot is served again (a replica took over the dead master's)."""

        def healed() -> bool:
            if not self.state_ok():
                return False
            self.refresh()
            return len(self.masters()) == 3

        wait_for(healed, timeout_s=timeout_s, what="cluster failover")


def _start_node(directory: Path, port: int, node_timeout_ms: int) -> subprocess.Popen[bytes]:
    directory.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            HOST,
            "--dir",
            str(directory),
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            str(directory / "nodes.conf"),
            "--cluster-node-timeout",
            str(node_timeout_ms),
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            str(directory / "redis.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def _start_free_node(
    tmp: Path, taken: list[int], node_timeout_ms: int, timeout_s: float
) -> tuple[int, subprocess.Popen[bytes]]:
    """Start one node on a port whose cluster bus port (port + 10000) is free as well; a node
    that exits at start (its port was taken in the meantime) is retried on another port."""
    for _ in range(10):
        port = free_port()
        if port in taken or port + 10000 > 65535 or not _bindable(port + 10000):
            continue
        proc = _start_node(tmp / str(port), port, node_timeout_ms)
        wait_for(
            lambda pr=proc, p=port: pr.poll() is not None or _pings(p),
            timeout_s=timeout_s,
            what=f"redis node {port}",
        )
        if proc.poll() is None:
            return port, proc
    raise RuntimeError("could not start a redis cluster node on a free port pair")


def _pings(port: int) -> bool:
    try:
        with redis.Redis(host=HOST, port=port, socket_timeout=1) as c:
            return bool(c.ping())
    except redis.RedisError:
        return False


@contextmanager
def running_cluster(
    masters: int = 3,
    replicas_per_master: int = 1,
    node_timeout_ms: int = 1000,
    timeout_s: float = 60.0,
) -> Iterator[RunningCluster]:
    """Start a cluster, wait for cluster_state:ok on every node, yield it, stop it."""
    for tool in ("redis-server", "redis-cli"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is not installed")
    tmp = Path(tempfile.mkdtemp(prefix="cr-cluster-"))
    count = masters * (1 + replicas_per_master)
    ports: list[int] = []
    procs: list[subprocess.Popen[bytes]] = []
    nodes: list[ClusterNodeProc] = []
    try:
        while len(ports) < count:
            port, proc = _start_free_node(tmp, ports, node_timeout_ms, timeout_s)
            ports.append(port)
            procs.append(proc)
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"{HOST}:{p}" for p in ports),
                "--cluster-replicas",
                str(replicas_per_master),
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=timeout_s,
        )
        nodes = [
            ClusterNodeProc(HOST, port, proc.pid, "replica", proc, tmp / str(port))
            for port, proc in zip(ports, procs, strict=True)
        ]
        cluster = RunningCluster(nodes, node_timeout_ms)

        def formed() -> bool:
            if not cluster.state_ok():
                return False
            cluster.refresh()
            return len(cluster.masters()) == masters and cluster.replicas_synced()

        wait_for(formed, timeout_s=timeout_s, what="cluster_state:ok")
        yield cluster
    finally:
        for proc in procs + [n.proc for n in nodes]:  # restarted nodes have new processes
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
