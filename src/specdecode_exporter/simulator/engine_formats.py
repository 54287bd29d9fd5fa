"""Exposition writers for the engines beyond vLLM, from the same simulator snapshots (docs/engines-research.md has
the facts, tests/fixtures/{llamacpp,sglang,trtllm,tgi}_spec.prom the reference shapes):

- ``llamacpp``: llama-server ``--metrics``: hand-written text, no labels, numbers with a C++ stream's 6 significant
  digits, the per-position family only once a draft was verified; one model, one slot pool;
- ``sglang``: prometheus_client multiprocess text: counters with the tokenizer's labels (no rank), gauges with the
  scheduler's (``dp_rank`` only with several engines); the spec gauges are the engine's last-window figures;
- ``trtllm``: trtllm-serve's ``/prometheus/metrics``: multiprocess text, every gauge with ``pid``, config info
  gauges, the iteration token counters and per-position counters only once something was drafted;
- ``tgi``: text-generation-inference: unlabelled counters without ``_total`` and the skipped-tokens summary;
- ``vllm-diffusion``: vLLM serving a diffusion LLM: the spec-decode counters under ``vllm:diffusion_*`` names.

The families that only describe load (throughput, batch, KV cache) carry plausible values; the speculative ones
carry the snapshot's exact counts, as the vLLM formats do.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable

from specdecode_exporter.simulator.model import PREFILL_SECONDS_PER_TOKEN
from specdecode_exporter.simulator.simulator import EngineSnapshot, ModelSnapshot
from specdecode_exporter.simulator.text_format import Family, Series, write_text

Block = tuple[str, str]  # (family name, its text: HELP, TYPE and samples)

STREAMING_SHARE = 0.8  # SGLang splits its token counters by is_streaming; the simulator does not model it
TRTLLM_METHODS = {"mtp": "MTP", "eagle3": "Eagle3", "eagle": "Eagle", "medusa": "Medusa", "ngram": "NGram",
                  "draft_model": "DraftTarget", "lookahead": "Lookahead"}


def render_engine_format(fmt: str, models: tuple[ModelSnapshot, ...], drop_spec: bool) -> bytes:
    blocks = WRITERS[fmt](models)
    if drop_spec:  # the fault: speculation switched off, or the families renamed by an upgrade
        blocks = [(name, text) for name, text in blocks if not _is_spec_family(name)]
    return "".join(text for _, text in blocks).encode()


def _is_spec_family(name: str) -> bool:
    return "spec" in name or "diffusion" in name or name == "tgi_request_skipped_tokens"


def _hand_written(name: str, kind: str, help_: str, samples: Iterable[tuple[str, str]]) -> Block:
    """A family written line by line; each sample is (what follows the name: labels or a suffix, value text)."""
    lines = [f"# HELP {name} {help_}\n", f"# TYPE {name} {kind}\n"]
    lines.extend(f"{name}{tail} {value}\n" for tail, value in samples)
    return name, "".join(lines)


def _multiprocess(family: Family) -> Block:
    """One family as prometheus_client's MultiProcessCollector writes it (no _created, _sum before buckets)."""
    name = f"{family.name}_total" if family.kind == "counter" else family.name
    return name, write_text((family,), created=False, sum_first=True)


def _requests(e: EngineSnapshot) -> int:
    return sum(e.requests.values())


# ----- llama.cpp (tools/server/server-task.cpp, server_task_result_metrics::to_metrics) -----
def cpp_number(value: float) -> str:
    """A double as ``std::stringstream << value`` prints it: %g with 6 significant digits (1.28394e+06)."""
    return f"{value:g}"


