"""Fuzz the ingest path with hypothesis: arbitrary bytes, mutated real expositions, and generated
expositions with hostile labels and values. No exception but CollectionFailure escapes, no input takes
long, memory stays bounded. Case counts: SPECDECODE_FUZZ_EXAMPLES per test (default 200 in `make test`;
`make fuzz` runs far more). Each test's count is printed at the end (`-s`) and appended to
$SPECDECODE_FUZZ_REPORT when set."""

from __future__ import annotations

import math
import os
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdecode_exporter.pipeline.engines import ALL_PREFIXES
from specdecode_exporter.pipeline.parse import ParseError, select_samples
from tests.fuzz.target import CONTENT_TYPES, FIXTURES, Target, seeds

EXAMPLES = int(os.environ.get("SPECDECODE_FUZZ_EXAMPLES", "200"))
MAX_SECONDS_PER_CASE = 2.0  # generous on a loaded 2-core CI box; a typical case takes < 5 ms
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])
SEEDS = seeds()
CASES: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    lines = [f"fuzz cases run: {name}={count}" for name, count in sorted(CASES.items())]
    lines.append(f"fuzz cases run: total={sum(CASES.values())}")
    sys.stderr.write("\n" + "\n".join(lines) + "\n")
    report = os.environ.get("SPECDECODE_FUZZ_REPORT")
    if report:
        with open(report, "a", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")


def timed_feed(target: Target, body: bytes, content_type: str = CONTENT_TYPES[0]) -> bool:
    started = time.perf_counter()
    ok = target.feed(body, content_type)
    elapsed = time.perf_counter() - started
    assert elapsed < MAX_SECONDS_PER_CASE, f"{elapsed:.2f}s for {len(body)} bytes"
    return ok


# ---------- strategies ----------

WEIRD_VALUES = ["NaN", "+Inf", "-Inf", "-1", "-0", "1e308", "1e309", "4.9e-324", "0x10", "1_000", "", "١", "∞",
                "9" * 400, "1.7e9", "nan", "inf"]
WEIRD_TEXT = ['"', "\\", "\\\\", '\\"', "}", "{", "\n", "\r", "\t", " ", ",", "=", "#", "\x00", "\xff", "é", "🦙",
              'position="', 'engine="0"', 'model_name="', "_created", "_total", "# EOF\n", "# TYPE x counter\n",
              "vllm:spec_decode_num_drafts_total ", "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"",
              "vllm:spec_decode_draft_acceptance_rate ", "\ufeff"]


@st.composite
def mutated_exposition(draw: st.DrawFn) -> bytes:
    text = draw(st.sampled_from(SEEDS)).decode("utf-8")
    lines = text.split("\n")
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["value", "insert", "delete", "duplicate", "swap", "truncate", "bytes", "label"]))
        i = draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        if op == "value" and " " in line:
            lines[i] = line.rsplit(" ", 1)[0] + " " + draw(st.sampled_from(WEIRD_VALUES))
        elif op == "insert":
            pos = draw(st.integers(0, len(line)))
            lines[i] = line[:pos] + draw(st.sampled_from(WEIRD_TEXT) | st.text(max_size=20)) + line[pos:]
        elif op == "delete" and line:
            a = draw(st.integers(0, len(line) - 1))
            lines[i] = line[:a] + line[draw(st.integers(a, len(line))):]
        elif op == "duplicate":
            lines.insert(i, line)
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "truncate":
            lines = lines[: i + 1]
            lines[-1] = line[: draw(st.integers(0, len(line)))]
        elif op == "label" and "{" in line:
            lines[i] = line.replace("{", "{" + draw(st.sampled_from(['a="\\"}"', 'x=""', 'model_name="other"',
                                                                      'engine="1"', '__name__="x"', "bad", ","])) +
                                    ",", 1)
    body = "\n".join(lines).encode("utf-8", "surrogatepass")
    if draw(st.booleans()):  # raw byte damage too
        data = bytearray(body)
        for _ in range(draw(st.integers(0, 4))):
            if data:
                data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        body = bytes(data)
    return body


label_values = st.text(st.characters(codec="utf-8"), max_size=30)
values = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**20), 10**20)


