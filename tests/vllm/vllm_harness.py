"""Helpers for the real-vLLM tests: locate the cached vLLM venv, start/stop a server, drive traffic,
read raw spec-decode counters.

The venv and the tiny models are made by scripts/setup-vllm-cpu.sh (outside the repository, under
$SPECDECODE_VLLM_HOME, default ~/.cache/specdecode-exporter). This module runs in the exporter's
venv and talks to vLLM only over HTTP.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from devtools.procs import Launch, Process, child_env, exporter_command, free_port, start_process, start_processes, tail

VLLM_VERSION = os.environ.get("SPECDECODE_VLLM_VERSION", "0.32.0")
SERVED_MODEL_NAME = "tiny"  # the name in tests/fixtures/captured_vllm_cpu_0.32.0_ngram.prom
NUM_SPEC_TOKENS = 3

NGRAM_SPEC = {
    "method": "ngram",
    "num_speculative_tokens": NUM_SPEC_TOKENS,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}

# Per-request spec-decode metrics and timings in every response (vLLM >= 0.29): what the probe reads exactly.
PER_REQUEST_METRICS = ["--per-request-spec-decode-metrics", "summary", "--enable-per-request-metrics"]

SPEC_PREFIX = "vllm:spec_decode_"
DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"

REPO_ROOT = Path(__file__).resolve().parents[2]
# The tiny tokenizer has no chat template; this one joins the messages' contents (the captures used it too).
CHAT_TEMPLATE = REPO_ROOT / "tests" / "fixtures" / "vllm_0.32.0" / "chat_template.jinja"
TPOT = "vllm:request_time_per_output_token_seconds"  # vLLM's per-request TPOT histogram (0.11+)

T = TypeVar("T")


def vllm_home() -> Path:
    env = os.environ.get("SPECDECODE_VLLM_HOME")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "specdecode-exporter"


def vllm_python() -> Path:
    return vllm_home() / "vllm-venv" / "bin" / "python"


def model_dir(name: str = "tiny-llama") -> Path:
    return vllm_home() / "models" / name


def draft_model_spec() -> dict[str, Any]:
    """A separate, smaller tiny Llama (same tokenizer) as the draft: a different α than ngram."""
    return {
        "method": "draft_model",
        "model": str(model_dir("tiny-llama-draft")),
        "num_speculative_tokens": NUM_SPEC_TOKENS,
    }


def missing_setup() -> str | None:
    """None when the venv and models are there, else what is missing."""
    stamp = vllm_home() / "vllm-venv" / ".specdecode-vllm-ok"
    if not vllm_python().exists() or not stamp.exists():
        return f"no vLLM CPU venv at {vllm_home() / 'vllm-venv'}"
    for name in ("tiny-llama", "tiny-llama-draft"):
        if not (model_dir(name) / ".specdecode-model-ok").exists():
            return f"no tiny model at {model_dir(name)}"
    return None


def vllm_required() -> bool:
    ci = os.environ.get("CI", "").strip().lower()
    return (ci not in ("", "0", "false", "no")) or os.environ.get("SPECDECODE_REQUIRE_VLLM") == "1"


@dataclass
class VllmServer:
    """One vLLM OpenAI API server, started and stopped by devtools.procs (its own process group)."""

    model: Path
    spec_config: dict[str, Any] | None  # None: no speculative decoding (a control server)
    log_path: Path
    extra_args: list[str] = field(default_factory=list)
    process: Process | None = None

    @property
    def base_url(self) -> str:
        assert self.process is not None, "not started"
        return self.process.url

    @property
    def start_seconds(self) -> float:
        return self.process.started_seconds if self.process else 0.0

    def command(self, port: int) -> list[str]:
        return [
            str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model),
            "--served-model-name", SERVED_MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "512",
            "--dtype", "bfloat16",
            "--max-num-seqs", "8",
            "--seed", "0",
            # Eager mode: no torch.compile/inductor, so no C++ compiler needed and a ~2x faster start
            # (38 s vs 75 s here); SPECDECODE_VLLM_EAGER=0 tests the compiled path.
            *(["--enforce-eager"] if os.environ.get("SPECDECODE_VLLM_EAGER", "1") != "0" else []),
            *(["--speculative-config", json.dumps(self.spec_config)] if self.spec_config else []),
            *self.extra_args,
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        return child_env(drop=("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"), extra={
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
        })

    def launch(self) -> Launch:
        return Launch("vllm", self.command, self.log_path.parent, "/health", env=self.env(), log=self.log_path)

    def start(self, timeout: float) -> None:
        start_together([self], timeout)

    def stop(self, grace: float = 20.0) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.stop(grace)


def start_together(servers: Sequence[VllmServer], timeout: float) -> None:
    """Start the servers side by side: much of a start is waiting (the API server on its engine core, each on the
    other's imports), so two take about 40 s together against 55 s one after the other on two busy cores."""
    processes = start_processes([server.launch() for server in servers], timeout=timeout, poll=0.5)
    for server, process in zip(servers, processes, strict=True):
        server.process = process


@contextlib.contextmanager
def running_server(server: VllmServer, timeout: float) -> Iterator[VllmServer]:
    try:
        server.start(timeout)
        yield server
    finally:
        server.stop()


# ---- traffic ----------------------------------------------------------------------------------

WORDS = [
    "ka", "lo", "mi", "ren", "to", "sa", "vel", "dor", "pi", "nu", "ga", "ter", "shi", "mo", "ba", "lin",
    "kalo", "mire", "tosa", "veldor", "pinu", "gater", "shimo", "balin", "feroqua", "zendi", "arul", "ox",
]  # fmt: skip


def make_prompts(n: int, seed: int = 0) -> list[str]:
    """Prompts with repeated spans (what prompt-lookup drafting feeds on) and some plain filler."""
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        span = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))
        filler = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10)))
        if i % 3 == 2:
            items = " ".join(f"{j} ) {span} ;" for j in range(1, rng.randint(3, 6)))
            prompts.append(f"{filler} . {items}")
        else:
            prompts.append(f"{filler} . " + " . ".join([span] * rng.randint(2, 4)) + " .")
    return prompts


