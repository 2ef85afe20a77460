"""The bounds the protocol model is checked under (tests/support/protocol_model.py runs them).

CHECKS: exhaustive bound sets, the default suite's share named in DEFAULT_SUITE; LARGE: the larger
ones `make model-check` adds with MODEL_LARGE=1; WALKS: random runs replayed on the real ledger;
OLD_RULES: each switch that sets one rule back as the code had it, with the bounds SPIN finds its
counterexample under; FENCED: the receiver kit's fence case. Every knob and its default is in
model/onceflow.pml; the figures are in docs/reliability.md.
"""

from __future__ import annotations

from dataclasses import dataclass

Defines = dict[str, int | str]


@dataclass(frozen=True)
class Check:
    """One exhaustive run: the model's knobs (model/onceflow.pml) and what it is for."""

    name: str
    defines: Defines
    covers: str
    # pan's memory limit (MB) and compression: COLLAPSE stays exhaustive, only slower.
    memory_mb: int = 3000
    collapse: bool = False


@dataclass(frozen=True)
class OldRule:
    """A switch that sets one rule back as the code had it, and the bounds SPIN finds it under."""

    switch: str
    rule: str
    bounds: Defines
    # What the counterexample must break: a piece of the failed assertion's text.
    breaks: str


# -- the bounds ----------------------------------------------------------------------------------

# Every knob and its default is in model/onceflow.pml. Together the checks visit every actor:
# attempts that crash, outlive their deadline and lose their reservation's answer; the network
# losing requests and replies; the receiver honouring no key, the key, or the kit; operators; the
# reconciler; approval; compensation; a reset. The default suite runs DEFAULT_SUITE (a few seconds
# each); `make model-check` runs them all, and LARGE.
ONE_CALL: Defines = {"NK": 1, "TWINS": 0, "TURNS": 1}
QUIET: Defines = {"CRASHES": 0, "SLOWS": 0, "TIMEOUTS": 0, "REJECTS": 0, "NOTATTEMPTED": 0, "HOOK": 0}
CHECKS: list[Check] = [
    Check(
        "twins in one answer, a compensation",
        {"NK": 2, "TWINS": 1, "TURNS": 1, "CRASHES": 0, "SLOWS": 0, "TIMEOUTS": 1, "OPS": 2},
        "two identical calls in one answer (reused, refused after a compensation), a tool timeout, "
        "two operator actions",
    ),
    Check(
        "one call, crashes and a lost answer",
        {**ONE_CALL, "CRASHES": 1, "SLOWS": 1, "TIMEOUTS": 1, "LOSTREPLIES": 1, "OPS": 1},
        "a crash at any step, an attempt past its deadline, a lost request, reply or reservation "
        "answer, the reconciler, an operator",
    ),
    Check(
        "twins in one answer",
        {"NK": 2, "TWINS": 1, "TURNS": 1, "CRASHES": 1, "SLOWS": 0, "TIMEOUTS": 1, "OPS": 2},
        "two identical calls in one answer (held, reused, refused after a compensation), a crash at "
        "any step, a tool timeout, two operator actions",
    ),
    Check(
        "a repeat after hearing, a mistaken settlement",
        {
            "NK": 2,
            "TWINS": 0,
            "TURNS": 2,
            "MISTAKES": 1,
            "COMPENSATE": 0,
            "SLOWS": 1,
            "TIMEOUTS": 0,
            "CRASHES": 0,
            "HOOK": 0,
            "REJECTS": 0,
            "NOTATTEMPTED": 0,
        },
        "a repeat made after the model heard; an operator settling against the receiver; the owner's "
        "late outcome as a conflict; its acknowledgement",
    ),
    Check(
        "one call, every fault",
        {**ONE_CALL, "CRASHES": 1, "SLOWS": 1, "TIMEOUTS": 1, "LOSTREPLIES": 1, "OPS": 2},
        "a crash at any step, an attempt past its deadline, a lost request, reply or reservation "
        "answer, the reconciler, two operator actions, a compensation",
    ),
    Check(
        "one call, approval",
        {**ONE_CALL, "APPROVAL": 1, "CRASHES": 1, "SLOWS": 1, "OPS": 2, "COMPENSATE": 0},
        "approve, deny, release an approved call, the approval deadline, a crash",
    ),
    Check(
        "one call, the receiver kit",
        {**ONE_CALL, "RECEIVER": "R_KIT", "CRASHES": 1, "SLOWS": 1, "TIMEOUTS": 1, "OPS": 1},
        "lookup and fence at a receiver that keeps keys",
    ),
    Check(
        "one call, a receiver honouring the key",
        {**ONE_CALL, "RECEIVER": "R_KEY", "CRASHES": 1, "SLOWS": 1, "TIMEOUTS": 1, "OPS": 1},
        "a receiver that deduplicates by key",
    ),
    Check(
        "intent reuse",
        {
            "NK": 2,
            "TWINS": 1,
            "TURNS": 2,
            "INTENT": "I_REUSE",
            "CRASHES": 1,
            "SLOWS": 0,
            "TIMEOUTS": 1,
            "OPS": 2,
        },
        "a tool whose every repeat is the same call, heard or not",
    ),
    Check(
        "re-issues after a reset",
        {"NK": 4, "TWINS": 1, "TURNS": 2, "RESETS": 1, "OPS": 0, "MAXATT": 4, **QUIET},
        "a reset that forgets what was heard, calls re-issued under the same or new ids",
    ),
    Check(
        "two calls at once",
        {"NK": 2, "TWINS": 1, "TURNS": 1, "PARALLEL": 1, "OPS": 0, **{**QUIET, "CRASHES": 1}},
        "a framework's parallel tool calls: two identical calls in flight at once, a crash",
    ),
    Check(
        "entity and budget",
        {
            "NK": 2,
            "TWINS": 1,
            "TURNS": 1,
            "PAYLOADS": 2,
            "EXCLUSIVE": 1,
            "LIMIT": 1,
            "CRASHES": 1,
            "SLOWS": 0,
            "TIMEOUTS": 1,
            "OPS": 1,
            "COMPENSATE": 0,
        },
        "two calls of one entity with other arguments: one unresolved at a time, completed plus "
        "unresolved within a limit of 1",
    ),
]
DEFAULT_SUITE = (
    "twins in one answer, a compensation",
    "one call, crashes and a lost answer",
    "a repeat after hearing, a mistaken settlement",
)