@st.composite
def generated_v1(draw: st.DrawFn) -> bytes:
    """Grammar-based: vLLM V1 families with hostile label values and numbers."""
    out: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        labels = {"model_name": draw(label_values), "engine": draw(label_values)}
        if draw(st.booleans()):
            labels[draw(st.sampled_from(["le", "x", "__name__", "position"]))] = draw(label_values)
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        for name in ("drafts", "draft_tokens", "accepted_tokens"):
            out.append(f"vllm:spec_decode_num_{name}_total{{{body}}} {_number(draw(values))}")
            if draw(st.booleans()):
                out.append(f"vllm:spec_decode_num_{name}_created{{{body}}} {_number(draw(values))}")
        for position in range(draw(st.integers(0, 4))):
            pos = draw(st.sampled_from([str(position), "-1", "x", "", "99999999999999999999"]))
            out.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{body},position="{pos}"}} '
                       f"{_number(draw(values))}")
    if draw(st.booleans()):
        out.append("# EOF")
    return ("\n".join(out) + "\n").encode()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return repr(value) if isinstance(value, float) else str(value)


# ---------- the fuzz tests ----------

@FUZZ
@given(st.binary(max_size=4096), st.sampled_from(CONTENT_TYPES))
def test_arbitrary_bytes(body: bytes, content_type: str) -> None:
    CASES["arbitrary_bytes"] += 1
    timed_feed(Target(), body, content_type)


@FUZZ
@given(st.lists(mutated_exposition(), min_size=1, max_size=4))
def test_mutated_real_expositions(bodies: list[bytes]) -> None:
    CASES["mutated_real"] += len(bodies)
    target = Target()  # a sequence through one collector: the stateful decoders and the store see it all
    for body in bodies:
        timed_feed(target, body)


@FUZZ
@given(st.lists(generated_v1(), min_size=1, max_size=4))
def test_generated_hostile_v1(bodies: list[bytes]) -> None:
    CASES["generated_v1"] += len(bodies)
    target = Target()
    for body in bodies:
        timed_feed(target, body)


@FUZZ
@given(st.text(max_size=2000))
def test_selective_parser_raises_only_parse_error(text: str) -> None:
    CASES["parser_text"] += 1
    try:
        samples = select_samples(text, ALL_PREFIXES)
    except ParseError:
        return
    for sample in samples:
        assert sample.name.startswith(ALL_PREFIXES)
        assert isinstance(sample.value, float)


def test_real_expositions_are_accepted() -> None:
    """Every engine's fixture is accepted; the sidecar's own output (the golden file) and TGI's (no α) are not
    engine expositions."""
    target = Target()
    engine_fixtures = [p.read_bytes() for p in sorted(FIXTURES.glob("*.prom"))
                       if not p.name.startswith(("golden", "tgi")) and b"spec" in p.read_bytes()]
    assert len(engine_fixtures) >= 8
    assert all(target.feed(seed) for seed in engine_fixtures)


# ---------- pathological inputs at the size cap: time and memory ----------

MiB = 1 << 20
PATHOLOGICAL = {
    "one_long_line": b"vllm:spec_decode_num_drafts_total " + b"9" * (4 * MiB),
    "unclosed_quote": b'vllm:spec_decode_num_drafts_total{model_name="' + b'\\"' * (2 * MiB),
    "many_labels": b"vllm:spec_decode_num_drafts_total{" + b'a="b",' * (600_000) + b"} 1\n",
    "many_tokens": b"vllm:spec_decode_num_drafts_total " + b"1 " * (2 * MiB),
    "many_selected_lines": b'vllm:spec_decode_num_drafts_total{engine="0"} 1\n' * 90_000,
    "braces": b"vllm:spec_decode_num_drafts_total" + b"{" * (4 * MiB),
    "long_label_value": b'vllm:spec_decode_num_drafts_total{model_name="' + b"x" * (4 * MiB) + b'"} 1\n',
    "unquoted_label_body": b"vllm:spec_decode_num_drafts_total{" + b"x" * (4 * MiB) + b"} 1\n",
    "prefix_only": b"vllm:spec_decode_num_\n" * 190_000,
}


# Regression: before parse.py used possessive quantifiers, Python's re kept a backtracking entry per
# character of a label body (~175 bytes each, ~2.8 GB for one 16 MiB line). Found by this test.
@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_pathological_bodies_are_fast_and_memory_bounded(name: str) -> None:
    body = PATHOLOGICAL[name]
    target = Target()
    tracemalloc.start()
    try:
        started = time.perf_counter()
        target.feed(body, render=False)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    CASES["pathological"] += 1
    assert elapsed < 20, f"{name}: {elapsed:.1f}s"  # with tracemalloc on, on a loaded box
    assert peak < 20 * len(body) + 8 * MiB, f"{name}: peak {peak / MiB:.0f} MiB for {len(body) / MiB:.1f} MiB"
