"""/metrics of the real `run` process, as scrapers see it: the contract's names, labels and bucket bounds (those of
tests/fixtures/golden_metrics.prom), content negotiation, gzip, freshness for scrapers at any phase, and memory that
does not grow with what clients send. The page itself is prometheus_client's (sidecar/metrics_page.py)."""

from __future__ import annotations

import re
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from devtools.procs import Process, exporter_command, running
from specdecode_exporter.core.contract.metrics import CONTRACT
from tests.faults.hostile import v1_body
from tests.helpers import FIXTURES, Exposition, exposition_server, help_text_problems

pytestmark = pytest.mark.timeout(180)

GOLDEN = FIXTURES / "golden_metrics.prom"
TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping={}"
# What Prometheus 3 sends by default (scrape_protocols: OpenMetrics 1.0.0, 0.0.1, text 1.0.0, 0.0.4; UTF-8 names).
PROMETHEUS_3 = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
                "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
                "text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+$")


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """The `run` process collecting a simulated vLLM (the golden page's: 2 engines, k=3) every 0.5 s."""
    workdir = tmp_path_factory.mktemp("metrics_page")
    with running("simulator", lambda p: [*exporter_command(), "simulate", "--web.listen-address", f"127.0.0.1:{p}",
                                         "--engines", "2", "--num-speculative-tokens", "3", "--acceptance-rate",
                                         "0.7", "--drafts-per-second", "150"], workdir, "/health") as simulator, \
            running("sidecar", lambda p: [*exporter_command(), "run", "--target", f"{simulator.url}/metrics",
                                          "--web.listen-address", f"127.0.0.1:{p}", "--collect.interval", "0.5s",
                                          "--collect.windows", "1m,5m"], workdir, "/readyz") as process:
        yield process


def get(sidecar: Process, accept: str = "", accept_encoding: str = "identity") -> httpx.Response:
    response = httpx.get(sidecar.url + "/metrics", headers={"Accept": accept, "Accept-Encoding": accept_encoding},
                         timeout=10)
    assert response.status_code == 200, response.text
    return response


def signatures(text: str) -> set[tuple[str, frozenset[str]]]:
    """Each sample line's name and label names (values and series counts vary with time)."""
    found = set()
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match is not None and match.group(1).startswith("specdecode_"):
            names = re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', match.group(2) or "")
            found.add((match.group(1), frozenset(names)))
    return found


def filled_page(sidecar: Process) -> str:
    """The page once every series of the golden page is on it (the windows take a few collections to fill)."""
    golden = GOLDEN.read_text()
    deadline = time.monotonic() + 60
    text = get(sidecar).text
    while signatures(golden) - signatures(text) and time.monotonic() < deadline:
        time.sleep(0.5)
        text = get(sidecar).text
    return text


def test_the_page_has_the_golden_pages_families_labels_and_bucket_bounds(sidecar: Process) -> None:
    """Breaks when a family, its HELP or TYPE, a label, an ``le`` as written (``0.5``, ``1.0``) or an info gauge's
    value changes in the running process's page."""
    golden = GOLDEN.read_text()
    text = filled_page(sidecar)
    headers = [line for line in golden.splitlines() if line.startswith("# ")]
    assert [line for line in headers if line not in text.splitlines()] == []
    assert signatures(golden) - signatures(text) == set()
    bounds = re.findall(r'specdecode_interval_acceptance_ratio_bucket\{engine="0",le="([^"]+)"', text)
    assert bounds == re.findall(r'specdecode_interval_acceptance_ratio_bucket\{engine="0",le="([^"]+)"', golden)
    assert "0.5" in bounds and "1.0" in bounds and bounds[-1] == "+Inf"
    info = Exposition.parse(text).all("specdecode_info")
    assert len(info) == 2 and set(info.values()) == {1.0}
    assert "process_resident_memory_bytes" in text and "python_gc_collections_total" in text


def test_every_help_on_the_page_is_one_sentence_of_at_most_120_characters(sidecar: Process) -> None:
    """What a user reads in the HELP lines of the running process (tests.helpers.help_text_problems); the long
    descriptions are docs/metrics.md's and never on the page."""
    text = filled_page(sidecar)
    helps = dict(line.removeprefix("# HELP ").split(" ", 1) for line in text.splitlines()
                 if line.startswith("# HELP specdecode_"))
    assert len(helps) >= GOLDEN.read_text().count("# HELP ")
    assert {name: found for name, help_text in helps.items() if (found := help_text_problems(help_text))} == {}
    assert [spec.name for spec in CONTRACT if spec.detail and spec.detail in text] == []


