"""A real MongoDB wire server for the tests: SecantusDB's ``secantusd-py`` (PyPI
``SecantusDB``, GPL-2.0: a test-only dependency, in setup.cfg's ``test`` extra, never a runtime
one), a single-node server with WiredTiger inside its wheel, started on a free loopback port
with in-memory storage.

No MongoDB server is packaged for Debian 12; ``secantusd-py`` answers pymongo 4.x as a
``mongod`` does for everything MongoPipeline uses: unordered ``bulk_write`` of upserts with
``$set`` / ``$setOnInsert``, ``BulkWriteError`` details (code 121 from a ``$jsonSchema``
validator, 11000 from a unique index), ``create_index`` (unique, ``expireAfterSeconds``),
``ping``, ``drop_database``.  Tests that must see or fault the wire keep
tests/mongowire.py (and mockupdb); ``MONGO_URI`` points the ``mongo_uri`` fixture at a real
``mongod`` instead (tests/conftest.py).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from support import STARTUP_TIMEOUT, free_port, stop_process


def secantusd_command() -> list[str]:
    """The ``secantusd-py`` launcher of the interpreter running the tests (its venv's), or
    the one on PATH.

    Raises:
        RuntimeError: SecantusDB is not installed (``pip install -e .[test]``).
    """
    beside = Path(sys.executable).with_name("secantusd-py")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("secantusd-py")
    if found:
        return [found]
    raise RuntimeError("secantusd-py not found: install the test extra (pip install -e "
                       "'.[test]', which brings SecantusDB) or set MONGO_URI to a mongod")


class SecantusServer:
    """``secantusd-py --storage-path :memory:`` on 127.0.0.1 and a free port.

    ``uri``: ``mongodb://127.0.0.1:PORT``.  :meth:`start` waits until it answers ``ping``;
    :meth:`stop` ends it (SIGTERM, then SIGKILL after 5 s).  Its output goes to
    ``workdir/secantusd.log``.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.uri = f"mongodb://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[Any] | None = None
        self.log_path = workdir / "secantusd.log"

    def start(self) -> SecantusServer:
        """Start it and wait until it answers.

        Raises:
            RuntimeError: not installed, or not answering within STARTUP_TIMEOUT seconds.
        """
        from pymongo import MongoClient
        from pymongo.errors import PyMongoError

        config = self.workdir / "secantusd.toml"  # empty: no ~/.secantus/ file is read
        config.write_text("", encoding="utf-8")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*secantusd_command(), "--config", str(config), "--host", "127.0.0.1",
                 "--port", str(self.port), "--storage-path", ":memory:",
                 "--log-level", "WARNING"],
                cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"secantusd-py exited with {self.proc.returncode}: "
                                   + self.log_path.read_text(errors="replace")[-2000:])
            client: MongoClient[dict[str, Any]] = MongoClient(
                self.uri, serverSelectionTimeoutMS=500, connectTimeoutMS=500)
            try:
                client.admin.command("ping")
                return self
            except PyMongoError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"secantusd-py did not answer on {self.uri} within "
                                       f"{STARTUP_TIMEOUT} s") from None
                time.sleep(0.1)
            finally:
                client.close()

    def stop(self) -> None:
        stop_process(self.proc, timeout=5.0)
