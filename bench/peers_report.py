"""bench/peers.py's figures and how it prints them: the systems, the processes measured, what each
system does not guarantee, and the reports (bootstrap intervals with a fixed seed: one run prints
one interval)."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field

from e2e_stack import percentile  # bench/e2e_stack.py

SYSTEMS = ("onceflow", "pydantic-ai", "openai-agents", "dbos", "plain")


PROCESSES = ("worker", "temporal", "postgres", "billing")


GUARANTEES = {
    "onceflow": "records the call before the send; a timeout is unknown, never retried; one attempt",
    "pydantic-ai": "no record before the send; a lost answer retries the write (activity retry policy)",
    "openai-agents": "no record before the send; a lost answer retries the write (activity retry policy)",
    "dbos": "no record before the send; a step that dies mid-send runs again on recovery",
    "plain": "no record before the send; one attempt here; a timeout is a failure, no unknown state",
}


@dataclass
class Figures:
    step_ms: list[float] = field(default_factory=list)
    run_ms: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PROCESSES, 0.0))  # seconds
    seconds: float = 0.0  # wall time the calls took, over which the processes' idle CPU is taken off
    calls: int = 0


# --writes: (system, write calls in a run) -> one sample a round: process -> CPU seconds a run
Shapes = dict[tuple[str, int], list[dict[str, float]]]


def per_write(shapes: Shapes, system: str, writes: int, rounds: list[int]) -> dict[str, float]:
    """CPU ms of one more write call in a run, per process: what a run of `writes` costs over a
    run of one, divided by the writes it adds (the rounds given, for the bootstrap)."""

    def mean(shape: tuple[str, int], name: str) -> float:
        return statistics.mean(shapes[shape][i][name] for i in rounds)

    return {
        name: (mean((system, writes), name) - mean((system, 1), name)) / (writes - 1) * 1000
        for name in PROCESSES
    }


def report_per_write(shapes: Shapes, writes: int, pair_cpu_ms: float) -> None:
    rounds = list(range(len(shapes["onceflow", 1])))
    print(
        f"\nCPU ms per write call, from runs of {writes} writes against runs of one ({len(rounds)} rounds):"
        " one more write in a run, and what is left to the run itself"
    )
    print("  " + " " * 22 + "  ".join(f"{name:>9}" for name in PROCESSES) + "      all")
    marginal = {}
    for system in ("onceflow", "plain"):
        marginal[system] = per_write(shapes, system, writes, rounds)
        run_one = {name: statistics.mean(x[name] for x in shapes[system, 1]) * 1000 for name in PROCESSES}
        for label, per in (
            (f"{system}, a write", marginal[system]),
            (f"{system}, the run", {n: run_one[n] - marginal[system][n] for n in PROCESSES}),
        ):
            print(
                f"  {label:<20}  "
                + "  ".join(f"{per[n]:9.2f}" for n in PROCESSES)
                + f"  {sum(per.values()):7.2f}"
            )
    extra = sum(marginal["onceflow"].values()) - sum(marginal["plain"].values())
    rng = random.Random(39)
    found = []
    for _ in range(2000):
        picked = rng.choices(rounds, k=len(rounds))
        once, plain = (
            per_write(shapes, "onceflow", writes, picked),
            per_write(shapes, "plain", writes, picked),
        )
        found.append(sum(once.values()) - sum(plain.values()) - pair_cpu_ms)
    found.sort()
    by = {n: marginal["onceflow"][n] - marginal["plain"][n] for n in PROCESSES}
    print(
        f"onceflow's extra CPU per write call over the plain activity, a write in a run: {extra:.2f} ms"
        f" ({', '.join(f'{n} {v:.2f}' for n, v in by.items())}); above the two commits' CPU:"
        f" {extra - pair_cpu_ms:.2f} ms [95% interval {found[50]:.2f} to {found[1949]:.2f}] (goal <= 0.5 ms)"
    )


def interval(values: list[float], q: float, resamples: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of the q-quantile (a fixed seed: one run prints one interval)."""
    rng = random.Random(39)
    found = sorted(percentile(rng.choices(values, k=len(values)), q) for _ in range(resamples))
    return found[int(0.025 * resamples)], found[int(0.975 * resamples) - 1]


def difference_interval(
    a: list[float], b: list[float], c: list[float], resamples: int = 2000
) -> tuple[float, float]:
    """95% bootstrap interval of p50(a) - p50(b) - p50(c)."""
    rng = random.Random(39)

    def p50(values: list[float]) -> float:
        return percentile(rng.choices(values, k=len(values)), 0.5)

    found = sorted(p50(a) - p50(b) - p50(c) for _ in range(resamples))
    return found[int(0.025 * resamples)], found[int(0.975 * resamples) - 1]


def report(figures: dict[str, Figures], pairs: list[float], pair_cpu_ms: float) -> None:
    print("\nwrite step latency (ms): p50 [95% interval]  p95 [95% interval];  run p50 (ms)")
    for system in SYSTEMS:
        f = figures[system]
        p50, p95 = percentile(f.step_ms, 0.5), percentile(f.step_ms, 0.95)
        (a, b), (c, d) = interval(f.step_ms, 0.5), interval(f.step_ms, 0.95)
        print(
            f"  {system:<14} {p50:6.1f} [{a:5.1f} to {b:5.1f}]  {p95:6.1f} [{c:5.1f} to {d:5.1f}];"
            f"  run {percentile(f.run_ms, 0.5):6.1f}   ({f.calls} calls)"
        )
    print(
        "\nCPU ms per call, idle CPU taken off: "
        + "  ".join(f"{name:>9}" for name in PROCESSES)
        + "      all"
    )
    for system in SYSTEMS:
        f = figures[system]
        per = {name: f.cpu[name] / f.calls * 1000 for name in PROCESSES}
        print(
            f"  {system:<14} "
            + "  ".join(f"{per[n]:9.2f}" for n in PROCESSES)
            + f"  {sum(per.values()):7.2f}"
        )
    print("\nwhat each does not guarantee (docs/benchmarks.md, peers):")
    for system in SYSTEMS:
        print(f"  {system:<14} {GUARANTEES[system]}")
    once, plain = figures["onceflow"], figures["plain"]
    extra = percentile(once.step_ms, 0.5) - percentile(plain.step_ms, 0.5)
    commits = percentile(pairs, 0.5)
    low, high = difference_interval(once.step_ms, plain.step_ms, pairs)
    print(
        f"\nthe two commits a write call needs (the bare pair, one connection): p50 {commits:.2f} ms,"
        f" CPU {pair_cpu_ms:.2f} ms (client and PostgreSQL)"
    )
    print(
        f"onceflow's extra latency over the plain activity, p50: {extra:.2f} ms; above the two commits:"
        f" {extra - commits:.2f} ms [95% interval {low:.2f} to {high:.2f}] (goal <= 0.5 ms)"
    )
    cpu_extra = sum(once.cpu.values()) / once.calls * 1000 - sum(plain.cpu.values()) / plain.calls * 1000
    print(
        f"onceflow's extra CPU per write call over the plain activity: {cpu_extra:.2f} ms; above the two"
        f" commits' CPU: {cpu_extra - pair_cpu_ms:.2f} ms (goal <= 0.5 ms)"
    )
