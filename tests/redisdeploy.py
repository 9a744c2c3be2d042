"""Real Redis deployments for the tests, on free loopback ports: a 3-master + 3-replica
Cluster, a master with replicas watched by 3 sentinels, a TLS server with its own CA.

Each class starts real ``redis-server`` / ``redis-sentinel`` processes in a temporary folder
and stops every one of them in :meth:`stop` (also on a failed start); use them as context
managers.  Nothing is faked.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import redis
from support import free_port, stop_process

NODE_TIMEOUT_MS = 2000
"""cluster-node-timeout: a killed master is failed over by its replica after ~2-4 s."""


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


class _Processes:
    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}  # port -> process

    def _spawn(self, port: int, args: list[str], binary: str = "redis-server") -> None:
        exe = shutil.which(binary)
        if exe is None:
            raise RuntimeError(f"{binary} is not installed (apt-get install redis-server "
                               "redis-sentinel)")
        node_dir = self.workdir / str(port)
        node_dir.mkdir(exist_ok=True)
        self.procs[port] = subprocess.Popen(
            [exe, *args], cwd=node_dir, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True)

    def _server(self, port: int, *extra: str) -> None:
        node_dir = self.workdir / str(port)
        node_dir.mkdir(exist_ok=True)
        self._spawn(port, ["--port", str(port), "--bind", "127.0.0.1", "--save", "",
                           "--appendonly", "no", "--dir", str(node_dir),
                           # a replica syncs at once (Redis waits 5 s by default)
                           "--repl-diskless-sync-delay", "0",
                           "--logfile", str(node_dir / "redis.log"), *extra])

    def kill(self, port: int) -> None:
        """SIGKILL the process on *port* (no shutdown, like a machine dying) and reap it."""
        proc = self.procs[port]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def log(self, port: int) -> str:
        path = self.workdir / str(port) / "redis.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        for proc in self.procs.values():
            stop_process(proc, timeout=5)

    def __enter__(self) -> Any:
        try:
            self.start()  # type: ignore[attr-defined]
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _cluster_port() -> int:
    """A free port <= 55535 whose cluster bus port (port + 10000) is free too."""
    import socket

    for _ in range(1000):
        port = free_port()
        if port > 55535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisClusterSet(_Processes):
    """6 ``redis-server --cluster-enabled yes``: 3 masters, one replica each."""

    def __init__(self, workdir: Path, masters: int = 3, tls: TlsFiles | None = None) -> None:
        super().__init__(workdir)
        self.ports = [_cluster_port() for _ in range(masters * 2)]
        self.masters = masters
        self.tls = tls

    @property
    def url(self) -> str:
        """Every node as a start-up node: a client made while one is down still starts.
        With TLS: ``rediss+cluster://`` and the CA."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        if self.tls is None:
            return f"redis+cluster://{hosts}"
        return f"rediss+cluster://{hosts}?ssl_ca_certs={self.tls.ca}"

    @property
    def one_node_url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def node(self, port: int, timeout: float = 1.0) -> redis.Redis:
        """A plain client of one node (TLS when the cluster uses it)."""
        if self.tls is None:
            return redis.Redis(port=port, socket_timeout=timeout)
        return redis.Redis(port=port, socket_timeout=timeout, ssl=True,
                           ssl_ca_certs=str(self.tls.ca))

    def start(self) -> RedisClusterSet:
        for port in self.ports:
            tls: list[str] = []
            if self.tls is not None:  # nodes, bus and replication over TLS only
                tls = ["--port", "0", "--tls-port", str(port), "--tls-cluster", "yes",
                       "--tls-replication", "yes", "--tls-auth-clients", "no",
                       "--tls-cert-file", str(self.tls.server_cert),
                       "--tls-key-file", str(self.tls.server_key),
                       "--tls-ca-cert-file", str(self.tls.ca)]
            self._server(port, *tls, "--cluster-enabled", "yes",
                         "--cluster-config-file", f"nodes-{port}.conf",
                         "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                         # a replica may always take over, however stale (test only)
                         "--cluster-replica-validity-factor", "0")
        for port in self.ports:
            _wait(lambda p=port: self.node(p, 1).ping(), 20,
                  f"cluster node {port}")
        tls_cli = [] if self.tls is None else ["--tls", "--cacert", str(self.tls.ca)]
        create = subprocess.run(
            ["redis-cli", *tls_cli, "--cluster", "create",
             *(f"127.0.0.1:{p}" for p in self.ports), "--cluster-replicas", "1",
             "--cluster-yes"],
            capture_output=True, text=True, timeout=60)
        if create.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{create.stdout}"
                               f"{create.stderr}")
        self.wait_ok()
        return self

    def alive_ports(self) -> list[int]:
        return [p for p in self.ports if self.procs[p].poll() is None]

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says cluster_state:ok and every live replica is in sync
        with its master."""
        def ok() -> bool:
            for port in self.alive_ports():
                client = self.node(port, 1)
                if client.cluster("info").get("cluster_state") != "ok":
                    return False
                replication = client.info("replication")
                if replication["role"] == "slave" and (
                        replication.get("master_link_status") != "up"
                        and replication.get("master_port") in self.alive_ports()):
                    return False
            return True
        _wait(ok, timeout, "cluster_state:ok")

    def master_port_of(self, key: str) -> int:
        """Port of the master that serves *key*'s slot now."""
        port = self.alive_ports()[0]
        client = self.node(port, 2)
        slot = client.cluster("keyslot", key)
        for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
            if int(start) <= slot <= int(end):
                return int(master[1])
        raise RuntimeError(f"no master serves slot {slot}")

    def replica_of(self, master_port: int) -> int:
        """Port of the replica of the master on *master_port*."""
        for port in self.alive_ports():
            info = self.node(port, 1).info("replication")
            if info["role"] == "slave" and int(info["master_port"]) == master_port:
                return port
        raise RuntimeError(f"no replica of {master_port}")

    def wait_failover(self, old_port: int, key: str, timeout: float = 30.0) -> int:
        """Until a node other than *old_port* serves *key*'s slot and the cluster is ok;
        returns the new master's port."""
        _wait(lambda: self.master_port_of(key) != old_port, timeout,
              f"a replica taking over from {old_port}")
        self.wait_ok(timeout)
        return self.master_port_of(key)