# Larger bounds (make model-check --large): tens of minutes, several GB.
LARGE: list[Check] = [
    Check(
        "three calls over two turns",
        {"NK": 3, "TWINS": 1, "TURNS": 2, "CRASHES": 0, "SLOWS": 0, "TIMEOUTS": 1, "OPS": 1},
        "three identical calls (twins, then a repeat), a tool timeout, an operator action",
        memory_mb=6000,
        collapse=True,
    ),
    Check(
        "three calls over two turns, a crash",
        {"NK": 3, "TWINS": 1, "TURNS": 2, "CRASHES": 1, "SLOWS": 0, "TIMEOUTS": 1, "OPS": 1},
        "the same with a worker crash at any step",
        memory_mb=6000,
        collapse=True,
    ),
    Check(
        "a reset with a crash",
        {
            "NK": 2,
            "TWINS": 1,
            "TURNS": 1,
            "RESETS": 1,
            "CRASHES": 1,
            "SLOWS": 0,
            "OPS": 1,
            "TIMEOUTS": 0,
            "REJECTS": 0,
            "NOTATTEMPTED": 0,
            "HOOK": 0,
            "MAXATT": 6,
        },
        "two identical calls in one answer, a reset while they are in flight, a crash, an operator action",
        memory_mb=12000,
        collapse=True,
    ),
]

# Random runs (not exhaustive) with room for everything at once; replayed on the real ledger.
WALKS: list[Check] = [
    Check(
        "the world is unkind",
        {
            "NK": 4,
            "TWINS": 1,
            "TURNS": 3,
            "CRASHES": 1,
            "SLOWS": 1,
            "TIMEOUTS": 1,
            "NOTATTEMPTED": 0,
            "OPS": 4,
            "MISTAKES": 1,
            "RESETS": 1,
            "MAXATT": 10,
        },
        "a mistaken settlement, conflicts, twins and repeats, a reset, one crash",
    ),
    Check(
        "everything",
        {
            "NK": 4,
            "TWINS": 1,
            "TURNS": 3,
            "CRASHES": 2,
            "SLOWS": 1,
            "TIMEOUTS": 1,
            "LOSTREPLIES": 1,
            "OPS": 4,
            "MISTAKES": 1,
            "RESETS": 1,
            "MAXATT": 10,
        },
        "every actor of the model in one run",
    ),
    Check(
        "conflicts",
        {
            "NK": 3,
            "TWINS": 1,
            "TURNS": 3,
            "MISTAKES": 1,
            "OPS": 3,
            "COMPENSATE": 0,
            "CRASHES": 0,
            "SLOWS": 1,
            "TIMEOUTS": 1,
            "NOTATTEMPTED": 0,
            "REJECTS": 0,
            "RESETS": 1,
            "MAXATT": 10,
        },
        "settlements against the receiver, late owners, conflicts and their acknowledgement",
    ),
    Check(
        "everything, approval",
        {
            "NK": 3,
            "TWINS": 1,
            "TURNS": 2,
            "CRASHES": 1,
            "SLOWS": 1,
            "OPS": 4,
            "RESETS": 1,
            "APPROVAL": 1,
            "MAXATT": 10,
        },
        "approval with faults and a reset",
    ),
    Check(
        "everything, entity and budget",
        {
            "NK": 4,
            "TWINS": 1,
            "TURNS": 3,
            "PAYLOADS": 2,
            "EXCLUSIVE": 1,
            "LIMIT": 2,
            "CRASHES": 1,
            "SLOWS": 1,
            "TIMEOUTS": 1,
            "OPS": 3,
            "MISTAKES": 1,
            "MAXATT": 10,
        },
        "the entity guard and a budget with faults and a mistaken settlement",
    ),
]

