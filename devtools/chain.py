"""The real alert chain on loopback: fake vLLM → sidecar → Prometheus (the generated rules) → Alertmanager
(the example routing tree) → a local webhook receiver.

Used by tests/e2e/test_alert_chain.py and, interactively, by `make see-it-work` (scripts/see-it-work.sh runs
`python -m devtools.chain`). Every process is started and stopped by devtools.procs.

Prometheus and Alertmanager are Debian's packages (scripts/install-tools.sh): /usr/bin/prometheus and
/usr/bin/prometheus-alertmanager. Override with $PROMETHEUS and $ALERTMANAGER.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml

from devtools.procs import (
    ROOT,
    Process,
    StartError,
    alertmanager_binary,
    exporter_command,
    prometheus_binary,
    start_process,
    tail,
)
from devtools.stack import Prometheus
from specdecode_exporter.core.config.validation import duration_seconds, parse_duration
from specdecode_exporter.core.contract import monitoring_config
from specdecode_exporter.core.contract.monitoring_config import MonitoringConfig
from specdecode_exporter.monitoring.build import dump_yaml, render_rules, sources
from specdecode_exporter.monitoring.mixin import with_value
from specdecode_exporter.monitoring.rules import alpha_record, recording_groups, rule_groups

AM_EXAMPLE = ROOT / "alerts" / "alertmanager.example.yml"
PROFILE = "e2e"

PAGE_ALERT = "SpecDecodeAcceptanceRateLow"
NAMESPACE = "e2e"
JOB = "specdecode-sidecar"  # matches the rules' exporter_job selector job=~".*specdecode.*"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # the simulator's default model
HEALTHY_ALPHA = 0.75
DRAFTS_PER_SECOND = 200.0

SCRAPE_INTERVAL_S = 1.0
EVALUATION_INTERVAL_S = 1.0
COLLECT_INTERVAL_S = 1.0
# Alertmanager timers for the test; the routing tree itself is the example's.
GROUP_WAIT_S = 1.0
GROUP_INTERVAL_S = 2.0
REPEAT_INTERVAL = "5m"


def seconds(duration: str) -> float:
    """A Prometheus duration (15s, 1m30s) in seconds."""
    return parse_duration(duration, "duration", allow_zero=True)


def fmt_duration(value: float) -> str:
    """Seconds as a Prometheus duration: 1.0 -> 1s, 0.5 -> 500ms."""
    return f"{value:g}s" if float(value).is_integer() else f"{round(value * 1000)}ms"


# ---------------------------------------------------------------------------------------- the webhook


@dataclass(frozen=True)
class Notification:
    received: float  # time.time() when the webhook got it
    receiver: str  # the URL path: /pager or /ticket
    payload: dict[str, Any]

    @property
    def status(self) -> str:
        return str(self.payload.get("status"))

    def alerts(self, alertname: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
        return [
            a for a in self.payload.get("alerts", [])
            if (alertname is None or a.get("labels", {}).get("alertname") == alertname)
            and (status is None or a.get("status") == status)
        ]


class Webhook:
    """A threaded HTTP server on 127.0.0.1:<free> that stores every JSON payload Alertmanager posts."""

    def __init__(self, echo: bool = False) -> None:
        self._lock = threading.Condition()
        self._items: list[Notification] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                try:
                    payload = json.loads(body)
                except ValueError:
                    payload = {"unparsed": body.decode(errors="replace")}
                owner._add(Notification(time.time(), self.path, payload))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.echo = echo
        self._thread = threading.Thread(target=self.server.serve_forever, name="webhook", daemon=True)
        self._thread.start()

    def _add(self, item: Notification) -> None:
        if self.echo:
            print(describe_notification(item), flush=True)
        with self._lock:
            self._items.append(item)
            self._lock.notify_all()

    def all(self) -> list[Notification]:
        with self._lock:
            return list(self._items)

    def find(self, receiver: str | None = None, alertname: str | None = None, status: str | None = None,
             since: float = 0.0) -> list[Notification]:
        return [
            n for n in self.all()
            if n.received >= since and (receiver is None or n.receiver == receiver)
            and n.alerts(alertname, status)
        ]

    def wait_for(self, timeout: float, **match: Any) -> Notification | None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                found = self.find(**match)
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(min(left, 0.5))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


def describe_notification(n: Notification) -> str:
    parts = []
    for a in n.payload.get("alerts", []):
        labels = a.get("labels", {})
        parts.append(f"{a.get('status')} {labels.get('alertname')} severity={labels.get('severity')} "
                     f"namespace={labels.get('namespace')} model_name={labels.get('model_name')}\n"
                     f"    summary: {a.get('annotations', {}).get('summary')}\n"
                     f"    description: {a.get('annotations', {}).get('description')}\n"
                     f"    runbook_url: {a.get('annotations', {}).get('runbook_url')}")
    stamp = time.strftime("%H:%M:%S", time.localtime(n.received))
    return f"[{stamp}] webhook {n.receiver} ({n.status}):\n  " + "\n  ".join(parts)


# ----------------------------------------------------------------------------------------- the configs


def rules_settings() -> MonitoringConfig:
    """The monitoring config with the e2e profile applied (the values the chain's rules are built from)."""
    return monitoring_config.load(profile=PROFILE)


def write_rules(out: Path) -> None:
    out.write_text(render_rules(sources(None, PROFILE)), encoding="utf-8")


def write_shipped_rules(out: Path, recordings_only: bool = False) -> Path:
    """The shipped rules (the default config) for a ruler that runs a minute or two: their window groups at the
    ruler's own interval instead of their shipped windows.evaluation_interval (1m), and the whole short stage at the
    page's step instead of windows.stage_interval (1m), so that every group evaluates within the run; with
    ``recordings_only``, the recording groups alone."""
    shipped = monitoring_config.shipped()
    cfg = with_value(with_value(shipped, "windows.evaluation_interval", None), "windows.stage_interval",
                     shipped.statistics.evaluation_interval)
    out.write_text(dump_yaml({"groups": recording_groups(cfg)} if recordings_only else rule_groups(cfg)),
                   encoding="utf-8")
    return out


def prometheus_config(sidecar: str, alertmanager: str, rules: Path) -> dict[str, Any]:
    return {
        "global": {
            "scrape_interval": fmt_duration(SCRAPE_INTERVAL_S),
            "scrape_timeout": fmt_duration(SCRAPE_INTERVAL_S),
            "evaluation_interval": fmt_duration(EVALUATION_INTERVAL_S),
        },
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [{
            "job_name": JOB,
            "static_configs": [{"targets": [sidecar], "labels": {"namespace": NAMESPACE}}],
        }],
    }


def alertmanager_config(webhook_url: str, example: Path = AM_EXAMPLE) -> dict[str, Any]:
    """The example config with every receiver's webhooks pointed at `webhook_url/<receiver>` and short timers.

    Routes, matchers, grouping and inhibitions stay exactly as shipped, so the routing under test is the real one.
    """
    cfg: dict[str, Any] = yaml.safe_load(example.read_text())
    for receiver in cfg["receivers"]:
        hooks = receiver.get("webhook_configs")
        assert hooks, f"receiver {receiver['name']} has no webhook_configs to redirect"
        for hook in hooks:
            hook["url"] = f"{webhook_url}/{receiver['name']}"

    def shorten(route: dict[str, Any], top: bool) -> None:
        for key, value in (("group_wait", fmt_duration(GROUP_WAIT_S)),
                           ("group_interval", fmt_duration(GROUP_INTERVAL_S)),
                           ("repeat_interval", REPEAT_INTERVAL)):
            # A timer the example already sets shorter stays (the page's group_wait: 0s).
            if top or (key in route and duration_seconds(route[key], allow_zero=True) > duration_seconds(value)):
                route[key] = value
        for child in route.get("routes", []):
            shorten(child, False)

    shorten(cfg["route"], True)
    return cfg


# ---------------------------------------------------------------------------------------------- chain


@dataclass
class Chain:
    workdir: Path
    webhook: Webhook
    settings: MonitoringConfig
    simulator: Process
    sidecar: Process
    prometheus: Process
    alertmanager: Process
    client: httpx.Client = field(default_factory=lambda: httpx.Client(trust_env=False, timeout=10))
    started: float = field(default_factory=time.time)  # when Prometheus became ready: its history starts here
    api: Prometheus = field(init=False)  # Prometheus' HTTP API (devtools.stack), on this chain's client

    def __post_init__(self) -> None:
        self.api = Prometheus(self.prometheus, self.client)

    # --- the rules' own figures
    @property
    def page_for_s(self) -> float:
        return seconds(self.settings.alert(PAGE_ALERT).for_)

    @property
    def page_threshold(self) -> float:
        return self.settings.thresholds.page_acceptance_ratio

    @property
    def page_window(self) -> str:
        """The page's shortest window: at the chain's traffic it is the one that proves α low."""
        return self.settings.statistics.page_windows[0]

    @property
    def alpha_record(self) -> str:
        """The recording rule the page fires on, e.g. model:specdecode_acceptance_ratio:rate1m."""
        return alpha_record(self.settings, self.page_window)

    @property
    def model_selector(self) -> str:
        return f'{{namespace="{NAMESPACE}", model_name="{MODEL}"}}'

    # --- the fake vLLM
    def phase(self, **payload: Any) -> None:
        self.client.post(self.simulator.url + "/-/phase", json=payload).raise_for_status()

    def restart_vllm(self) -> None:
        self.client.post(self.simulator.url + "/-/restart").raise_for_status()

    def vllm_metrics(self) -> str:
        return self.client.get(self.simulator.url + "/metrics").text

    # --- Prometheus
    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        return self.api.query(expr, at)

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def samples(self, expr: str, since: float) -> list[tuple[float, float]]:
        """(timestamp, value) samples of a series selector over [since, now], oldest first."""
        rng = max(1, int(time.time() - since) + 2)
        result = self.query(f"{expr}[{rng}s]")
        out = sorted((float(t), float(v)) for series in result for t, v in series["values"])
        return [(t, v) for t, v in out if t >= since]

    def alpha(self) -> float | None:
        """The page's recording rule for the test's model, as Prometheus has it now."""
        return self.scalar(self.alpha_record + self.model_selector)

    def page_states(self) -> set[str]:
        """States ('pending', 'firing') of the page alert in Prometheus right now."""
        return {a["state"] for a in self.api.alerts(PAGE_ALERT)}

    def alert_transitions(self, since: float) -> dict[str, float]:
        """First timestamp of ALERTS{alertname=page, alertstate=pending|firing} since `since`."""
        first: dict[str, float] = {}
        for state in ("pending", "firing"):
            sel = f'ALERTS{{alertname="{PAGE_ALERT}", alertstate="{state}", namespace="{NAMESPACE}"}}'
            got = self.samples(sel, since)
            if got:
                first[state] = got[0][0]
        return first

    def wait(self, condition: Callable[[], bool], timeout: float, what: str, poll: float = 0.25) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if condition():
                return time.time()
            time.sleep(poll)
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n{self.diagnostics()}")

    def wait_healthy(self, min_alpha: float = 0.7, min_history_s: float = 0.0, timeout: float = 120.0) -> None:
        """Until the page's α reads at least `min_alpha`, the page alert is neither pending nor firing, and
        Prometheus has at least `min_history_s` seconds of data."""
        def ok() -> bool:
            if time.time() - self.started < min_history_s:
                return False
            a = self.alpha()
            return a is not None and a >= min_alpha and not self.page_states()

        self.wait(ok, timeout + min_history_s, f"{self.alpha_record} >= {min_alpha} with {PAGE_ALERT} inactive")

    def check_alive(self) -> None:
        for proc in (self.simulator, self.sidecar, self.prometheus, self.alertmanager):
            if not proc.alive():
                raise AssertionError(f"{proc.name} exited with {proc.popen.returncode}:\n{tail(proc.log)}")

    def diagnostics(self) -> str:
        lines = [f"webhook got {len(self.webhook.all())} notification(s):"]
        lines += [describe_notification(n) for n in self.webhook.all()]
        for proc in (self.simulator, self.sidecar, self.prometheus, self.alertmanager):
            lines.append(f"--- {proc.name} ({proc.url}) log tail:\n{tail(proc.log, 8)}")
        return "\n".join(lines)

    def urls(self) -> Mapping[str, str]:
        return {
            "fake vLLM": self.simulator.url + "/metrics",
            "sidecar": self.sidecar.url + "/",
            "Prometheus": self.prometheus.url + "/alerts",
            "Alertmanager": self.alertmanager.url + "/#/alerts",
            "webhook": self.webhook.url,
        }


def start_alertmanager(stack: contextlib.ExitStack, workdir: Path, binary: str, webhook_url: str) -> Process:
    """Alertmanager with the example routing, every receiver pointed at ``webhook_url``, on a free port."""
    config = workdir / "alertmanager.yml"
    config.write_text(yaml.safe_dump(alertmanager_config(webhook_url), sort_keys=False))
    (workdir / "alertmanager-data").mkdir(exist_ok=True)
    am = start_process("alertmanager", lambda port: [
        binary, f"--config.file={config}", f"--storage.path={workdir / 'alertmanager-data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
    ], workdir, "/-/ready")
    stack.callback(am.stop)
    return am


@contextlib.contextmanager
def running_chain(workdir: Path | None = None, echo_webhook: bool = False) -> Iterator[Chain]:
    """Start the whole chain; stop all of it on exit, whatever happened."""
    prometheus = prometheus_binary()
    alertmanager = alertmanager_binary()
    if prometheus is None or alertmanager is None:
        raise StartError("prometheus/prometheus-alertmanager not found: run scripts/install-tools.sh")
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="specdecode-e2e-")))
        workdir.mkdir(parents=True, exist_ok=True)
        webhook = Webhook(echo=echo_webhook)
        stack.callback(webhook.close)
        exporter = exporter_command()

        simulator = start_process("simulator", lambda port: [
            *exporter, "simulate", "--web.listen-address", f"127.0.0.1:{port}",
            "--acceptance-rate", str(HEALTHY_ALPHA), "--drafts-per-second", f"{DRAFTS_PER_SECOND:g}",
        ], workdir, "/health")
        stack.callback(simulator.stop)

        settings = rules_settings()
        windows = sorted({settings.short_window, settings.sidecar_alert_window, "5m"}, key=seconds)
        sidecar = start_process("sidecar", lambda port: [
            *exporter, "run", "--target", f"{simulator.url}/metrics",
            "--web.listen-address", f"127.0.0.1:{port}",
            "--collect.interval", fmt_duration(COLLECT_INTERVAL_S), "--collect.windows", ",".join(windows),
        ], workdir, "/readyz")
        stack.callback(sidecar.stop)

        am = start_alertmanager(stack, workdir, alertmanager, webhook.url)

        rules = workdir / "specdecode.e2e.rules.yaml"
        write_rules(rules)
        prom_config = workdir / "prometheus.yml"
        prom_config.write_text(yaml.safe_dump(
            prometheus_config(sidecar.url.removeprefix("http://"), am.url.removeprefix("http://"), rules),
            sort_keys=False))
        prom = start_process("prometheus", lambda port: [
            prometheus, f"--config.file={prom_config}", f"--storage.tsdb.path={workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ], workdir, "/-/ready")
        stack.callback(prom.stop)

        chain = Chain(workdir, webhook, settings, simulator, sidecar, prom, am)
        stack.callback(chain.client.close)
        yield chain


# ------------------------------------------------------------------------------------ interactive mode


def _progress(chain: Chain, t0: float, until: Callable[[], Any], timeout: float, every: float = 5.0) -> Any:
    """Poll `until()` (truthy ends it); print the page's α and the alert's state every `every` seconds."""
    deadline = time.monotonic() + timeout
    last = 0.0
    while time.monotonic() < deadline:
        chain.check_alive()
        done = until()
        if done:
            return done
        if time.monotonic() - last >= every:
            last = time.monotonic()
            alpha = chain.alpha()
            state = ",".join(sorted(chain.page_states())) or "inactive"
            shown = "n/a" if alpha is None else f"{alpha:.3f}"
            print(f"+{time.time() - t0:5.1f}s  {chain.alpha_record} = {shown}   {PAGE_ALERT}: {state}", flush=True)
        time.sleep(0.25)
    return None


def interactive(args: argparse.Namespace) -> int:
    """Start the chain, print where to look, run the scripted drop/recovery, print what the webhook gets."""
    try:
        with running_chain(Path(args.workdir) if args.workdir else None, echo_webhook=True) as chain:
            window_s = seconds(chain.page_window)
            print("The chain is up (all on 127.0.0.1):")
            for name, url in chain.urls().items():
                print(f"  {name:13} {url}")
            print(f"Rules: python -m specdecode_exporter.monitoring.build --profile {PROFILE} "
                  f"(page: {chain.alpha_record} < "
                  f"{chain.page_threshold:g} for {chain.page_for_s:g}s); routing: {AM_EXAMPLE.relative_to(ROOT)}; "
                  f"files and logs in {chain.workdir}", flush=True)
            if args.manual:
                print(f"Drive it yourself: curl -XPOST {chain.simulator.url}/-/phase -d '{{\"acceptance_rate\":0.35}}'"
                      f"  ...  -d '{{\"resume\":true}}'.  Ctrl-C stops everything.", flush=True)
                while True:
                    chain.check_alive()
                    time.sleep(1)
            print(f"Healthy traffic at α = {HEALTHY_ALPHA}; waiting {window_s:g}s for a full {chain.page_window} "
                  "window of it (open the URLs meanwhile).", flush=True)
            chain.wait_healthy(min_history_s=window_s)
            t_switch = time.time()
            print(f"+  0.0s  α of the fake vLLM: {HEALTHY_ALPHA} -> 0.35 (POST /-/phase)", flush=True)
            chain.phase(acceptance_rate=0.35)
            t_cross = _progress(chain, t_switch, lambda: (chain.alpha() or 1.0) < chain.page_threshold and time.time(),
                                window_s + 60)
            if t_cross:
                print(f"+{t_cross - t_switch:5.1f}s  {chain.alpha_record} < {chain.page_threshold:g}: {PAGE_ALERT} "
                      f"goes pending and fires if it stays below for {chain.page_for_s:g}s", flush=True)
            page = _progress(chain, t_switch, lambda: chain.webhook.find(
                receiver="/pager", alertname=PAGE_ALERT, status="firing"), chain.page_for_s + 60)
            if not page or not t_cross:
                print("no page within the expected time; see the logs in " + str(chain.workdir), file=sys.stderr)
                return 1
            received = page[0].received
            print(f"+{received - t_switch:5.1f}s  the page reached the pager webhook {received - t_cross:.1f}s after "
                  f"the windowed α crossed {chain.page_threshold:g}.", flush=True)
            t_resume = time.time()
            print(f"+{t_resume - t_switch:5.1f}s  α of the fake vLLM back to {HEALTHY_ALPHA} (POST /-/phase resume)",
                  flush=True)
            chain.phase(resume=True)
            resolved = _progress(chain, t_switch, lambda: chain.webhook.find(
                receiver="/pager", alertname=PAGE_ALERT, status="resolved"), window_s + 60)
            if resolved:
                print(f"+{resolved[0].received - t_switch:5.1f}s  resolved notification received "
                      f"({resolved[0].received - t_resume:.1f}s after α was set back).", flush=True)
            if args.keep:
                print("Still running (--keep); Ctrl-C stops everything.", flush=True)
                while True:
                    chain.check_alive()
                    time.sleep(1)
    except KeyboardInterrupt:
        print("\nstopped.")
    except (StartError, AssertionError) as exc:
        print(f"see-it-work: {exc}", file=sys.stderr)
        return 1
    print("Everything it started is stopped.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="see-it-work", description=interactive.__doc__)
    parser.add_argument("--manual", action="store_true", help="start the chain and wait; drive the simulator yourself")
    parser.add_argument("--keep", action="store_true", help="keep everything running after the scripted scenario")
    parser.add_argument("--workdir", help="keep configs, data and logs here (default: a temporary directory)")
    return interactive(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