def llamacpp_blocks(models: tuple[ModelSnapshot, ...]) -> list[Block]:
    (m,) = models  # one model, one slot pool: validated by the scenario
    (e,) = m.engines
    spec = m.spec
    generating_seconds = e.histograms["itl"].sum
    prompt_seconds = e.prompt_tokens * PREFILL_SECONDS_PER_TOKEN

    def one(name: str, kind: str, help_: str, value: float) -> Block:
        return _hand_written(f"llamacpp:{name}", kind, help_, [("", cpp_number(value))])

    blocks = [
        one("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens",
            e.prompt_tokens),
        one("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache", 0),
        one("prompt_seconds_total", "counter", "Total time spent processing prompts", prompt_seconds),
        one("tokens_predicted_total", "counter", "Number of generation tokens processed", e.generation_tokens),
        one("tokens_predicted_seconds_total", "counter", "Total time spent generating tokens", generating_seconds),
        one("n_decode_total", "counter",
            "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
            _requests(e) + e.drafts),
        one("n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)",
            spec.prompt_tokens + spec.output_tokens if _requests(e) else 0),
        one("spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated",
            e.draft_tokens),
        one("spec_decode_num_accepted_tokens_total", "counter",
            "Speculative: Total draft tokens accepted by the target model", e.accepted),
        one("spec_decode_num_drafts_total", "counter", "Speculative: Total speculative decoding verification steps",
            e.drafts),
        one("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s",
            e.prompt_tokens / prompt_seconds if prompt_seconds else 0),
        one("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s",
            e.generation_tokens / generating_seconds if generating_seconds else 0),
        one("requests_processing", "gauge", "Number of requests processing", e.running),
        one("requests_deferred", "gauge", "Number of requests deferred", e.waiting),
        one("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call",
            max(1, e.running)),
    ]
    if e.drafts > 0:  # printed only once the per-position vector exists: after the first verified draft
        blocks.append(_hand_written(
            "llamacpp:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position",
            [(f'{{position="{i}"}}', cpp_number(n)) for i, n in enumerate(e.per_pos)]))
    return blocks


# ----- SGLang (python/sglang/srt/observability/metrics_collector.py) -----
def sglang_blocks(models: tuple[ModelSnapshot, ...]) -> list[Block]:
    def tokenizer(m: ModelSnapshot, *extra: tuple[str, str]) -> tuple[tuple[str, str], ...]:
        return (("engine_type", "unified"), ("model_name", m.spec.name), *extra)

    def scheduler(m: ModelSnapshot, e: EngineSnapshot) -> tuple[tuple[str, str], ...]:
        rank = (("dp_rank", str(e.engine)),) if len(m.engines) > 1 else ()
        return (*rank, ("engine_type", "unified"), ("model_name", m.spec.name), ("moe_ep_rank", "0"),
                ("pp_rank", "0"), ("tp_rank", "0"))

    def by_streaming(name: str, help_: str, value: Callable[[EngineSnapshot], int]) -> Family:
        series: list[Series] = []
        for m in models:
            total = sum(value(e) for e in m.engines)
            streamed = math.floor(total * STREAMING_SHARE)
            series += [Series(tokenizer(m, ("is_streaming", "true")), float(streamed)),
                       Series(tokenizer(m, ("is_streaming", "false")), float(total - streamed))]
        return Family(name, "counter", help_, tuple(series))

    def gauge(name: str, help_: str, value: Callable[[ModelSnapshot, EngineSnapshot], float]) -> Family:
        return Family(name, "gauge", help_, tuple(Series(scheduler(m, e), float(value(m, e)))
                                                 for m in models for e in m.engines))

    def window(figure: Callable[[ModelSnapshot], float]) -> Callable[[ModelSnapshot, EngineSnapshot], float]:
        # The last 40-batch window's figure; 0 until a first window was computed.
        return lambda m, e: figure(m) if e.drafts > 0 else 0.0

    k = {m.spec.name: m.spec.num_speculative_tokens for m in models}
    families = [
        by_streaming("sglang:prompt_tokens", "Number of prefill tokens processed.", lambda e: e.prompt_tokens),
        by_streaming("sglang:generation_tokens", "Number of generation tokens processed.",
                     lambda e: e.generation_tokens),
        by_streaming("sglang:num_requests", "Number of requests processed.", _requests),
        Family("sglang:spec_verify_calls", "counter", "Number of speculative decoding verification calls.",
               tuple(Series(tokenizer(m), float(sum(e.drafts for e in m.engines))) for m in models)),
        gauge("sglang:num_running_reqs", "The number of running requests.", lambda m, e: e.running),
        gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", lambda m, e: e.waiting),
        gauge("sglang:token_usage", "The token usage.", lambda m, e: e.kv_cache_usage),
        gauge("sglang:spec_accept_length",
              "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
              window(lambda m: 1.0 + sum(m.fractions))),
        gauge("sglang:spec_accept_rate",
              "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
              window(lambda m: sum(m.fractions) / k[m.spec.name])),
        gauge("sglang:spec_cap_length", "Mean DSpark confidence-scheduled verify window per verify step, incl the "
              "bonus slot (0 when no cap is scheduled).", lambda m, e: 0.0),
        gauge("sglang:spec_block_accept_length", "Mean uncapped full-block accept length per verify step (accept + "
              "cap-trimmed drafts; exact only in DSpark cap-accept mode).", lambda m, e: 0.0),
        gauge("sglang:spec_num_steps", "Currently active speculative_num_steps.", lambda m, e: k[m.spec.name]),
        gauge("sglang:spec_num_draft_tokens",
              "Currently active speculative_num_draft_tokens (decouples from steps under topk>1).",
              lambda m, e: k[m.spec.name] + 1),
    ]
    return [_multiprocess(f) for f in families]


