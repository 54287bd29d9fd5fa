"""The sliced /metrics page: the same bytes as prometheus_client's encoders, in steps that hand the loop back."""
# The writer itself against prometheus_client's encoders, family by family: tests/unit/test_exposition.py.

from __future__ import annotations

import asyncio
import math
import random
import zlib
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.samples import Sample

from specdecode_exporter.core import metrics as m
from specdecode_exporter.core.exposition import LINES_PER_STEP, LineFormat, page_pieces
from specdecode_exporter.core.slices import run_sliced
from specdecode_exporter.sidecar.expose import PageLines, SampleSink
from specdecode_exporter.sidecar.page import Encoder, compressed_steps, new_gzip, text_format


class _Families:
    """A registry as the encoders read one: anything with collect()."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def encode(encoder: Encoder, families: list[Metric]) -> str:
    """prometheus_client's text for these families, without OpenMetrics' closing # EOF."""
    return encoder(_Families(families)).decode().removesuffix("# EOF\n")


def families() -> list[Metric]:
    gauge = Metric("specdecode_acceptance_ratio", 'α "quoted"\\ and\nnewline', "gauge")
    for i in range(3 * LINES_PER_STEP + 7):  # several steps' worth of one family
        gauge.add_sample("specdecode_acceptance_ratio", {"target": "t", "window": "5m", "engine": str(i)}, i / 7)
    gauge.add_sample("specdecode_acceptance_ratio", {"target": 'we"ird\\ va\nlue, ü', "window": "1m"}, float("nan"))
    gauge.add_sample("specdecode_acceptance_ratio", {}, float("inf"))
    counter = Metric("specdecode_drafts", "drafts", "counter")
    counter.add_sample("specdecode_drafts_total", {"target": "t"}, 1e22)
    counter.add_sample("specdecode_drafts_created", {"target": "t"}, 1700000000.0)  # the text format moves it
    histogram = Metric("specdecode_interval_acceptance_ratio", "h", "histogram")
    for le, count in (("0.5", 1.0), ("+Inf", 3.0)):
        histogram.add_sample("specdecode_interval_acceptance_ratio_bucket", {"target": "t", "le": le}, count)
    histogram.samples.append(Sample("specdecode_interval_acceptance_ratio_bucket", {"target": "u", "le": "+Inf"},
                                    2.0, None))
    histogram.add_sample("specdecode_interval_acceptance_ratio_count", {"target": "t"}, 3.0)
    empty = Metric("specdecode_up", "up", "gauge")
    return [gauge, counter, histogram, empty]


@pytest.mark.parametrize("encoder", [generate_latest, openmetrics])
def test_pieces_are_the_encoders_bytes_render_after_render(encoder: Encoder) -> None:
    line_format = LineFormat(text_format(encoder))
    reference = encode(encoder, families())
    first = "".join(page_pieces(families(), line_format))
    second = "".join(page_pieces(families(), line_format))  # from the remembered prefixes
    assert first == reference and second == reference
    assert len(list(page_pieces(families(), line_format))) > 3  # the large family comes in several steps
    assert line_format.eof == ("# EOF\n" if encoder is openmetrics else "")


def test_prefixes_of_series_gone_are_dropped_once_they_outnumber_the_page() -> None:
    line_format = LineFormat(text_format(generate_latest))
    "".join(page_pieces(families(), line_format))
    remembered = len(line_format.prefixes)
    gauge = Metric("specdecode_acceptance_ratio", "α", "gauge")
    gauge.add_sample("specdecode_acceptance_ratio", {"target": "t"}, 0.5)
    assert "".join(page_pieces([gauge], line_format)) == encode(generate_latest, [gauge])
    assert remembered > 300 and line_format.prefixes == {}
    gauge.samples[0] = gauge.samples[0]._replace(value=0.25)
    assert "".join(page_pieces([gauge], line_format)) == encode(generate_latest, [gauge])  # learnt again
    assert len(line_format.prefixes) == 1


def test_a_page_that_keeps_its_series_keeps_its_prefixes() -> None:
    line_format = LineFormat(text_format(generate_latest))
    "".join(page_pieces(families(), line_format))
    remembered = dict(line_format.prefixes)
    "".join(page_pieces(families(), line_format))
    assert line_format.prefixes == remembered


def test_label_names_are_part_of_a_prefix() -> None:
    """Two series with the same label values under different label names are two lines, never one."""
    line_format = LineFormat(text_format(generate_latest))
    gauge = Metric("g", "g", "gauge")
    gauge.add_sample("g", {"target": "t", "model_name": "0"}, 1.0)
    gauge.add_sample("g", {"target": "t", "engine": "0"}, 2.0)
    assert "".join(page_pieces([gauge], line_format)) == encode(generate_latest, [gauge])