class SentinelSet(_Processes):
    """A master, *replicas* replicas and 3 sentinels monitoring it as *service*."""

    def __init__(self, workdir: Path, replicas: int = 1, service: str = "fleetmaster",
                 down_after_ms: int = 1000, failover_timeout_ms: int = 5000) -> None:
        super().__init__(workdir)
        self.master_port = free_port()
        self.replica_ports = [free_port() for _ in range(replicas)]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.service = service
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def start(self) -> SentinelSet:
        self._server(self.master_port)
        for port in self.replica_ports:
            self._server(port, "--replicaof", "127.0.0.1", str(self.master_port))
        _wait(lambda: all(
            redis.Redis(port=p, socket_timeout=1).info("replication")["master_link_status"]
            == "up" for p in self.replica_ports), 20, "replicas in sync")
        for port in self.sentinel_ports:
            node_dir = self.workdir / str(port)
            node_dir.mkdir(exist_ok=True)
            conf = node_dir / "sentinel.conf"  # sentinels rewrite their file: one each
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {node_dir}\n"
                f"logfile {node_dir / 'redis.log'}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {self.master_port} 2\n"
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {self.service} 1\n")
            self._spawn(port, [str(conf)], binary="redis-sentinel")
        _wait(lambda: all(self._sentinels_known(p) for p in self.sentinel_ports), 30,
              "sentinels discovering each other and the replicas")
        return self

    def _sentinels_known(self, port: int) -> bool:
        master = redis.Redis(port=port, socket_timeout=1).sentinel_master(self.service)
        return (int(master["num-other-sentinels"]) == 2
                and int(master["num-slaves"]) == len(self.replica_ports))

    def current_master_port(self) -> int:
        for port in self.sentinel_ports:
            if self.procs[port].poll() is None:
                try:
                    client = redis.Redis(port=port, socket_timeout=1)
                    _, master = client.sentinel_get_master_addr_by_name(self.service)
                    return int(master)
                except redis.RedisError:
                    continue
        raise RuntimeError("no sentinel answers")

    def wait_failover(self, old_port: int, timeout: float = 30.0) -> int:
        """Until the sentinels name a new master and it accepts writes; returns its port."""
        _wait(lambda: self.current_master_port() != old_port, timeout, "sentinel failover")
        port = self.current_master_port()
        _wait(lambda: redis.Redis(port=port, socket_timeout=1).info("replication")["role"]
              == "master", timeout, f"{port} promoted")
        return port