# ----- TensorRT-LLM (tensorrt_llm/metrics/collector.py, served at /prometheus/metrics) -----
def trtllm_blocks(models: tuple[ModelSnapshot, ...]) -> list[Block]:
    pid = str(os.getpid())

    def labels(m: ModelSnapshot, *extra: tuple[str, str]) -> tuple[tuple[str, str], ...]:
        return (("engine_type", "pytorch"), ("model_name", m.spec.name), *extra)

    def gauge(name: str, help_: str, value: Callable[[ModelSnapshot, EngineSnapshot], float],
              *extra: Callable[[ModelSnapshot], tuple[tuple[str, str], ...]], drafted_only: bool = False) -> Family:
        series = tuple(Series(labels(m, ("pid", pid), *(x for f in extra for x in f(m))), float(value(m, e)))
                       for m in models for e in m.engines if e.drafts > 0 or not drafted_only)
        return Family(name, "gauge", help_, series)

    def counter(name: str, help_: str, value: Callable[[EngineSnapshot], float], drafted_only: bool = False
                ) -> Family:
        return Family(name, "counter", help_, tuple(Series(labels(m), float(value(e)))
                                                   for m in models for e in m.engines
                                                   if e.drafts > 0 or not drafted_only))

    def per_position(name: str, help_: str, counts: Callable[[ModelSnapshot, EngineSnapshot], list[float]]
                     ) -> Family:
        return Family(name, "counter", help_, tuple(
            Series(labels(m, ("token_position", str(i))), float(n))
            for m in models for e in m.engines for i, n in enumerate(counts(m, e)) if n > 0))

    def speculative(m: ModelSnapshot) -> tuple[tuple[str, str], ...]:
        method = TRTLLM_METHODS.get(m.spec.method, m.spec.method)
        return (("spec_enabled", "true"), ("spec_method", method),
                ("spec_num_tokens", str(m.spec.num_speculative_tokens)))

    def drafted(m: ModelSnapshot, e: EngineSnapshot) -> list[float]:
        """Drafts that reached each position: with a schedule (draft_len_schedule, the model's
        num_speculative_tokens_per_batch_size) the positions beyond the k of a step are not drafted at it."""
        return [float(n) for n in e.drafted_per_pos]

    families = [
        gauge("trtllm_speculative_config_info", "Speculative decoding configuration info", lambda m, e: 1.0,
              speculative),
        gauge("trtllm_num_requests_running", "Number of active requests", lambda m, e: e.running),
        gauge("trtllm_num_requests_waiting", "Number of queued requests", lambda m, e: e.waiting),
        gauge("trtllm_spec_decode_acceptance_length", "Acceptance length in speculative decoding",
              lambda m, e: 1.0 + sum(m.fractions), drafted_only=True),
        gauge("trtllm_spec_decode_draft_overhead", "Draft overhead in speculative decoding",
              lambda m, e: m.spec.cost_per_draft_token / 4, drafted_only=True),
        counter("trtllm_prompt_cached_tokens",
                "Process-lifetime total prompt tokens served from KV cache. Resets only when the serving process "
                "restarts, not when the KV cache is flushed or evicted.", lambda e: 0.0),
        counter("trtllm_prompt_tokens", "Cumulative number of prompt (input) tokens processed.",
                lambda e: e.prompt_tokens),
        counter("trtllm_generation_tokens", "Cumulative number of generation (output) tokens produced.",
                lambda e: e.generation_tokens),
        per_position("trtllm_spec_decode_drafted_tokens", "Total drafted tokens per speculative decoding position.",
                     drafted),
        per_position("trtllm_spec_decode_accepted_tokens",
                     "Total accepted tokens per speculative decoding position.", lambda m, e: list(e.per_pos)),
        counter("trtllm_spec_decode_num_draft_tokens", "Total number of draft tokens in speculative decoding",
                lambda e: e.draft_tokens, drafted_only=True),
        counter("trtllm_spec_decode_num_accepted_tokens", "Total number of accepted tokens in speculative decoding",
                lambda e: e.accepted, drafted_only=True),
        counter("trtllm_num_requests_completed", "Total number of completed requests across iterations", _requests),
        Family("trtllm_e2e_request_latency_seconds", "histogram", "Histogram of end to end request latency in seconds.",
               tuple(Series(labels(m), e.histograms["e2e"]) for m in models for e in m.engines)),
    ]
    return [_multiprocess(f) for f in families if f.series]  # multiprocess mode prints no empty family


