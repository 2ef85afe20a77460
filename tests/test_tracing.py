"""OpenTelemetry: one agent run is one trace, from the client's start through model, tool and ledger."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger
from tests.support.agents import support_registry
from tests.support.downstream import DOWNSTREAM
from tests.workflow_harness import running_worker

ORDER = json.dumps({"order_id": "o1"})


@pytest.fixture(scope="module")
def exported_spans() -> Iterator[InMemorySpanExporter]:
    """Spans finished in this process, kept in memory while this module runs.

    The global tracer provider can be set once per process. The ledger's tracer and the client's
    TracingInterceptor are proxies to whatever provider is global, so installing an SDK provider here
    (or reusing one already installed) is enough; afterwards the exporter stops keeping spans.
    """
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider), "another kind of tracer provider is installed"
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    yield exporter
    processor.shutdown()


def ancestors(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[ReadableSpan]:
    chain: list[ReadableSpan] = []
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        chain.append(span)
    return chain


async def test_one_run_is_one_trace_covering_model_tool_and_ledger(
    exported_spans: InMemorySpanExporter, temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    DOWNSTREAM.reset()
    async with running_worker(temporal_env.client, ledger, support_registry()) as harness:
        exported_spans.clear()
        handle = await harness.start("credit-reconciled", ORDER)
        await asyncio.wait_for(handle.result(), 20)
    spans = list(exported_spans.get_finished_spans())
    key = f"{handle.id}:call_1_0"

    assert {s.context.trace_id for s in spans if s.context} == {spans[0].context.trace_id}
    names = [s.name for s in spans]
    for expected in (
        "StartWorkflow:AgentRunWorkflow",
        "RunActivity:call_model",
        "RunActivity:run_read_tool",
        "RunActivity:run_write_tool",
        "ledger.reserve",
        "ledger.complete",
    ):
        assert expected in names, f"no {expected} span among {sorted(set(names))}"

    # Connected: every span but the client's start has its parent in the same trace.
    by_id = {s.context.span_id: s for s in spans if s.context}
    roots = [s for s in spans if s.parent is None or s.parent.span_id not in by_id]
    assert [r.name for r in roots] == ["StartWorkflow:AgentRunWorkflow"]

    ledger_spans = [s for s in spans if s.name in ("ledger.reserve", "ledger.complete")]
    assert len(ledger_spans) == 2
    for span in ledger_spans:
        attributes = dict(span.attributes or {})
        assert attributes["onceflow.key"] == key
        assert attributes["onceflow.tool"] == "issue_credit"
        assert attributes["onceflow.status"] == ("started" if span.name == "ledger.reserve" else "completed")
        chain = [s.name for s in ancestors(span, by_id)]
        assert "RunActivity:run_write_tool" in chain
        assert chain[-1] == "StartWorkflow:AgentRunWorkflow"