@dataclass
class TrafficResult:
    requests: int
    completion_tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0


def send_completions(
    base_url: str,
    prompts: list[str],
    temperatures: list[float],
    max_tokens: int = 48,
    concurrency: int = 4,
    timeout: float = 120.0,
) -> TrafficResult:
    """One completion per (prompt, temperature), `concurrency` at a time; raises on any non-200."""
    jobs = [(p, t, i) for i, (p, t) in enumerate((p, t) for t in temperatures for p in prompts)]

    def one(job: tuple[str, float, int]) -> int:
        prompt, temp, i = job
        body = {
            "model": SERVED_MODEL_NAME,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temp,
            "seed": i,
            "ignore_eos": True,  # fixed-length outputs: the number of verification steps is stable
        }
        r = client.post(base_url + "/v1/completions", json=body)
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    t0 = time.monotonic()
    with httpx.Client(timeout=timeout) as client, ThreadPoolExecutor(max_workers=concurrency) as pool:
        tokens = sum(pool.map(one, jobs))
    return TrafficResult(len(jobs), tokens, time.monotonic() - t0)


# ---- exposition -------------------------------------------------------------------------------


def scrape(base_url: str) -> str:
    r = httpx.get(base_url + "/metrics", timeout=10.0)
    r.raise_for_status()
    return r.text


