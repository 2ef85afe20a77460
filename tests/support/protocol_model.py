"""SPIN on model/onceflow.pml: build a verifier for given bounds, run it, read its verdict, and read
the model's own lines (`@@ ...`) out of a counterexample trail or a random simulation.

The bounds each check runs with are named in tests/support/protocol_bounds.py (CHECKS: the default
suite's, small; LARGE: what `make model-check` adds), and so are the switches that set one rule back
to the code before the fix that named it (OLD_RULES), each with the bounds SPIN must find it under.

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

from tests.support.protocol_bounds import CHECKS, LARGE, OLD_RULES, Check, Defines

MODEL = Path(__file__).resolve().parents[2] / "model"
MAIN = "onceflow.pml"


def spin_path() -> str | None:
    return shutil.which("spin")


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
