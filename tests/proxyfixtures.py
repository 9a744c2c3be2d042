"""Real forward proxies and a site that judges by client address, for the proxy pool tests.

* :func:`start_tinyproxy`: Debian's ``/usr/bin/tinyproxy`` in the foreground (``-d``), one
  instance per egress address: ``Listen 127.0.0.1`` on a free port, ``Bind 127.0.0.N`` (the
  address its outgoing connections come from, which the site sees), optional ``BasicAuth``.
* :func:`start_proxysite`: ``tests/proxysite.py`` in a subprocess.
* fixtures ``tinyproxy`` (a factory; every instance stopped after the test) and
  ``proxysite`` (a factory too).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import free_port, stop_process

TINYPROXY = shutil.which("tinyproxy") or "/usr/sbin/tinyproxy"
HERE = Path(__file__).resolve().parent


@dataclass
class TinyProxy:
    egress: str  # the Bind address: what the site sees as the client
    port: int
    proc: subprocess.Popen[bytes]
    users: tuple[tuple[str, str], ...] = ()

    def url(self, user: str | None = None, password: str | None = None) -> str:
        auth = f"{user}:{password}@" if user else ""
        return f"http://{auth}127.0.0.1:{self.port}"

    def kill(self) -> None:
        """SIGKILL: the exit dies under the fleet."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tinyproxy exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"tinyproxy not listening on {port} after {timeout} s")


def start_tinyproxy(folder: Path, egress: str,
                    users: tuple[tuple[str, str], ...] = ()) -> TinyProxy:
    if not Path(TINYPROXY).exists():
        pytest.fail(f"tinyproxy not found ({TINYPROXY}); apt-get install tinyproxy",
                    pytrace=False)
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / f"tinyproxy-{egress}-{port}.conf"
    lines = [f"Port {port}", "Listen 127.0.0.1", f"Bind {egress}", "Timeout 30",
             "MaxClients 200", "Allow 127.0.0.0/8", "LogLevel Critical",
             f'LogFile "{folder / f"tinyproxy-{port}.log"}"', "DisableViaHeader Yes"]
    lines += [f"BasicAuth {u} {p}" for u, p in users]
    conf.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = subprocess.Popen([TINYPROXY, "-d", "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _wait_listening(port, proc)
    return TinyProxy(egress, port, proc, users)


def dead_proxy_url() -> str:
    """A proxy URL on a port where nothing listens."""
    return f"http://127.0.0.1:{free_port()}"


@dataclass
class ProxySite:
    proc: subprocess.Popen[str]
    urls: list[str]  # one base URL per bound address, ending with "/"
    log_path: Path

    def requests(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in
                self.log_path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def stop(self) -> None:
        stop_process(self.proc)


def start_proxysite(folder: Path, config: dict[str, Any],
                    binds: tuple[str, ...] = ("127.0.0.1",)) -> ProxySite:
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / f"proxysite-{time.monotonic_ns()}.json"
    conf.write_text(json.dumps(config), encoding="utf-8")
    log = conf.with_suffix(".log.jsonl")
    args = [sys.executable, str(HERE / "proxysite.py"), "--config", str(conf), "--log", str(log)]
    for addr in binds:
        args += ["--bind", addr]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    urls = []
    for _ in binds:
        line = proc.stdout.readline().strip()
        if not line.startswith("http://"):
            stop_process(proc)
            raise RuntimeError(f"proxy test site did not start: {line!r} "
                               f"{proc.stderr.read() if proc.stderr else ''}")
        urls.append(line)
    return ProxySite(proc, urls, log)


@pytest.fixture
def tinyproxy(tmp_path: Path) -> Iterator[Callable[..., TinyProxy]]:
    started: list[TinyProxy] = []

    def factory(egress: str, users: tuple[tuple[str, str], ...] = ()) -> TinyProxy:
        proxy = start_tinyproxy(tmp_path / "proxies", egress, users)
        started.append(proxy)
        return proxy

    yield factory
    for proxy in started:
        proxy.kill()


@pytest.fixture
def proxysite(tmp_path: Path) -> Iterator[Callable[..., ProxySite]]:
    started: list[ProxySite] = []

    def factory(config: dict[str, Any], binds: tuple[str, ...] = ("127.0.0.1",)) -> ProxySite:
        site = start_proxysite(tmp_path / "site", config, binds)
        started.append(site)
        return site

    yield factory
    for site in started:
        site.stop()