@pytest.mark.parametrize(("accept", "content_type"), [
    ("", TEXT_0_0_4),
    ("text/plain", TEXT_0_0_4),
    ("application/json", TEXT_0_0_4),  # nothing acceptable: the text format, not a 406
    (PROMETHEUS_3, OPENMETRICS.format("allow-utf-8")),
    ("application/openmetrics-text;version=1.0.0", OPENMETRICS.format("underscores")),
    ("application/openmetrics-text", OPENMETRICS.format("underscores")),
    # A later version is answered with the version the body is in.
    ("application/openmetrics-text;version=2.0.0", OPENMETRICS.format("underscores")),
    ("application/openmetrics-text;version=1.0.7;escaping=allow-utf-8", OPENMETRICS.format("allow-utf-8")),
    # Malformed or unknown versions: a valid page all the same (prometheus_client raised on 1.x: a 500).
    ("application/openmetrics-text;version=1.x", TEXT_0_0_4),
    ("application/openmetrics-text;version=abc, application/openmetrics-text;version=1.0.0;q=0.1",
     OPENMETRICS.format("underscores")),
    ("application/openmetrics-text;version=0.0.1", TEXT_0_0_4),
    # q-values decide, not the order written.
    ("text/plain;version=0.0.4;q=0.9, application/openmetrics-text;version=1.0.0;q=0.5", TEXT_0_0_4),
    ("text/plain;version=0.0.4;q=0.5, application/openmetrics-text;version=1.0.0", OPENMETRICS.format("underscores")),
    ("application/openmetrics-text;version=1.0.0;q=0, text/plain", TEXT_0_0_4),
    ("text/plain;version=1.0.0;escaping=dots", "text/plain; version=1.0.0; charset=utf-8; escaping=dots"),
    ("text/plain;version=1.0.0;escaping=values", "text/plain; version=1.0.0; charset=utf-8; escaping=values"),
    # OpenMetrics under dots or values escaping, which prometheus_client writes inconsistently: the next choice.
    ("application/openmetrics-text;version=1.0.0;escaping=dots;q=0.6,text/plain;version=1.0.0;escaping=dots;q=0.4",
     "text/plain; version=1.0.0; charset=utf-8; escaping=dots"),
    ("application/openmetrics-text;version=1.0.0;escaping=values;q=0.6,application/openmetrics-text;version=0.0.1;"
     "q=0.5,text/plain;version=1.0.0;escaping=values;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
     "text/plain; version=1.0.0; charset=utf-8; escaping=values"),
    ("text/plain;version=1.0.0;escaping=allow-utf-8", "text/plain; version=1.0.0; charset=utf-8; escaping=allow-utf-8"),
])
def test_negotiation(sidecar: Process, accept: str, content_type: str) -> None:
    """Breaks when q-values are ignored, a version is echoed or a malformed one fails, or an escaping Prometheus 3
    asks for is not the one written; the body is always a page its Content-Type's parser reads."""
    response = get(sidecar, accept)
    assert response.headers["content-type"] == content_type
    text = response.text
    if content_type.startswith("application/openmetrics-text"):
        assert text.endswith("# EOF\n") and text.count("# EOF") == 1
        names = {family.name for family in parse_openmetrics(text)}
    else:
        names = {family.name for family in parse_text(text)}
    if content_type.endswith("escaping=dots"):  # every underscore doubled, as Prometheus 3 undoes it
        assert "specdecode__drafts__total{" in text and "specdecode_drafts_total" not in text
    else:
        assert {"specdecode_up", "specdecode_drafts", "specdecode_info"} <= names


@pytest.mark.parametrize(("accept_encoding", "compressed"), [
    ("gzip", True), ("gzip, deflate, br", True), ("*", True), ("GZIP;q=0.5", True),
    ("identity", False), ("", False), ("gzip;q=0", False), ("gzip;q=0, *", False), ("*;q=0", False),
    ("br, *;q=0.1", True),
])
@pytest.mark.parametrize("accept", ["text/plain", "application/openmetrics-text;version=1.0.0"])
def test_gzip_only_when_accepted(sidecar: Process, accept_encoding: str, compressed: bool, accept: str) -> None:
    """Breaks when gzip is sent to a client that refused it (``gzip;q=0``) or ``*`` is misread, or when the body
    is not one gzip stream of the whole page."""
    with httpx.stream("GET", sidecar.url + "/metrics", headers={"Accept": accept, "Accept-Encoding": accept_encoding},
                      timeout=10) as response:
        raw = b"".join(response.iter_raw())
    assert response.headers["vary"] == "Accept-Encoding"
    assert (response.headers.get("content-encoding") == "gzip") is compressed
    if not compressed:
        assert b"specdecode_up" in raw
        return
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    text = inflater.decompress(raw).decode()
    assert inflater.eof and not inflater.unused_data
    assert "specdecode_up" in text and "process_resident_memory_bytes" in text
    if accept.startswith("application/openmetrics-text"):
        assert text.endswith("# EOF\n")