def test_a_sliced_run_hands_the_loop_back_between_steps() -> None:
    async def main() -> tuple[list[int], list[str]]:
        order: list[str] = []

        def steps() -> Iterator[int]:
            for i in range(5):
                order.append(f"step {i}")
                yield i

        async def other() -> None:
            for _ in range(5):
                order.append("other")
                await asyncio.sleep(0)

        waiting = asyncio.ensure_future(other())
        await asyncio.sleep(0)
        done = await run_sliced(steps(), budget=0.0)  # a budget of 0: the loop back after every step
        await waiting
        return done, order

    done, order = asyncio.run(main())
    assert done == [0, 1, 2, 3, 4]
    steps_at = [i for i, what in enumerate(order) if what.startswith("step")]
    assert all(order[i + 1] == "other" for i in steps_at[:-1]), order


def test_pages_are_rendered_ahead_only_for_the_scrape_that_will_read_them() -> None:
    from specdecode_exporter.sidecar.page import SpecDecodePage

    page = SpecDecodePage(list)
    assert not page.due(100.0, lead=5.0)  # nobody scrapes: nothing rendered ahead
    page.scraped(100.0)
    assert not page.due(101.0, lead=5.0)  # one scrape, its interval unknown: the next scrape renders its own
    page.scraped(130.0)  # a scrape every 30 s, collections every 5 s
    assert not page.due(140.0, lead=5.0) and not page.due(154.0, lead=5.0)
    assert page.due(155.0, lead=5.0) and page.due(161.0, lead=5.0)  # the collection before the next scrape
    assert page.due(189.0, lead=5.0) and not page.due(190.0, lead=5.0)  # overdue by an interval: the scraper left


def _fill(sink: SampleSink, scale: float) -> None:
    hostile = {"target": 'we"ird\\ va\nlue, ü', "pool": "b", "engine": "0"}
    for position in range(3):
        sink.add(m.POSITION_ACCEPTANCE_RATIO, {**hostile, "window": "5m", "position": str(position)}, scale / 3)
    sink.add(m.ACCEPTANCE_RATIO, {"target": "t"}, None)  # unknown: no line
    sink.add(m.DRAFT_TOKENS, {"target": "t"}, 1e22 * scale)
    sink.add(m.UP, {}, math.inf)
    sink.histogram(m.INTERVAL_ACCEPTANCE, hostile, [(0.5, 1.0 * scale), (math.inf, 3.0 * scale)], 1.5)
    sink.histogram(m.INTERVAL_ACCEPTANCE, {"target": "n"}, [(-1.0, 1.0), (math.inf, 2.0)], 0.0)  # no _sum


@pytest.mark.parametrize("encoder", [generate_latest, openmetrics])
def test_page_lines_are_the_families_bytes_render_after_render(encoder: Encoder) -> None:
    """The lines read back by prometheus_client's own parser and written again by its encoder: the same bytes."""
    line_format = LineFormat(text_format(encoder))
    parse = parse_openmetrics if encoder is openmetrics else parse_text
    for scale in (1.0, 2.0):  # the second render from the remembered prefixes
        lines = PageLines(line_format)
        _fill(lines, scale)
        text = "".join(lines.pieces())
        assert text == encode(encoder, list(parse(text + line_format.eof)))
        assert text.count("\n") == len(m.COLLECTED) * 2 + 3 + 1 + 1 + 4 + 2
    assert len(line_format.prefixes) == 3 + 1 + 1 + 4 + 2  # positions, counter, up, two histograms


def test_the_pages_gzip_is_written_out_before_any_scrape() -> None:
    """The rendered page's gzip decodes to the whole page by itself: its last block is flushed at the render, so a
    scrape only codes the small live families after it (and the stream is still one gzip member that ends there)."""
    rng = random.Random(7)
    text = "".join(f'specdecode_x{{pod="{rng.random()}"}} {rng.random()}\n' for _ in range(40_000)).encode()
    gzip = new_gzip()
    head = b"".join(compressed_steps(text, gzip))
    assert zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head) == text
    tail = gzip.copy()
    whole = head + tail.compress(b"live 1\n") + tail.flush()
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert inflater.decompress(whole) == text + b"live 1\n" and inflater.eof and not inflater.unused_data


def test_a_page_is_rendered_once_per_format_whatever_version_a_client_names() -> None:
    """Any OpenMetrics version from 1.0.0 up is answered as 1.0.0 by one cached page: keyed as prometheus_client
    echoes it, every made-up version cached a page and a gzip stream of its own and was rendered again after each
    collection (a client looping over versions grew the sidecar to 1 GB)."""
    from specdecode_exporter.sidecar.page import SpecDecodePage, negotiate

    async def main() -> None:
        page = SpecDecodePage(list)
        for i in range(50):
            encoder, content_type = negotiate(f"application/openmetrics-text;version=1.0.{i}")
            assert content_type == "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores"
            await page.get(encoder, compress=True)
        assert page.renders == 1
        for accept in ("", "text/plain", "text/plain;version=0.0.4"):
            await page.get(negotiate(accept)[0], compress=False)
        assert page.renders == 2  # the text format: one more
        assert negotiate("application/openmetrics-text;version=9.9.9;escaping=dots")[0] is negotiate(
            "application/openmetrics-text;version=1.0.0;escaping=dots")[0]

    asyncio.run(main())