# ----- TGI (router/src/server.rs; metrics-exporter-prometheus renders a histogram without buckets as a summary) -----
SUMMARY_QUANTILES = ("0", "0.5", "0.9", "0.95", "0.99", "0.999", "1")


def skipped_token_quantile(m: ModelSnapshot, e: EngineSnapshot, q: float) -> int:
    """The q-quantile of the tokens a generation carried beyond the first (a prefill carries none)."""
    generations = e.drafts + _requests(e)
    if generations <= 0:
        return 0
    more_than = [e.drafts / generations * f for f in m.fractions]  # P(value > j) for j = 0..k-1
    j = 0
    while j < len(more_than) and 1.0 - more_than[j] < q:
        j += 1
    return j


def tgi_blocks(models: tuple[ModelSnapshot, ...]) -> list[Block]:
    (m,) = models
    (e,) = m.engines
    requests = _requests(e)
    skipped = [(f'{{quantile="{q}"}}', str(skipped_token_quantile(m, e, float(q)))) for q in SUMMARY_QUANTILES]
    return [
        _hand_written("tgi_request_count", "counter", "Total number of requests", [("", str(requests))]),
        _hand_written("tgi_request_success", "counter", "Number of successful requests", [("", str(requests))]),
        _hand_written("tgi_batch_inference_count", "counter", "Inference calls per method (prefill or decode)",
                      [('{method="prefill"}', str(requests)), ('{method="decode"}', str(e.drafts))]),
        _hand_written("tgi_queue_size", "gauge", "Current queue size", [("", str(e.waiting))]),
        _hand_written("tgi_batch_current_size", "gauge", "Current batch size", [("", str(e.running))]),
        _hand_written("tgi_request_skipped_tokens", "summary", "Speculated tokens per request",
                      [*skipped, ("_sum", str(e.accepted)), ("_count", str(e.drafts + requests))]),
    ]


# ----- vLLM serving a diffusion LLM (vllm/v1/spec_decode/metrics.py, SpecDecodingProm with is_diffusion) -----
def diffusion_blocks(models: tuple[ModelSnapshot, ...]) -> list[Block]:
    """The spec-decode counters under their diffusion names (denoising steps, canvas positions evaluated, committed
    tokens: drafts, drafted and accepted tokens of the same data path), labelled model_name and engine, each with
    its _created sample; no per-position family and no vllm:spec_decode_* family."""
    def counter(name: str, help_: str, value: Callable[[EngineSnapshot], float]) -> Block:
        series = tuple(Series((("engine", str(e.engine)), ("model_name", m.spec.name)), float(value(e)), e.created)
                       for m in models for e in m.engines)
        return name + "_total", write_text((Family(name, "counter", help_, series),), created=True, sum_first=False)

    return [
        counter("vllm:diffusion_num_denoising_steps", "Number of denoising steps.", lambda e: e.drafts),
        counter("vllm:diffusion_num_canvas_positions", "Number of canvas positions evaluated.",
                lambda e: e.draft_tokens),
        counter("vllm:diffusion_num_committed_tokens", "Number of committed (finalized) tokens.", lambda e: e.accepted),
    ]


WRITERS: dict[str, Callable[[tuple[ModelSnapshot, ...]], list[Block]]] = {
    "vllm-diffusion": diffusion_blocks,
    "llamacpp": llamacpp_blocks,
    "sglang": sglang_blocks,
    "trtllm": trtllm_blocks,
    "tgi": tgi_blocks,
}