@dataclass
class SpecCounters:
    """vLLM's raw V1 spec-decode counters for one engine (sums over engines when there are several)."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_pos: dict[int, float]

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        return SpecCounters(
            self.drafts - other.drafts,
            self.draft_tokens - other.draft_tokens,
            self.accepted - other.accepted,
            {p: v - other.per_pos.get(p, 0.0) for p, v in self.per_pos.items()},
        )

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None


def spec_counters(text: str) -> SpecCounters:
    """Read the raw counters by hand: sample lines only, `_total` samples only, never `_created`."""
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.startswith(SPEC_PREFIX) or not s.name.endswith("_total"):
                continue
            base = s.name[: -len("_total")]
            if base == PER_POS:
                pos = int(s.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
            else:
                sums[base] = sums.get(base, 0.0) + s.value
    missing = [n for n in (DRAFTS, DRAFT_TOKENS, ACCEPTED) if n not in sums]
    if missing:
        raise AssertionError(f"spec-decode counters missing from the exposition: {missing}")
    return SpecCounters(sums[DRAFTS], sums[DRAFT_TOKENS], sums[ACCEPTED], dict(sorted(per_pos.items())))


def family_shapes(text: str, prefix: str = SPEC_PREFIX) -> dict[str, tuple[str, frozenset[str]]]:
    """{sample name: (family type, label names)} for the families whose name starts with prefix."""
    shapes: dict[str, tuple[str, frozenset[str]]] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith(prefix):
            continue
        for s in fam.samples:
            key = s.name
            labels = frozenset(s.labels)
            if key in shapes and shapes[key] != (fam.type, labels):
                raise AssertionError(f"{key}: inconsistent label names {shapes[key]} vs {labels}")
            shapes[key] = (fam.type, labels)
    return shapes


def samples(base_url: str) -> list[Sample]:
    """Every sample of a /metrics page (vLLM's or the sidecar's)."""
    return [s for fam in text_string_to_metric_families(scrape(base_url)) for s in fam.samples]


def matches(sample: Sample, labels: Mapping[str, str]) -> bool:
    return all(sample.labels.get(k) == v for k, v in labels.items())


def sample_sum(found: list[Sample], name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels`` (0 when there are none)."""
    return float(sum(s.value for s in found if s.name == name and matches(s, labels)))


def sample_value(found: list[Sample], name: str, **labels: str) -> float | None:
    """The one sample called ``name`` with ``labels``; None when absent, AssertionError when ambiguous."""
    values = [s.value for s in found if s.name == name and matches(s, labels)]
    assert len(values) <= 1, f"{name}{labels}: {len(values)} samples"
    return float(values[0]) if values else None


@dataclass(frozen=True)
class RawHistogram:
    """A histogram read by hand from an exposition (its series summed): cumulative counts per upper bound,
    +Inf last, and _sum."""

    buckets: tuple[tuple[float, float], ...]
    total: float

    def __sub__(self, other: RawHistogram) -> RawHistogram:
        assert [b for b, _ in self.buckets] == [b for b, _ in other.buckets], "different buckets"
        return RawHistogram(tuple((b, c - o) for (b, c), (_, o) in zip(self.buckets, other.buckets, strict=True)),
                            self.total - other.total)

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0

    @property
    def mean(self) -> float:
        assert self.count > 0, "no observations"
        return self.total / self.count

    def quantile(self, q: float) -> float:
        """As Prometheus' histogram_quantile: linear within the bucket holding rank q·count, the lowest bucket
        starting at 0, a rank in the +Inf bucket giving the highest finite bound."""
        rank = q * self.count
        index = next(i for i, (_, count) in enumerate(self.buckets) if count >= rank)
        bound, count = self.buckets[index]
        if bound == math.inf:
            return self.buckets[-2][0]
        lower, below = self.buckets[index - 1] if index else (0.0, 0.0)
        return lower + (bound - lower) * ((rank - below) / (count - below))


def raw_histogram(found: list[Sample], family: str, **labels: str) -> RawHistogram:
    buckets: dict[float, float] = {}
    for s in found:
        if s.name == f"{family}_bucket" and matches(s, labels):
            buckets[float(s.labels["le"])] = buckets.get(float(s.labels["le"]), 0.0) + s.value
    count = sample_sum(found, f"{family}_count", **labels)
    assert buckets.get(math.inf) == count, f"{family}{labels}: +Inf bucket {buckets.get(math.inf)} != _count {count}"
    return RawHistogram(tuple(sorted(buckets.items())), sample_sum(found, f"{family}_sum", **labels))


def wait_until_stable(read: Callable[[], T], settle: float = 1.0, timeout: float = 30.0) -> T:
    """``read()`` once two reads ``settle`` seconds apart agree: vLLM records a finished request's counters and
    histograms on its output loop, a moment after the response may have reached the client."""
    deadline = time.monotonic() + timeout
    last = read()
    while True:
        time.sleep(settle)
        now = read()
        if now == last:
            return now
        assert time.monotonic() < deadline, f"still changing after {timeout:g} s: {last} -> {now}"
        last = now


# ---- the sidecar ------------------------------------------------------------------------------


@dataclass
class Sidecar:
    """`specdecode-exporter run` as a process; ``tap_url`` is its request tap when it has one."""

    process: Process
    tap_url: str | None = None

    @property
    def base_url(self) -> str:
        return self.process.url

    def samples(self) -> list[Sample]:
        return samples(self.base_url)


