"""A throw-away PostgreSQL server on 127.0.0.1, for tests, benchmarks and demos.

It runs the machine's own PostgreSQL binaries (found under /usr/lib/postgresql/*/bin, on PATH, or in
$PG_BIN) in a fresh temporary directory, with password authentication over TCP; `stop()` shuts it
down and deletes the directory. PostgreSQL refuses to run as root, so when we are root the server
runs as the `postgres` user (its directory is handed to that user).
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from typing import Mapping, Sequence


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def find_postgres_bin() -> str:
    """The directory holding initdb and pg_ctl."""
    candidates = [os.environ.get("PG_BIN", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    initdb = shutil.which("initdb")
    candidates.append(os.path.dirname(initdb) if initdb else "")
    for directory in candidates:
        if directory and os.path.isfile(os.path.join(directory, "initdb")) \
                and os.path.isfile(os.path.join(directory, "pg_ctl")):
            return directory
    raise PostgresUnavailable("PostgreSQL server binaries (initdb, pg_ctl) not found; set PG_BIN")


def _version_key(path: str) -> int:
    version = os.path.basename(os.path.dirname(path))
    return int(version) if version.isdigit() else 0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LocalPostgres:
    """A PostgreSQL server of our own in a temporary directory, listening on 127.0.0.1 only.

    `settings` are server parameters (`{"fsync": "off"}` makes tests faster; benchmarks keep the
    defaults). The password is random and only reachable through `dsn()`.

    >>> import psycopg
    >>> with LocalPostgres(settings={"fsync": "off"}) as server:
    ...     with psycopg.connect(server.dsn()) as connection:
    ...         print(connection.execute("SELECT 1 + 1").fetchone()[0])
    2
    """

    def __init__(self, settings: Mapping[str, str] | None = None, user: str = "postgres") -> None:
        self.bin_dir = find_postgres_bin()
        self.settings = dict(settings or {})
        self.user = user
        self.port = 0
        self._password = secrets.token_urlsafe(18)
        self._root: str | None = None

    def __repr__(self) -> str:
        return f"LocalPostgres(port={self.port}, running={self._root is not None})"

    def _as_server_user(self, command: Sequence[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *command]
        return list(command)

    def _hand_over(self, path: str) -> None:
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chown(path, account.pw_uid, account.pw_gid)

    def _run(self, *command: str) -> None:
        result = subprocess.run(self._as_server_user(command), capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{os.path.basename(command[0])} failed ({result.returncode}): "
                               f"{result.stdout[-2000:]}{result.stderr[-2000:]}")

    def start(self) -> "LocalPostgres":
        root = tempfile.mkdtemp(prefix="millstream-pg-")
        self._root = root
        self._hand_over(root)
        data = os.path.join(root, "data")
        password_file = os.path.join(root, "password")
        with open(password_file, "w") as f:
            f.write(self._password)
        self._hand_over(password_file)
        try:
            self._run(os.path.join(self.bin_dir, "initdb"), "-D", data, "-U", self.user, "-E", "UTF8",
                      "--locale=C", "--auth-host=scram-sha-256", "--auth-local=trust",
                      f"--pwfile={password_file}", "--no-sync")
            os.unlink(password_file)
            self.port = _free_port()
            options = {"listen_addresses": "127.0.0.1", "port": str(self.port),
                       "unix_socket_directories": root, **self.settings}
            self._run(os.path.join(self.bin_dir, "pg_ctl"), "-D", data, "-l", os.path.join(root, "server.log"),
                      "-w", "-t", "60", "-o", " ".join(f"-c {key}={value}" for key, value in options.items()),
                      "start")
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self) -> None:
        """Stop and start the server (fast shutdown): every open connection is cut."""
        if self._root is None:
            raise RuntimeError("the server is not running")
        # -l as at start: without it the new server writes to our pipe and subprocess.run never returns.
        self._run(os.path.join(self.bin_dir, "pg_ctl"), "-D", os.path.join(self._root, "data"), "-m", "fast",
                  "-l", os.path.join(self._root, "server.log"), "-w", "-t", "60", "restart")

    def dsn(self, dbname: str = "postgres", with_password: bool = True) -> str:
        password = f":{self._password}" if with_password else ""
        return f"postgresql://{self.user}{password}@127.0.0.1:{self.port}/{dbname}"

    @property
    def password(self) -> str:
        return self._password

    def stop(self) -> None:
        root, self._root = self._root, None
        if root is None:
            return
        data = os.path.join(root, "data")
        if os.path.exists(os.path.join(data, "postmaster.pid")):
            subprocess.run(self._as_server_user(
                [os.path.join(self.bin_dir, "pg_ctl"), "-D", data, "-m", "fast", "-w", "stop"]),
                capture_output=True)
        shutil.rmtree(root, ignore_errors=True)

    def __enter__(self) -> "LocalPostgres":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