class TlsFiles:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with the
    ``cryptography`` package in *folder* (PEM files: ca.crt, server.crt/key, client.crt/key,
    and other-ca.crt, a CA that signed none of them)."""

    def __init__(self, folder: Path) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.timezone.utc)

        def name(cn: str) -> x509.Name:
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

        def write_key(key: Any, path: Path) -> None:
            path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))

        def make_ca(cn: str) -> tuple[Any, Any]:
            key = ec.generate_private_key(ec.SECP256R1())
            cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(cn))
                    .public_key(key.public_key()).serial_number(x509.random_serial_number())
                    .not_valid_before(now - datetime.timedelta(minutes=5))
                    .not_valid_after(now + datetime.timedelta(days=2))
                    .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                    .add_extension(x509.KeyUsage(True, False, False, False, False, True, True,
                                                 False, False), True)
                    .sign(key, hashes.SHA256()))
            return key, cert

        def make_leaf(ca_key: Any, ca_cert: Any, cn: str, usage: Any, san: bool) -> tuple:
            key = ec.generate_private_key(ec.SECP256R1())
            builder = (x509.CertificateBuilder().subject_name(name(cn))
                       .issuer_name(ca_cert.subject).public_key(key.public_key())
                       .serial_number(x509.random_serial_number())
                       .not_valid_before(now - datetime.timedelta(minutes=5))
                       .not_valid_after(now + datetime.timedelta(days=2))
                       .add_extension(x509.ExtendedKeyUsage(usage), False))
            if san:
                builder = builder.add_extension(x509.SubjectAlternativeName([
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.DNSName("localhost")]), False)
            return key, builder.sign(ca_key, hashes.SHA256())

        ca_key, ca_cert = make_ca("scrapy_fleet test CA")
        _, other_cert = make_ca("another CA")
        pem = serialization.Encoding.PEM
        self.ca = self.folder / "ca.crt"
        self.ca.write_bytes(ca_cert.public_bytes(pem))
        self.other_ca = self.folder / "other-ca.crt"
        self.other_ca.write_bytes(other_cert.public_bytes(pem))
        # the server certificate serves the nodes of a TLS cluster too, which are each
        # other's clients on the cluster bus
        for role, usage in (("server", [ExtendedKeyUsageOID.SERVER_AUTH,
                                        ExtendedKeyUsageOID.CLIENT_AUTH]),
                            ("client", [ExtendedKeyUsageOID.CLIENT_AUTH])):
            key, cert = make_leaf(ca_key, ca_cert, f"scrapy_fleet {role}", usage,
                                  san=role == "server")
            (self.folder / f"{role}.crt").write_bytes(cert.public_bytes(pem))
            write_key(key, self.folder / f"{role}.key")
        self.server_cert, self.server_key = self.folder / "server.crt", self.folder / "server.key"
        self.client_cert, self.client_key = self.folder / "client.crt", self.folder / "client.key"


class TlsRedis(_Processes):
    """``redis-server`` with ``port 0`` and a TLS port; *client_certs*: ``tls-auth-clients``
    (a client must show a certificate signed by the CA)."""

    def __init__(self, workdir: Path, files: TlsFiles, client_certs: bool = True) -> None:
        super().__init__(workdir)
        self.files = files
        self.port = free_port()
        self.client_certs = client_certs

    def url(self, ca: Path | None = None, client: bool = True, **options: str) -> str:
        """``rediss://127.0.0.1:PORT/0`` with ``ssl_ca_certs`` (*ca*, default the right CA)
        and, with *client*, the client certificate and key."""
        opts = {"ssl_ca_certs": str(ca or self.files.ca)}
        if client:
            opts.update(ssl_certfile=str(self.files.client_cert),
                        ssl_keyfile=str(self.files.client_key))
        opts.update(options)
        return f"rediss://127.0.0.1:{self.port}/0?" + "&".join(f"{k}={v}" for k, v in
                                                               opts.items())

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, ssl=True,
                           ssl_ca_certs=str(self.files.ca),
                           ssl_certfile=str(self.files.client_cert),
                           ssl_keyfile=str(self.files.client_key), socket_timeout=2)

    def start(self) -> TlsRedis:
        f = self.files
        self._server(0, "--tls-port", str(self.port), "--tls-cert-file", str(f.server_cert),
                     "--tls-key-file", str(f.server_key), "--tls-ca-cert-file", str(f.ca),
                     "--tls-auth-clients", "yes" if self.client_certs else "no")
        self.procs[self.port] = self.procs.pop(0)
        _wait(lambda: self.client().ping(), 20, "the TLS redis-server")
        return self
