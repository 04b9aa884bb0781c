"""A throwaway PostgreSQL cluster for tests: initdb + pg_ctl on a free port, in a temp dir.

As root the cluster runs as the `postgres` (or `nobody`) account, since PostgreSQL refuses
to run as root. `make test` installs PostgreSQL when it is missing, so CI never skips these.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg

from .hubprocess import free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    path = found[0] if found else shutil.which(name)
    if not path:
        raise RuntimeError(f"PostgreSQL's {name} is not installed (make test installs it)")
    return path


class PostgresCluster:
    def __init__(self):
        # its own top-level temp dir: pytest's are private to root, PostgreSQL is not root
        self.workdir = Path(tempfile.mkdtemp(prefix="meterhub-pg-"))
        self.data = self.workdir / "pgdata"
        self.port = free_port()
        self.run_as: list[str] = []
        if os.geteuid() == 0:
            account = "postgres"
            try:
                entry = pwd.getpwnam(account)
            except KeyError:
                account, entry = "nobody", pwd.getpwnam("nobody")
            self.run_as = ["runuser", "-u", account, "--"]
            os.chown(self.workdir, entry.pw_uid, entry.pw_gid)

    def _run(self, *args: str) -> None:
        subprocess.run([*self.run_as, *args], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self._run(
            _bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )
        self.resume()

    def pause(self) -> None:
        """Stop the server but keep its data: a database outage."""
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def resume(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.workdir} -c fsync=off"
        log = str(self.workdir / "pg.log")
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-o", options, "-l", log, "-w", "start")

    def stop(self) -> None:
        if self.data.exists():
            subprocess.run(
                [
                    *self.run_as,
                    _bin("pg_ctl"),
                    "-D",
                    str(self.data),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ],
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(self.workdir, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh empty database; returns its URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