def start_sidecar(workdir: Path, config: Mapping[str, Any], *, tap: bool = False, timeout: float = 30.0) -> Sidecar:
    """The sidecar with ``config`` as its YAML config file, ready (/readyz: every target collected); with
    ``tap``, also --tap.listen-address on a free port (a new one at each start attempt). Stop it with
    ``sidecar.process.stop()``."""
    config_file = workdir / "sidecar.yaml"
    config_file.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    tap_ports: list[int] = []

    def command(port: int) -> list[str]:
        args = [*exporter_command(), "run", "--config.file", str(config_file),
                "--web.listen-address", f"127.0.0.1:{port}"]
        if tap:
            tap_ports.append(free_port())
            args += ["--tap.listen-address", f"127.0.0.1:{tap_ports[-1]}"]
        return args

    process = start_process("sidecar", command, workdir, "/readyz", timeout=timeout)
    return Sidecar(process, f"http://127.0.0.1:{tap_ports[-1]}" if tap else None)


SPEC_TARGET, CONTROL_TARGET = "spec", "control"


@contextlib.contextmanager
def sidecar_over_spec_and_control(workdir: Path, spec_url: str, control_url: str, read: Callable[[], T], *,
                                  window: str, interval_s: float, warm_requests: int, warm_tokens: int,
                                  ) -> Iterator[tuple[Sidecar, T]]:
    """One sidecar collecting a spec-decode server (target ``spec``, its baseline the control) and the same model
    without spec decode (target ``control``), with one window. Both servers are warmed first (a fresh server's
    first requests are slow), then the sidecar starts while they are idle: yields it with ``read()`` as it was at
    the sidecar's first snapshots, and checks nothing moved while it started."""
    for url in (spec_url, control_url):
        send_completions(url, make_prompts(warm_requests, seed=99), [0.0], max_tokens=warm_tokens,
                         concurrency=warm_requests)
    before = wait_until_stable(read)
    sidecar = start_sidecar(workdir, {
        "targets": [
            {"name": SPEC_TARGET, "url": f"{spec_url}/metrics", "method": "ngram",
             "baseline": {"target": CONTROL_TARGET}},
            {"name": CONTROL_TARGET, "url": f"{control_url}/metrics", "spec_decode": False},
        ],
        "collect": {"interval": f"{interval_s:g}s"},
        "windows": [window],
    })
    try:
        assert read() == before, "traffic on the servers while the sidecar started"
        yield sidecar, before
    finally:
        sidecar.process.stop()
        print(f"\nsidecar log tail ({sidecar.process.log}):\n{tail(sidecar.process.log, 20)}")


# ---- OpenAI API requests, read to the byte ----------------------------------------------------

COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"


def api_body(path: str, prompt: str, *, temperature: float, seed: int, max_tokens: int = 32,
             stream: bool = False, include_usage: bool = False, model: str = SERVED_MODEL_NAME) -> dict[str, Any]:
    """A completion or chat completion request; the prompt becomes the one user message of a chat."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
                            "ignore_eos": True}
    if path == CHAT_COMPLETIONS:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream"] = True
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    return body


@dataclass(frozen=True)
class Reply:
    """One response as the client received it: status, headers and the whole (de-chunked) body."""

    status: int
    headers: httpx.Headers
    body: bytes

    def events(self) -> list[bytes]:
        """The data of each server-sent event, in order ([DONE] included)."""
        return [event.removeprefix(b"data: ") for event in self.body.split(b"\n\n") if event.strip()]

    def json_events(self) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self.events() if e != b"[DONE]"]

    def spec_metrics(self) -> dict[str, Any] | None:
        """metrics.speculative_decoding of a plain response or of a stream's usage event; None without it."""
        documents = self.json_events() if self.headers.get("content-type", "").startswith("text/event-stream") \
            else [json.loads(self.body)]
        for document in documents:
            spec = (document.get("metrics") or {}).get("speculative_decoding")
            if spec is not None:
                return dict(spec)
        return None


def api_request(client: httpx.Client, base_url: str, path: str, body: Mapping[str, Any],
                headers: Mapping[str, str] | None = None) -> Reply:
    with client.stream("POST", base_url + path, json=dict(body), headers=dict(headers or {})) as response:
        return Reply(response.status_code, response.headers, response.read())
