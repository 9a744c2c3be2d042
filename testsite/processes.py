"""Helper processes for the demo, the tests and the benchmarks: free ports, a private
``redis-server``, stopping children.  One implementation, used by all three."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import redis


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on *host* a moment ago."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def stop_process(proc: subprocess.Popen[Any] | None, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after *timeout* seconds; reaps the process.  None: nothing."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class RedisServer:
    """A real ``redis-server`` on 127.0.0.1:*port* without persistence, data and log in
    *workdir*.  Usable as a context manager (start on enter, stop on exit).

    Raises:
        RuntimeError: from the constructor when ``redis-server`` is not installed, from
            :meth:`start` when it exits or does not answer PING within *timeout* seconds
            (the message ends with its log).
    """

    def __init__(self, workdir: Path, port: int | None = None,
                 new_session: bool = False, persistent: bool = False) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed: run `make redis` "
                "(apt-get install -y redis-server) or `make test`, which installs it")
        self.binary = binary
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.new_session = new_session  #: a Ctrl-C to the parent does not reach it
        #: append-only file, fsync on every write, in *workdir*: a SIGKILL (:meth:`kill`)
        #: loses no acknowledged write and :meth:`start` again finds the data
        self.persistent = persistent
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis.from_url(self.url, **kwargs)

    def start(self, timeout: float = 20.0) -> RedisServer:
        log = self.workdir / "redis.log"
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             *(("--appendonly", "yes", "--appendfsync", "always") if self.persistent
               else ("--appendonly", "no")),
             "--dir", str(self.workdir), "--logfile", str(log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=self.new_session)
        deadline = time.monotonic() + timeout
        client = self.client(socket_connect_timeout=1)
        try:
            while True:
                if self.proc.poll() is not None:
                    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                    raise RuntimeError(
                        f"redis-server exited ({self.proc.returncode}):\n{tail}")
                try:
                    if client.ping():
                        return self
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError(
                            f"redis-server did not answer within {timeout} s; see {log}"
                        ) from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL (no shutdown, like a machine dying) and reap it."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        """Stop and start on the same port; the data is gone (no persistence)."""
        self.stop()
        self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
