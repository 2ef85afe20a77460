"""Can the ledger's server lose a write it acknowledged? The checks `onceflow doctor` prints and the
worker runs at start-up.

Each check reads what the server says, on one of the ledger's own connections (so the session
settings the ledger makes are seen as its statements see them), and gives a verdict:

- `ok`;
- `unsafe`: with this setting a write the ledger acknowledged can be lost (a crash, a failover), or
  a rule the ledger relies on does not hold. The production profile refuses to start on it;
- `unknown`: the server would not say (a role without `pg_monitor` sees no standby's state).
  The production profile refuses this too, naming what to grant or declare;
- `note`: worth knowing, never a refusal (a Unix socket, where keepalives do not apply).

A pooler in transaction mode (PgBouncer's `pool_mode = transaction`) is refused in every profile:
the ledger's session settings would not stay with its statements, and a worker that dies is
invisible to the server behind it.

A managed service whose synchronous copy PostgreSQL cannot show to the ledger's role (storage
replicated beneath PostgreSQL: RDS Multi-AZ instances, Aurora, Cloud SQL HA; or a standby the role
may not see) is declared by the operator with ONCEFLOW_LEDGER_REPLICATION=managed, and the standby
check then says it takes the operator's word.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import asyncpg

from onceflow.ledger import queries
from onceflow.ledger.base import LedgerBase
from onceflow.ledger.connections import CLIENT_CHECK_INTERVAL, ISOLATION, KEEPALIVES


class Verdict(StrEnum):
    OK = "ok"
    UNSAFE = "unsafe"
    UNKNOWN = "unknown"
    NOTE = "note"


class Profile(StrEnum):
    """`development`: unsafe settings are reported; `production`: they stop the worker."""

    DEVELOPMENT = "development"
    PRODUCTION = "production"


class Replication(StrEnum):
    """Where the ledger's synchronous copy lives: a PostgreSQL standby the server shows (`streaming`),
    or one a managed service keeps where PostgreSQL cannot show it, declared by the operator
    (`managed`)."""

    STREAMING = "streaming"
    MANAGED = "managed"


@dataclass(frozen=True)
class Check:
    name: str
    value: str
    verdict: Verdict
    why: str = ""

    def refuses(self, profile: Profile) -> bool:
        if self.name == "pooler" and self.verdict is Verdict.UNSAFE:
            return True  # in every profile
        return profile is Profile.PRODUCTION and self.verdict in (Verdict.UNSAFE, Verdict.UNKNOWN)


class UnsafeLedgerError(RuntimeError):
    """The ledger's server can lose acknowledged writes (or a pooler breaks its rules); names which."""

    def __init__(self, refused: list[Check], profile: Profile) -> None:
        self.refused = refused
        lines = [f"  {c.name} = {c.value}: {c.why}" for c in refused]
        super().__init__(
            f"the ledger's database is not safe to run on ({profile} profile):\n"
            + "\n".join(lines)
            + "\n(`onceflow doctor` shows every check; docs/operations.md, 'The ledger's production checklist')"
        )


def _setting_checks(settings: dict[str, str]) -> list[Check]:
    checks = []
    fsync = settings.get("fsync", "?")
    checks.append(
        Check("fsync", fsync, Verdict.OK)
        if fsync == "on"
        else Check("fsync", fsync, Verdict.UNSAFE, "a crash can lose or corrupt committed data")
    )
    pages = settings.get("full_page_writes", "?")
    checks.append(
        Check("full_page_writes", pages, Verdict.OK)
        if pages == "on"
        else Check("full_page_writes", pages, Verdict.UNSAFE, "a crash can leave torn pages behind")
    )
    commit = settings.get("synchronous_commit", "?")
    if commit == "off":
        checks.append(
            Check(
                "synchronous_commit",
                commit,
                Verdict.UNSAFE,
                "a commit is acknowledged before its WAL is on disk: a crash loses the last ones",
            )
        )
    elif commit == "local" and settings.get("synchronous_standby_names"):
        checks.append(
            Check(
                "synchronous_commit",
                commit,
                Verdict.UNSAFE,
                "commits do not wait for the synchronous standby: a failover can lose acknowledged writes",
            )
        )
    else:
        checks.append(Check("synchronous_commit", commit, Verdict.OK))
    return checks


def _standby_check(
    settings: dict[str, str], standbys: list[asyncpg.Record], replication: Replication
) -> Check:
    names = settings.get("synchronous_standby_names", "")
    if replication is Replication.MANAGED:
        return Check(
            "synchronous_standby",
            "declared: the managed service replicates synchronously",
            Verdict.NOTE,
            "ONCEFLOW_LEDGER_REPLICATION=managed: the operator vouches that the service keeps a "
            "synchronous copy (PostgreSQL cannot show it to this role)",
        )
    if not names:
        return Check(
            "synchronous_standby",
            "none (synchronous_standby_names is empty)",
            Verdict.UNSAFE,
            "no standby holds a commit before it is acknowledged: a failover can lose acknowledged "
            "writes, and the loss of this server's disk loses them all",
        )
    attached = [r for r in standbys if r["state"] == "streaming" and r["sync_state"] in ("sync", "quorum")]
    if attached:
        who = ", ".join(f"{r['application_name']} ({r['sync_state']})" for r in attached)
        return Check("synchronous_standby", who, Verdict.OK)
    hidden = [r for r in standbys if r["state"] is None]  # a role without pg_monitor sees no state
    if hidden:
        return Check(
            "synchronous_standby",
            f"{len(hidden)} standby connection(s), state hidden",
            Verdict.UNKNOWN,
            "the ledger's role cannot see whether a standby is synchronous: GRANT pg_monitor TO it",
        )
    return Check(
        "synchronous_standby",
        f"none attached (synchronous_standby_names = {names!r})",
        Verdict.UNSAFE,
        "no synchronous standby is attached: commits wait until one is (writes hang), or were made "
        "asynchronous by hand",
    )


