"""The measurement: for each temperature × prompt group (a row), send its requests to the server, then the same
requests (prompts, temperature, max_tokens, seeds) to the baseline, and aggregate them (measure.py).

α is exact per request when the server reports its own numbers (vLLM's --per-request-spec-decode-metrics
summary): other traffic on the server does not matter then. Otherwise it is the increase of the server's
/metrics counters around the row, whose requests run alone; the probe checks that nothing else moved them (the
counters stay put while the probe has nothing in flight, and vLLM's generation tokens grow by no more than the
probe's own) and refuses, unless told to accept shared numbers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from specdecode_exporter.probe.client import (
    MetricsPage,
    ProbeFault,
    RequestRejected,
    new_client,
    scrape,
    served_models,
    stream_completion,
)
from specdecode_exporter.probe.measure import (
    COUNTERS,
    COUNTERS_SHARED,
    PER_REQUEST,
    Bands,
    Cell,
    Counters,
    RequestResult,
    Row,
    SpecCounts,
    extra_tokens,
    idle_traffic,
    make_row,
    per_request_counts,
)
from specdecode_exporter.probe.progress import Progress
from specdecode_exporter.probe.prompts import Prompt

SETTLE_SECONDS = 0.5  # between the last response and a counter scrape: vLLM records a step's stats after it
EXACT_FLAGS = "--per-request-spec-decode-metrics summary"


@dataclass(frozen=True)
class Plan:
    url: str
    baseline_url: str | None
    model: str | None  # None: the one model the server serves
    temperatures: tuple[float, ...]
    groups: tuple[tuple[str, tuple[Prompt, ...]], ...]
    requests: int  # per temperature × group, on each server
    concurrency: int
    max_tokens: int
    chat: bool = False
    ignore_eos: bool = False
    seed: int = 0  # request i of a row carries seed + i, on both servers
    allow_shared_traffic: bool = False
    request_timeout: float = 120.0
    bands: Bands = field(default_factory=Bands)
    settle_seconds: float = SETTLE_SECONDS
    warmup: int = 0  # requests per server before measuring, not counted (a fresh server's first ones are slow)

    @property
    def rows(self) -> int:
        return len(self.temperatures) * len(self.groups)

    @property
    def total_requests(self) -> int:
        return (self.rows * self.requests + self.warmup) * (2 if self.baseline_url else 1)


@dataclass
class Outcome:
    """What the probe found so far: read after a normal end, a fault, a timeout or Ctrl-C."""

    model: str | None = None
    source: str | None = None  # PER_REQUEST or COUNTERS once the first response said which
    rows: list[Row] = field(default_factory=list)
    seeds: dict[str, bool] = field(default_factory=dict)  # per URL: whether it took `seed`


@dataclass
class Server:
    url: str
    seeds: bool = True  # until the server refuses them


def _first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


class Prober:
    def __init__(self, plan: Plan, outcome: Outcome, progress: Progress, client: httpx.AsyncClient) -> None:
        self.plan, self.outcome, self.progress, self.client = plan, outcome, progress, client
        self.server = Server(plan.url)
        self.baseline = Server(plan.baseline_url) if plan.baseline_url else None
        self.page: MetricsPage | None = None
        self.last_counters: Counters | None = None

    async def pick_model(self) -> str:
        plan = self.plan
        names = await served_models(self.client, plan.url)
        if plan.model is None and len(names) > 1:
            raise ProbeFault(f"{plan.url} serves several models ({', '.join(names)}): name one with --model")
        model = plan.model or names[0]
        if model not in names:
            raise ProbeFault(f"model {model!r} is not served at {plan.url} (served: {', '.join(names)})")
        if plan.baseline_url:
            theirs = await served_models(self.client, plan.baseline_url)
            if model not in theirs:
                raise ProbeFault(f"model {model!r} is not served at the baseline {plan.baseline_url} "
                                 f"(served: {', '.join(theirs)})")
        return model

    def payload(self, model: str, temperature: float, prompt: Prompt) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, **prompt.payload(self.plan.chat), "max_tokens": self.plan.max_tokens,
                                "temperature": temperature, "stream": True,
                                "stream_options": {"include_usage": True}}
        if self.plan.ignore_eos:
            body["ignore_eos"] = True
        return body

    async def send(self, server: Server, payload: dict[str, Any], seed: int) -> RequestResult:
        body = {**payload, "seed": seed} if server.seeds else payload
        try:
            return await stream_completion(self.client, server.url, body, self.plan.chat, self.plan.request_timeout)
        except RequestRejected as exc:
            if server.seeds and exc.status == 400 and "seed" in exc.message.lower():
                server.seeds = False  # the server does not take seeds: outputs may then differ between servers
                self.outcome.seeds[server.url] = False
                return await self.send(server, payload, seed)
            raise

    async def send_all(self, server: Server, payloads: Sequence[dict[str, Any]], first: int = 0
                       ) -> list[RequestResult]:
        """Requests ``first``.. of a row's payloads, --concurrency at a time; request i carries seed + i."""
        results: list[RequestResult | None] = [None] * len(payloads)
        pending = iter(range(first, len(payloads)))

        async def worker() -> None:
            for i in pending:
                results[i] = await self.send(server, payloads[i], self.plan.seed + i)
                self.progress.advance()

        try:
            async with asyncio.TaskGroup() as tasks:
                for _ in range(min(self.plan.concurrency, len(payloads) - first)):
                    tasks.create_task(worker())
        except BaseExceptionGroup as group:
            raise _first_leaf(group) from None
        return [r for r in results if r is not None]

    async def counters(self) -> Counters:
        assert self.outcome.model is not None
        page = await scrape(self.client, self.plan.url, self.outcome.model)
        if page is None or page.counters is None:
            raise ProbeFault(f"{self.plan.url}/metrics no longer has the spec-decode counters; α cannot be measured "
                             f"without them (or start vLLM with {EXACT_FLAGS})")
        return page.counters

    async def settled_counters(self) -> Counters:
        await asyncio.sleep(self.plan.settle_seconds)
        return await self.counters()

    def decide_source(self, results: Sequence[RequestResult]) -> str:
        """From the first response: exact per-request numbers, else counter deltas, else no spec decode."""
        failed = next((r.error for r in results if not r.ok), None)
        if failed is not None:
            raise ProbeFault(f"the first request to {self.plan.url} failed ({failed}): nothing to measure")
        if any(r.spec is not None for r in results):
            return PER_REQUEST
        if self.page is not None and self.page.counters is not None:
            return COUNTERS
        url = self.plan.url
        if self.page is not None and self.page.spec_families:
            raise ProbeFault(f"{url} has no vLLM V1 spec-decode counters for model {self.outcome.model!r} and its "
                             f"responses carry no per-request spec metrics: start vLLM with {EXACT_FLAGS}")
        raise ProbeFault(f"{url} does not run speculative decoding: no vllm:spec_decode_* metrics on /metrics and "
                         "no metrics.speculative_decoding in its responses")

    async def first_request(self, payload: dict[str, Any]) -> RequestResult:
        """Alone: its response says what the server reports (or that it does not run spec decode)."""
        result = await self.send(self.server, payload, self.plan.seed)
        self.outcome.source = self.decide_source([result])
        self.progress.start(self.plan.total_requests, self.plan.rows, done=1)
        return result

    async def warm_up(self) -> None:
        """--warmup requests to each server, at the first temperature, before anything is measured."""
        model = self.outcome.model
        assert model is not None
        prompts = [prompt for _, group in self.plan.groups for prompt in group]
        payloads = [self.payload(model, self.plan.temperatures[0], prompts[i % len(prompts)])
                    for i in range(self.plan.warmup)]
        self.progress.working_on("warm-up")
        await self.first_request(payloads[0])
        await self.send_all(self.server, payloads, first=1)
        if self.baseline is not None:
            await self.send_all(self.baseline, payloads)

    async def measure_cell(self, temperature: float, group: str, prompts: Sequence[Prompt]) -> Cell:
        model = self.outcome.model
        assert model is not None
        payloads = [self.payload(model, temperature, prompts[i % len(prompts)]) for i in range(self.plan.requests)]
        self.progress.working_on(f"T={temperature:g} {group}")
        watch = self.outcome.source != PER_REQUEST and self.page is not None and self.page.counters is not None
        shared: list[str] = []
        idle: Counters | None = None
        if watch and self.last_counters is not None:
            idle = self.last_counters  # the previous row's idle check ended here
        elif watch:
            before = await self.counters()
            idle = await self.settled_counters()
            shared += [why for why in [idle_traffic(before, idle)] if why]
        results = [] if self.outcome.source is not None else [await self.first_request(payloads[0])]
        results += await self.send_all(self.server, payloads, first=len(results))
        counts: SpecCounts | None
        if self.outcome.source == COUNTERS:
            assert idle is not None
            after = await self.settled_counters()
            self.last_counters = await self.settled_counters()
            counts = after.minus(idle)
            probe_tokens = sum(r.completion_tokens for r in results)
            checks = [idle_traffic(after, self.last_counters)]
            if all(r.ok for r in results):
                checks.insert(0, extra_tokens(idle, after, probe_tokens))
            shared += [why for why in checks if why]
        else:
            counts = per_request_counts(results)
        if shared and not self.plan.allow_shared_traffic:
            raise ProbeFault(f"other traffic on {self.plan.url}: {shared[0]}; α from counter deltas would be wrong. "
                             f"Start vLLM with {EXACT_FLAGS} for exact per-request numbers, or pass "
                             "--allow-shared-traffic to accept numbers marked shared")
        baseline = None
        if self.baseline is not None:
            self.progress.working_on(f"T={temperature:g} {group} (baseline)")
            baseline = await self.send_all(self.baseline, payloads)
        source = COUNTERS_SHARED if shared else self.outcome.source or PER_REQUEST
        return Cell(temperature, group, results, counts, source, baseline, tuple(dict.fromkeys(shared)))

    async def run(self) -> None:
        self.outcome.model = await self.pick_model()
        self.page = await scrape(self.client, self.plan.url, self.outcome.model)
        self.outcome.seeds = {url: True for url in (self.plan.url, self.plan.baseline_url) if url}
        if self.plan.warmup:
            await self.warm_up()
        for temperature in self.plan.temperatures:
            for group, prompts in self.plan.groups:
                row = make_row(await self.measure_cell(temperature, group, prompts), self.plan.bands)
                self.outcome.rows.append(row)
                self.progress.row_done(row)


async def run_probe(plan: Plan, outcome: Outcome, progress: Progress) -> None:
    """Measure every row into ``outcome.rows``; ProbeFault on an expected failure. What was measured stays in
    ``outcome`` when this raises or is cancelled (Ctrl-C, the total timeout)."""
    async with new_client() as client:
        await Prober(plan, outcome, progress, client).run()
