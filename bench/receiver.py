"""The receiver kit's cost per request over the bare handler, in the same run.

One FastAPI app, served by uvicorn on loopback (a thread of its own, as a separate process would
be), over one PostgreSQL database and one asyncpg pool. Four routes do the same work: insert one
row in one transaction and answer 201 with it.

    bare          the handler alone: pool.acquire(), a transaction, the INSERT; no key
    transactional the kit's dependency (onceflow.receiver.fastapi): the key parsed, the key's lock, its
                  row looked up, the INSERT on the kit's connection, the answer recorded with it
    middleware    the bare handler behind IdempotencyMiddleware: a claim committed before it, the
                  answer recorded after it
    replay        the transactional route asked again with a key that completed: the stored answer

Each round runs every route back to back (a fresh key per request, except replay), `--requests`
requests each, `--concurrency` at a time from one httpx client; rounds alternate so that a busy
machine's drift hits all routes alike. Printed: per route, the median over rounds of the mean
latency and of requests per second, and the kit's cost per request over bare (mean latency minus
bare's). The server's PostgreSQL work is part of it: the kit's cost is its SQL plus its Python.

    .venv/bin/python bench/receiver.py [--requests 300] [--rounds 5] [--concurrency 1 8]

Uses ONCEFLOW_DATABASE_URL when set (an admin DSN: a scratch database is created and dropped),
otherwise starts the embedded PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import asyncpg
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from scratch import on_a_server, scratch_database  # bench/scratch.py, beside this file

from onceflow.examples.billing.serving import BackgroundServer
from onceflow.receiver import key_header_value, migrate_receiver
from onceflow.receiver.asgi import IdempotencyMiddleware
from onceflow.receiver.fastapi import KeyedRequest, Receiver

INSERT = "INSERT INTO bench_payments (account, cents) VALUES ($1, $2) RETURNING id"
ROUTES = ("bare", "transactional", "middleware", "replay")


def tenant() -> str:
    return "bench"


receiver = Receiver(scope=tenant)
Keyed = Annotated[KeyedRequest, receiver.depends()]


class Payment(BaseModel):
    account: str
    cents: int


async def pay(body: Payment, request: Request) -> Response:
    pool: asyncpg.Pool = request.app.state.pool
    async with pool.acquire() as conn, conn.transaction():
        payment_id = await conn.fetchval(INSERT, body.account, body.cents)
    return JSONResponse({"id": payment_id, "account": body.account, "cents": body.cents}, status_code=201)


async def pay_keyed(body: Payment, keyed: Keyed) -> Response:
    payment_id = await keyed.connection.fetchval(INSERT, body.account, body.cents)
    return await keyed.respond({"id": payment_id, "account": body.account, "cents": body.cents}, 201)


def create_app(database_url: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await migrate_receiver(database_url)
        pool = await asyncpg.create_pool(database_url, min_size=4, max_size=20)
        assert pool is not None
        await pool.execute(
            "CREATE TABLE IF NOT EXISTS bench_payments (id bigserial PRIMARY KEY, account text, cents bigint)"
        )
        app.state.pool = pool
        await receiver.open(app, pool)
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(lifespan=lifespan)
    receiver.install(app)
    app.post("/bare")(pay)
    app.post("/transactional")(pay_keyed)
    app.post("/middleware")(pay)
    app.add_middleware(IdempotencyMiddleware, scope=lambda request: "bench", paths=["/middleware"])
    return app


async def one_route(
    http: httpx.AsyncClient, route: str, requests: int, concurrency: int
) -> tuple[float, float]:
    """(mean latency in ms, requests per second) for `requests` requests, `concurrency` at a time."""
    body: dict[str, Any] = {"account": "acct_1", "cents": 500}
    replay_key = f"replay-{uuid.uuid4().hex}"
    if route == "replay":
        first = await http.post(
            "/transactional", json=body, headers={"Idempotency-Key": key_header_value(replay_key)}
        )
        assert first.status_code == 201, first.text
    latencies: list[float] = []
    queue = iter(range(requests))

    async def worker() -> None:
        for _ in queue:
            if route == "bare":
                path, headers = "/bare", {}
            else:
                key = replay_key if route == "replay" else f"k-{uuid.uuid4().hex}"
                path = "/transactional" if route == "replay" else f"/{route}"
                headers = {"Idempotency-Key": key_header_value(key)}
            began = time.perf_counter()
            answer = await http.post(path, json=body, headers=headers)
            latencies.append(time.perf_counter() - began)
            assert answer.status_code == 201, answer.text
            if route == "replay":
                assert answer.headers["Idempotent-Replayed"] == "true"

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    return statistics.fmean(latencies) * 1000, requests / elapsed


async def bench(admin_dsn: str, requests: int, rounds: int, concurrencies: list[int]) -> None:
    async with scratch_database(admin_dsn, "receiver") as database_url:
        with BackgroundServer(create_app(database_url), shutdown_grace=1.0) as server:
            limits = httpx.Limits(
                max_connections=max(concurrencies), max_keepalive_connections=max(concurrencies)
            )
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30, limits=limits) as http:
                conn = await asyncpg.connect(database_url)
                version = conn.get_server_version()
                await conn.close()
                print(
                    f"PostgreSQL {version.major}.{version.minor}; Python {platform.python_version()}; {os.cpu_count()} CPUs"
                )
                print(f"{rounds} rounds of {requests} requests per route and concurrency, after a warm-up")
                print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
                for route in ROUTES:  # warm-up: connections, prepared statements, code paths
                    await one_route(http, route, 50, 4)
                for concurrency in concurrencies:
                    means: dict[str, list[float]] = {route: [] for route in ROUTES}
                    rates: dict[str, list[float]] = {route: [] for route in ROUTES}
                    for _ in range(rounds):
                        for route in ROUTES:
                            mean, rate = await one_route(http, route, requests, concurrency)
                            means[route].append(mean)
                            rates[route].append(rate)
                    print(f"\nconcurrency {concurrency}:")
                    print(f"  {'route':<14} {'mean ms':>8} {'req/s':>8} {'cost over bare':>16}")
                    bare = statistics.median(means["bare"])
                    for route in ROUTES:
                        mean = statistics.median(means[route])
                        extra = "" if route == "bare" else f"{mean - bare:+.2f} ms ({mean / bare:.2f}x)"
                        print(
                            f"  {route:<14} {mean:>8.2f} {statistics.median(rates[route]):>8.0f} {extra:>16}"
                        )
                print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()

    async def run(admin_dsn: str) -> None:
        await bench(admin_dsn, args.requests, args.rounds, args.concurrency)

    on_a_server(run)


if __name__ == "__main__":
    main()