OLD_RULES: list[OldRule] = [
    OldRule(
        "HEARD_BY_STATUS_NOW",
        "heard is the twin's status now, not what the model was told",
        {
            "NK": 2,
            "TWINS": 0,
            "TURNS": 2,
            "MISTAKES": 1,
            "COMPENSATE": 0,
            "SLOWS": 1,
            "CRASHES": 0,
            "TIMEOUTS": 0,
            "HOOK": 0,
            "REJECTS": 0,
            "NOTATTEMPTED": 0,
        },
        "lic[",
    ),
    OldRule(
        "REUSE_FROM_REUSED",
        "a reused call is a source of reuse, before the compensated-twin rule",
        {"NK": 3, "TWINS": 2, "TURNS": 1, "OPS": 1, **QUIET},
        "cok",
    ),
    OldRule(
        "REUSE_NEWEST",
        "the newest completed twin is reused, with no pairing",
        {"NK": 4, "TWINS": 1, "TURNS": 2, "RESETS": 1, "RESET_AT_END": 1, "OPS": 0, "MAXATT": 4, **QUIET},
        "cpair",
    ),
    OldRule(
        "LOST_REPLY_UNKNOWN",
        "a reservation whose answer was lost comes back in flight and is made unknown",
        {**ONE_CALL, "LOSTREPLIES": 1, "OPS": 0, "COMPENSATE": 0},
        "glost",
    ),
    OldRule(
        "INSPECT_LIVE_LEASE",
        "inspection and reconcile act inside the owner's lease",
        {**ONE_CALL, "TIMEOUTS": 0, "OPS": 0, "COMPENSATE": 0},
        "own[",
    ),
    OldRule(
        "STALE_OWNER_RESERVES",
        "an attempt reserves after its activity's deadline",
        {
            **ONE_CALL,
            "CRASHES": 0,
            "SLOWS": 1,
            "TIMEOUTS": 0,
            "OPS": 0,
            "REJECTS": 0,
            "HOOK": 0,
            "COMPENSATE": 0,
            # The code before issue 34 took no attempt start either; F4's fix alone would stop
            # this path too (the slow attempt began before attempt 2's failure).
            "STALE_ATTEMPT_RETRIES": 1,
        },
        "toldfail",
    ),
    OldRule(
        "COMP_NUDGE_ONLY",
        "the compensation workflow waits for a nudge, with no timer",
        {**ONE_CALL, **QUIET},
        "compwait",
    ),
    # Found by the model on main after issue 34, since fixed (model/onceflow.pml; docs/reliability.md).
    OldRule(
        "UNKNOWN_LIVE_LEASE",
        "the reconciler's hook settles 'not there' inside the owner's lease",
        {**ONE_CALL, "CRASHES": 0, "SLOWS": 0, "OPS": 0, "COMPENSATE": 0},
        "own[",
    ),
    OldRule(
        "INSPECT_FORGETS_UNSENT",
        "inspection after a lost retry forgets the owner whose answer was lost",
        {**ONE_CALL, "LOSTREPLIES": 1, "OPS": 0, "COMPENSATE": 0},
        "glost",
    ),
    OldRule(
        "STALE_ATTEMPT_RETRIES",
        "an attempt retries a call that failed after it began",
        {**ONE_CALL, "RESETS": 1, **QUIET, "CRASHES": 1, "OPS": 1, "COMPENSATE": 0},
        "toldfail",
    ),
    OldRule(
        "INSPECT_REUSED_AS_IS",
        "inspection reads a reused call back as completed after its source was compensated",
        {
            "NK": 2,
            "TWINS": 1,
            "TURNS": 1,
            "RESETS": 1,
            "RESET_AT_END": 1,
            **QUIET,
            "SLOWS": 1,
            "OPS": 1,
            "MAXATT": 4,
        },
        "cok",
    ),
]


# The receiver kit's fence makes a settlement inside the owner's lease safe: with only the
# reconciler deciding (it fences an absent key before it settles "failed"), even inspection and
# reconcile inside the lease (INSPECT_LIVE_LEASE, UNKNOWN_LIVE_LEASE) break nothing at a kit
# receiver, and the same bounds at a receiver without it give a counterexample.
FENCED: Defines = {
    **ONE_CALL,
    "CRASHES": 1,
    "SLOWS": 1,
    "TIMEOUTS": 1,
    "OPS": 0,
    "COMPENSATE": 0,
    "INSPECT_LIVE_LEASE": 1,
    "UNKNOWN_LIVE_LEASE": 1,
}