def rss_bytes(process: Process) -> int:
    status = Path(f"/proc/{process.popen.pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) * 1024


def test_clients_naming_made_up_versions_do_not_grow_the_process(sidecar: Process) -> None:
    """A cache keyed on the version a client names grew the sidecar from 55 MB to 1 GB; here 300 made-up versions,
    each asked for plain and gzipped, cost no more than a few MB (a page kept per version and encoding, even only
    its ~30 KB of bytes, would be 19 MB; with a gzip stream kept beside each, as then, 100 MB and more)."""
    with httpx.Client(timeout=10) as client:
        def scrape(i: int) -> None:
            for accept_encoding in ("identity", "gzip"):
                response = client.get(sidecar.url + "/metrics", headers={
                    "Accept": f"application/openmetrics-text;version=1.{i // 100}.{i % 100}",
                    "Accept-Encoding": accept_encoding})
                assert response.headers["content-type"] == OPENMETRICS.format("underscores")

        for i in range(50):  # warm: the allocator's arenas, the render threads
            scrape(i)
        before = rss_bytes(sidecar)
        for i in range(50, 350):
            scrape(i)
        grown = rss_bytes(sidecar) - before
    assert grown < 8 * 1024 * 1024, f"{grown / 2**20:.1f} MB more after 300 made-up versions"


class HeldTarget:
    """A vLLM whose n-th answer counts 300·n drafted tokens; while held, a fetch waits until released. The sidecar
    fetches again only once it has published the collection before: while a fetch waits, the newest collection
    is that of the last answer."""

    def __init__(self) -> None:
        self.arrivals = self.answers = 0
        self.holding = False
        self.changed = threading.Condition()

    def answer(self) -> bytes:
        with self.changed:
            self.arrivals += 1
            self.changed.notify_all()
            self.changed.wait_for(lambda: not self.holding, timeout=20)
            self.answers += 1
            self.changed.notify_all()
            return v1_body(300.0 * self.answers, 200.0 * self.answers)

    def hold(self) -> int:
        """Hold fetches; once one waits, the number of answers given."""
        with self.changed:
            self.holding = True
            assert self.changed.wait_for(lambda: self.arrivals > self.answers, timeout=20)
            return self.answers

    def release(self) -> None:
        """Answer the fetch that waits (before a next hold could keep it waiting)."""
        with self.changed:
            self.holding = False
            self.changed.notify_all()
            assert self.changed.wait_for(lambda: self.answers == self.arrivals, timeout=20)


@pytest.fixture
def held() -> Iterator[tuple[HeldTarget, str]]:
    target = HeldTarget()
    with exposition_server(target.answer) as url:
        yield target, url
        target.release()


def test_two_scrapers_at_different_phases_each_read_the_newest_collection(
        held: tuple[HeldTarget, str], tmp_path: Path) -> None:
    """One scraper as Prometheus (OpenMetrics, gzip) right after each collection, another (text) later in the
    interval: both read the newest collection's counters, never a page kept from before it (a page rendered ahead
    for one scraper's expected time gave a second Prometheus stale pages)."""
    target, url = held
    with running("sidecar", lambda p: [*exporter_command(), "run", "--target", url, "--web.listen-address",
                                       f"127.0.0.1:{p}", "--collect.interval", "0.2s", "--collect.timeout", "20s",
                                       "--collect.windows", "1m"], tmp_path, "/readyz") as sidecar:
        for _ in range(5):
            newest = target.hold()
            for later, (accept, accept_encoding) in enumerate(((PROMETHEUS_3, "gzip"), ("text/plain", "identity"),
                                                               ("application/openmetrics-text;version=1.0.0", ""))):
                time.sleep(0.1 * later)  # the second and third scrapers come later in the interval
                response = get(sidecar, accept, accept_encoding)
                text = response.text.removesuffix("# EOF\n")
                assert Exposition.parse(text).get("specdecode_draft_tokens_total") == 300.0 * newest
            target.release()
