"""The worker's start-up check of the ledger's database (ledger/durability.py): settings that can lose
an acknowledged write are logged, or, in the production profile, stop the worker naming them; a
pooler in transaction mode stops it in every profile."""

from __future__ import annotations

import logging

from onceflow.ledger import Ledger
from onceflow.ledger.durability import (
    Check,
    Profile,
    Replication,
    UnsafeLedgerError,
    Verdict,
    check_durability,
    refused,
)
from onceflow.runtime.config import Settings

log = logging.getLogger("onceflow.runtime.ledger_check")


def profile_of(settings: Settings) -> tuple[Profile, Replication]:
    """ONCEFLOW_PROFILE and ONCEFLOW_LEDGER_REPLICATION, or a SystemExit naming the bad one."""
    try:
        profile = Profile(settings.profile.strip().lower())
    except ValueError:
        raise SystemExit(
            f"cannot start: ONCEFLOW_PROFILE={settings.profile!r} is not one of "
            f"{', '.join(p.value for p in Profile)}"
        ) from None
    try:
        replication = Replication(settings.ledger_replication.strip().lower())
    except ValueError:
        raise SystemExit(
            f"cannot start: ONCEFLOW_LEDGER_REPLICATION={settings.ledger_replication!r} is not one of "
            f"{', '.join(r.value for r in Replication)}"
        ) from None
    return profile, replication


async def check_ledger_at_start(ledger: Ledger, settings: Settings, process: str = "worker") -> list[Check]:
    """Run the durability checks; raise SystemExit if the profile refuses any. Returns them."""
    profile, replication = profile_of(settings)
    checks = await check_durability(ledger, replication=replication)
    stop = refused(checks, profile)
    if stop:
        raise SystemExit(f"cannot start the {process}: {UnsafeLedgerError(stop, profile)}")
    for check in checks:
        if check.verdict in (Verdict.UNSAFE, Verdict.UNKNOWN):
            log.warning(
                "ledger database: %s = %s (%s): %s; the production profile refuses this",
                check.name,
                check.value,
                check.verdict,
                check.why,
            )
    return checks
