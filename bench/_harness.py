"""Shared helpers of the fleet benchmarks: a private redis-server, the test site server,
Scrapy worker processes with an isolated HOME, and small statistics helpers.

Everything runs on 127.0.0.1 in a temporary directory that is removed at the end.
Not a test module: benchmarks print figures, they do not assert.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
EXAMPLE_PROJECT = REPO_ROOT / "example_project"
PYTHON = sys.executable

for _path in (REPO_ROOT, EXAMPLE_PROJECT):  # scrapy_fleet, example_project (the spider)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from testsite.processes import (  # noqa: E402 - after the path set-up above
    RedisServer,
    free_port,
    stop_process,
)


def stop(proc: subprocess.Popen[Any] | None, timeout: float = 10.0) -> None:
    """SIGTERM, SIGKILL after *timeout* s; reaps.  Only ever called on our own children."""
    stop_process(proc, timeout)


@contextmanager
def workdir(prefix: str = "fleet-bench-") -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Redis(RedisServer):
    """``redis-server --save '' --appendonly no`` on a free loopback port, data in *root*/redis
    (the launcher of testsite.processes, as a context manager)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root / "redis")


def callgrind_argv(out_dir: Path) -> list[str]:
    """The prefix running a program under ``valgrind --tool=callgrind``, its dumps in
    *out_dir* (``cg.PID.N``): instructions (Ir) counted whatever the machine's load."""
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_dir}/cg.%p"]


def callgrind_zero(pid: int) -> None:
    """Zero the counters of the callgrind process *pid* (``callgrind_control --zero``)."""
    subprocess.run(["callgrind_control", "--zero", str(pid)], check=True,
                   capture_output=True, timeout=120)


def callgrind_dump(pid: int, out_dir: Path, keep: Path | None = None) -> int:
    """Instructions (Ir) the callgrind process *pid* ran since its last zero or dump
    (``callgrind_control --dump``; the dump file is read and removed, moved into *keep* when
    given, for ``callgrind_annotate``)."""
    before = set(out_dir.glob(f"cg.{pid}.*"))
    subprocess.run(["callgrind_control", "--dump", str(pid)], check=True,
                   capture_output=True, timeout=120)
    for _ in range(200):
        new = set(out_dir.glob(f"cg.{pid}.*")) - before
        for path in new:
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("summary:"):
                    if keep is not None:
                        keep.mkdir(parents=True, exist_ok=True)
                        shutil.move(path, keep / path.name)
                    else:
                        path.unlink()
                    return int(line.split()[1])
        time.sleep(0.05)
    raise RuntimeError(f"no callgrind dump of {pid} in {out_dir}")


class CallgrindRedis(Redis):
    """:class:`Redis` under callgrind (~50x slower): :meth:`zero` and :meth:`count` bracket
    the instructions of a piece of work, :meth:`idle_rate` is the idle Ir per second
    (serverCron) to take off a span's count."""

    def start(self, timeout: float = 120.0) -> CallgrindRedis:
        import redis as redis_py

        log = self.workdir / "redis.log"
        self.proc = subprocess.Popen(
            [*callgrind_argv(self.workdir), self.binary, "--port", str(self.port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--logfile", str(log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        with redis_py.Redis(port=self.port, socket_connect_timeout=5) as client:
            while True:
                try:
                    if client.ping():
                        return self
                except redis_py.ConnectionError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError("redis-server under callgrind did not start") \
                            from None
                    time.sleep(0.2)

    def __enter__(self) -> CallgrindRedis:
        return self.start()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def zero(self) -> None:
        callgrind_zero(self.pid)

    def count(self) -> int:
        return callgrind_dump(self.pid, self.workdir)

    def idle_rate(self, seconds: float = 3.0) -> float:
        """Ir per second of this server left alone for *seconds*."""
        self.zero()
        t0 = time.monotonic()
        time.sleep(seconds)
        return self.count() / (time.monotonic() - t0)


class Site:
    """``python -m testsite serve DIR --port P --log FILE`` in a subprocess."""

    def __init__(self, root: Path, log: Path, binds: Sequence[str] = ()) -> None:
        self.root = root
        self.log = log
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        #: loopback addresses it answers on (distinct hosts to a crawler); () = 127.0.0.1
        self.binds = list(binds)
        self.urls: list[str] = []  #: one base URL per address

    def __enter__(self) -> Site:
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "testsite", "serve", str(self.root),
             "--port", str(self.port), "--log", str(self.log),
             *(a for addr in self.binds for a in ("--bind", addr))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
        assert self.proc.stdout is not None
        for _ in range(max(1, len(self.binds))):
            line = self.proc.stdout.readline().strip()
            if not line.startswith("http://"):
                stop(self.proc)
                raise RuntimeError(f"site server did not start: {line!r}")
            self.urls.append(line.rstrip("/") + "/")
        self.url = self.urls[0]
        return self

    def __exit__(self, *exc: Any) -> None:
        stop(self.proc)

    def records(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(x) for x in self.log.read_text().splitlines() if x.strip()]


def worker_env(root: Path) -> dict[str, str]:
    """Environment of a worker: HOME and XDG_* in *root*, the bench dir on PYTHONPATH (for
    the stats extension ``benchext``)."""
    env = dict(os.environ)
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    env.pop("SCRAPY_PROJECT", None)
    home = root / "home"
    for name, sub in (("HOME", ""), ("XDG_STATE_HOME", ".local/state"),
                      ("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache"),
                      ("XDG_DATA_HOME", ".local/share")):
        path = home / sub if sub else home
        path.mkdir(parents=True, exist_ok=True)
        env[name] = str(path)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(BENCH_DIR), str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def setting_args(settings: Mapping[str, Any]) -> list[str]:
    args: list[str] = []
    for key, value in settings.items():
        if isinstance(value, (dict, list)):
            value = json.dumps(value)
        args += ["-s", f"{key}={value}"]
    return args


def scrapy(args: Sequence[str], env: Mapping[str, str], log: Path | None = None,
           cwd: Path = EXAMPLE_PROJECT) -> subprocess.Popen[bytes]:
    """Start ``python -m scrapy ARGS`` in the example project; output to *log*."""
    out = open(log, "ab") if log else subprocess.DEVNULL
    try:
        return subprocess.Popen([PYTHON, "-m", "scrapy", *args], cwd=cwd, env=dict(env),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if log:
            out.close()  # type: ignore[union-attr]


def scrapy_run(args: Sequence[str], env: Mapping[str, str], timeout: float = 60.0,
               cwd: Path = EXAMPLE_PROJECT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "scrapy", *args], cwd=cwd, env=dict(env),
                          capture_output=True, text=True, timeout=timeout)


def wait(proc: subprocess.Popen[Any], timeout: float, log: Path | None = None) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
        raise TimeoutError(f"process {proc.pid} still running after {timeout} s\n{tail}") from None


def wait_for_text(path: Path, text: str, timeout: float,
                  proc: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    tail = path.read_text(errors="replace")[-3000:] if path.exists() else "<no log>"
    raise TimeoutError(f"{text!r} not in {path} after {timeout} s\n{tail}")


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def fmt_list(values: Sequence[float], digits: int = 1) -> str:
    return "[" + ", ".join(f"{v:.{digits}f}" for v in values) + "]"


def machine() -> dict[str, Any]:
    import platform

    return {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
            "python": platform.python_version()}


def emit_json(figures: Mapping[str, Any]) -> None:
    """The final line of every benchmark: its figures as one JSON object."""
    print(json.dumps(figures, sort_keys=True))
