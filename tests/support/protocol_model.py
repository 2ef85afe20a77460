"""SPIN on model/onceflow.pml: build a verifier for given bounds, run it, read its verdict, and read
the model's own lines (`@@ ...`) out of a counterexample trail or a random simulation.

The bounds each check runs with are named here (CHECKS: the default suite's, small; LARGE: what
`make model-check` adds), and so are the switches that set one rule back to the code before issue 34
(OLD_RULES), each with the bounds under which SPIN must find its counterexample.

`python -m tests.support.protocol_model [--large] [--only NAME]` runs them and prints, per check, the
states explored and the time taken (the figures in docs/reliability.md).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

MODEL = Path(__file__).resolve().parents[2] / "model"
MAIN = "onceflow.pml"
Defines = dict[str, int | str]


def spin_path() -> str | None:
    return shutil.which("spin")


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


@dataclass
class Verdict:
    errors: int
    states: int
    transitions: int
    depth: int
    seconds: float
    complete: bool
    memory_mb: float
    violated: str = ""
    output: str = ""


@dataclass
class Build:
    """A verifier (pan) compiled for one set of bounds, in a directory of its own."""

    directory: Path
    defines: Defines
    optimise: bool = False
    collapse: bool = False
    memory_mb: int = 1024
    _built: bool = field(default=False, init=False)

    def flags(self) -> list[str]:
        return [f"-D{name}={value}" for name, value in sorted(self.defines.items())]

    def build(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for source in MODEL.glob("*.pml"):
            shutil.copy(source, self.directory / source.name)
        spin = spin_path()
        if spin is None:
            raise RuntimeError("spin is not installed (Debian package `spin`)")
        _run([spin, "-a", *self.flags(), MAIN], self.directory)
        cflags = ["-O2" if self.optimise else "-O0", "-DSAFETY", f"-DMEMLIM={self.memory_mb}"]
        if self.collapse:
            cflags.append("-DCOLLAPSE")
        _run(["gcc", *cflags, "-w", "-o", "pan", "pan.c"], self.directory)
        self._built = True

    def verify(self, max_depth: int = 100_000) -> Verdict:
        if not self._built:
            self.build()
        began = time.monotonic()
        # -m: the depth bound; -E is not given: invalid end states are errors too.
        done = subprocess.run(
            ["./pan", f"-m{max_depth}"], cwd=self.directory, capture_output=True, text=True, check=False
        )
        return parse_verdict(done.stdout + done.stderr, time.monotonic() - began)

    def trail(self) -> list[str]:
        """The model's lines along the counterexample pan wrote (`spin -t`)."""
        spin = spin_path()
        assert spin is not None
        done = _run([spin, "-T", "-t", *self.flags(), MAIN], self.directory)
        return model_lines(done)

    def simulate(self, seed: int, steps: int = 5000) -> list[str]:
        """The model's lines along one random run (`spin -n SEED -u STEPS`)."""
        for source in MODEL.glob("*.pml"):
            self.directory.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, self.directory / source.name)
        spin = spin_path()
        assert spin is not None
        done = _run([spin, "-T", f"-n{seed}", f"-u{steps}", *self.flags(), MAIN], self.directory)
        return model_lines(done)


def _run(command: list[str], cwd: Path) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    output = done.stdout + done.stderr
    if done.returncode != 0 and not command[0].endswith("spin"):
        raise RuntimeError(f"{' '.join(command)} failed:\n{output}")
    if command[0].endswith("spin") and "-a" in command and (done.returncode != 0 or "Error" in output):
        raise RuntimeError(f"spin rejected the model:\n{output}")
    return output


def model_lines(output: str) -> list[str]:
    """The model's own lines (`@@ ...`), and the assertion SPIN reports as violated, in order."""
    lines = []
    for line in output.splitlines():
        if "@@ " in line:
            # A printf and SPIN's error text can share a line when a step fails mid-print.
            _, _, rest = line.partition("@@ ")
            lines.append("@@ " + rest.split("spin:")[0].strip())
        if "assertion violated" in line:
            lines.append("!! " + line.split("assertion violated", 1)[1].strip())
    return lines


_NUMBER = r"([0-9.e+]+)"


def parse_verdict(output: str, seconds: float) -> Verdict:
    def number(pattern: str) -> float:
        found = re.search(pattern, output)
        return float(found.group(1)) if found else 0.0

    violated = re.search(r"assertion violated (.*?) \(at depth", output)
    invalid_end = "invalid end state" in output and "errors: 0" not in output
    return Verdict(
        errors=int(number(r"errors: (\d+)")),
        states=int(number(_NUMBER + r" states, stored")),
        transitions=int(number(_NUMBER + r" transitions")),
        depth=int(number(r"depth reached (\d+)")),
        seconds=seconds,
        complete="Search not completed" not in output and "-DMEMLIM bound" not in output,
        memory_mb=number(_NUMBER + r"\s+total actual memory usage"),
        violated=violated.group(1) if violated else ("invalid end state" if invalid_end else ""),
        output=output,
    )


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


def run_checks(checks: Iterable[Check], *, optimise: bool, out: Path) -> list[tuple[Check, Verdict]]:
    results = []
    for check in checks:
        build = Build(
            out / _slug(check.name),
            check.defines,
            optimise=optimise,
            collapse=check.collapse,
            memory_mb=check.memory_mb,
        )
        build.build()
        results.append((check, build.verify()))
    return results


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# The property each assertion of the model states (docs/reliability.md, "What it checks").
PROPERTIES = {
    "eff[k] <= 1": "1. no key takes effect twice",
    "lic[": "2. no intent paid twice unless heard as it stands",
    "cok": "3. told an effect stands that was undone or never happened",
    "toldfail": "3. told it did not take effect, and it did",
    "glost": "6. made unknown a call known never sent",
    "own[": "4. an effect landed after its call was decided",
    "cpair": "5. one effect given twice while another stood untold",
    "asked": "7. compensation nobody asked for",
    "compwait": "8. a compensation left waiting on a settled call",
}


def property_broken(violated: str) -> str:
    return next((name for marker, name in PROPERTIES.items() if marker in violated), violated)


def _print(check: str, verdict: Verdict) -> None:
    state = "complete" if verdict.complete else "INCOMPLETE"
    if verdict.errors:
        state = "counterexample"
    print(
        f"{check:48} errors {verdict.errors}  states {verdict.states:>11,}  "
        f"transitions {verdict.transitions:>12,}  depth {verdict.depth:>4}  "
        f"{verdict.seconds:7.1f} s  {verdict.memory_mb:8.0f} MB  {state}"
        + (f": {property_broken(verdict.violated)}" if verdict.violated else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--large", action="store_true", help="also the larger bounds (minutes, GB)")
    parser.add_argument("--only", help="run only the checks whose name contains this")
    args = parser.parse_args(argv)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="onceflow-model-") as tmp:
        checks = CHECKS + (LARGE if args.large else [])
        chosen = [c for c in checks if not args.only or args.only in c.name]
        print("The fixed rules (no error expected):")
        for check, verdict in run_checks(chosen, optimise=True, out=Path(tmp)):
            _print(check.name, verdict)
            failed += verdict.errors > 0 or not verdict.complete
            sys.stdout.flush()
        print("Each old rule (a counterexample expected):")
        for old in OLD_RULES:
            if args.only and args.only not in old.switch:
                continue
            build = Build(Path(tmp) / old.switch.lower(), {**old.bounds, old.switch: 1}, optimise=True)
            build.build()
            verdict = build.verify()
            _print(old.switch, verdict)
            failed += verdict.errors == 0
            sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