def _session_checks(settings: dict[str, str], default_isolation: str, tcp: bool) -> list[Check]:
    checks = []
    isolation = settings.get("transaction_isolation", "?")
    checks.append(
        Check("isolation", f"{isolation} (database default: {default_isolation})", Verdict.OK)
        if isolation == ISOLATION
        else Check(
            "isolation",
            isolation,
            Verdict.UNSAFE,
            f"the ledger's guards decide under {ISOLATION.upper()}; its session setting did not hold",
        )
    )
    check_interval = settings.get("client_connection_check_interval", "0")
    wanted_ms = CLIENT_CHECK_INTERVAL.removesuffix("ms")
    checks.append(
        Check("client_connection_check_interval", f"{check_interval}ms", Verdict.OK)
        if check_interval == wanted_ms
        else Check(
            "client_connection_check_interval",
            f"{check_interval}ms",
            Verdict.UNSAFE,
            "a statement whose worker died keeps running and may commit a call nobody sends",
        )
    )
    for name, wanted in KEEPALIVES.items():
        value = settings.get(name, "0")
        if not tcp:
            checks.append(Check(name, value, Verdict.NOTE, "a Unix socket: keepalives do not apply"))
        elif value == str(wanted):
            checks.append(Check(name, value, Verdict.OK))
        else:
            checks.append(
                Check(
                    name,
                    value,
                    Verdict.UNSAFE,
                    f"the ledger sets {wanted}; without it a worker host that vanishes keeps its locks "
                    "until the kernel gives up on the socket",
                )
            )
    return checks


async def detect_pooler(ledger: LedgerBase, rounds: int = 3) -> Check:
    """Is the ledger behind a pooler that hands a session's statements to different server
    processes (transaction or statement pooling)? Two of the ledger's connections are held open at
    once: without such a pooler each keeps one backend of its own; with one, they share backends,
    or one's backend changes between statements, or its prepared statements vanish."""
    try:
        async with ledger.connection("detect_pooler") as first, ledger.connection("detect_pooler") as second:
            for _ in range(rounds):
                a = await first.fetchval(queries.BACKEND_PID)
                b = await second.fetchval(queries.BACKEND_PID)
                again = await first.fetchval(queries.BACKEND_PID)
                if a == b or a != again:
                    return _pooled(f"backends {a}, {b}, then {again}")
    except (asyncpg.InvalidSQLStatementNameError, asyncpg.DuplicatePreparedStatementError) as exc:
        return _pooled(f"prepared statements lost between statements ({type(exc).__name__})")
    return Check("pooler", "none in transaction mode (each session keeps its backend)", Verdict.OK)


def _pooled(seen: str) -> Check:
    return Check(
        "pooler",
        f"transaction pooling ({seen})",
        Verdict.UNSAFE,
        "a pooler in transaction mode (PgBouncer pool_mode = transaction) drops the session settings "
        "the ledger makes (isolation, client_connection_check_interval, keepalives) and asyncpg's "
        "prepared statements, and hides a dead worker from the server: connect directly or through "
        "a session-mode pooler",
    )


async def check_durability(
    ledger: LedgerBase, *, replication: Replication = Replication.STREAMING
) -> list[Check]:
    """Every check, in the order `onceflow doctor` prints them."""
    pooler = await detect_pooler(ledger)
    async with ledger.connection("check_durability") as conn:
        if await conn.fetchval(queries.IN_RECOVERY):
            return [
                pooler,
                Check("role", "standby", Verdict.UNSAFE, "this server is a read-only standby"),
            ]
        settings = {row["name"]: row["setting"] for row in await conn.fetch(queries.SETTINGS)}
        standbys = list(await conn.fetch(queries.STANDBYS))
        default_isolation = await conn.fetchval(queries.DEFAULT_ISOLATION)
        tcp = await conn.fetchval(queries.CLIENT_ADDRESS) is not None
    timeline = ledger.timelines.current
    return [
        *_setting_checks(settings),
        _standby_check(settings, standbys, replication),
        *_session_checks(settings, default_isolation, tcp),
        pooler,
        Check(
            "timeline",
            str(timeline) if timeline is not None else "unreadable",
            Verdict.OK if timeline is not None else Verdict.NOTE,
            "" if timeline is not None else f"failovers go unnoticed: {ledger.timelines.unreadable}",
        ),
    ]


def refused(checks: list[Check], profile: Profile) -> list[Check]:
    return [check for check in checks if check.refuses(profile)]


def as_rows(checks: list[Check]) -> list[dict[str, Any]]:
    return [{"check": c.name, "value": c.value, "verdict": c.verdict.value, "why": c.why} for c in checks]
