"""`specdecode-exporter demo`: everything the sidecar does, on loopback, with no vLLM.

Two simulated vLLM pods of the same model: one with speculative decoding (the packaged demo scenario: healthy →
degraded → restart → recovered → busy, looping; in busy vLLM's dynamic speculative decoding drafts 2 of its 3 tokens)
and a control pod with it off, the first's baseline. The sidecar collects both and runs the request tap in front of
the first, and a small client sends it traffic through the tap: two workloads at three temperatures, streamed and
not, so the per-request figures fill in too. The tap routes (enforce mode): a class whose α it shows below the
break-even goes to the control pod, its canary measuring the speedup.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading

import httpx

from specdecode_exporter.core.net.httpserver import ThreadedServer, bind_socket
from specdecode_exporter.core.process.log import event
from specdecode_exporter.core.process.signals import stop_on_signals
from specdecode_exporter.sidecar.collection import Exporter
from specdecode_exporter.sidecar.config import (
    BaselineConfig,
    CollectSection,
    Config,
    TargetConfig,
    WebSection,
    parse_windows,
    split_listen_address,
)
from specdecode_exporter.sidecar.proxy import TapRuntime, tap_runtime
from specdecode_exporter.sidecar.reload import Reloader
from specdecode_exporter.sidecar.web import build_app
from specdecode_exporter.simulator import (
    ModelSpec,
    Scenario,
    Simulator,
    default_scenario,
    load_scenario,
    steady_scenario,
)
from specdecode_exporter.simulator.server import serve_in_thread
from specdecode_exporter.tap.settings import ENFORCE, RouteSettings, TapSettings

DEMO_INTERVAL_SECONDS = 2.0
DEMO_VERDICT_WINDOW = "1m"
TRAFFIC_EVERY_SECONDS = 0.25
# (workload header, temperature): both workloads at 0, 0.5 and 1, so each fills the three temperature bands of
# the default edges (0-0.3, 0.3-0.7, 0.7+); the simulator accepts less the hotter a request is sampled
WORKLOADS = ("chat", "code")
TEMPERATURES = (0.0, 0.5, 1.0)
TRAFFIC = tuple(itertools.product(WORKLOADS, TEMPERATURES))


def demo_config(listen_address: str, spec_url: str, control_url: str) -> Config:
    spec = TargetConfig(name="simulated-vllm", url=f"{spec_url}/metrics", method="eagle3",
                        baseline=BaselineConfig(target="control"))
    control = TargetConfig(name="control", url=f"{control_url}/metrics", spec_decode=False)
    return Config(
        targets=(spec, control),
        windows=parse_windows("1m,5m,15m,1h", "windows"),
        collect=CollectSection(interval=DEMO_INTERVAL_SECONDS),
        # The verdict over 1m (5m by default): the degraded phase turns it to "hurting" within about half a minute,
        # until the acceptance gate stops speculation; over 5m its 150 s are diluted by the healthy phase before.
        verdict_window=DEMO_VERDICT_WINDOW,
        web=WebSection(listen_address=listen_address),
        tap=TapSettings(listen_address="127.0.0.1:0", upstream=spec_url, target=spec.name, drain_timeout=1.0,
                        route=RouteSettings(control_url, mode=ENFORCE, min_requests=20, canary_share=0.2)),
    )


def traffic(i: int) -> tuple[str, float, bool]:
    """The i-th request the demo sends: (workload, temperature, streamed)."""
    workload, temperature = TRAFFIC[i % len(TRAFFIC)]
    return workload, temperature, (i + i // len(TRAFFIC)) % 2 == 0


def send_traffic(tap_url: str, model: str, stop: threading.Event) -> None:
    """What clients of the tap would send: a request every TRAFFIC_EVERY_SECONDS, each workload and temperature
    in turn, streamed and not in alternate rounds, errors ignored."""
    with httpx.Client(base_url=tap_url, timeout=30, trust_env=False) as client:
        for i in itertools.count():
            if stop.wait(TRAFFIC_EVERY_SECONDS):
                return
            workload, temperature, stream = traffic(i)
            body = {"model": model, "prompt": "Write a haiku about GPUs.", "max_tokens": 48,
                    "temperature": temperature, "stream": stream}
            with contextlib.suppress(httpx.HTTPError):
                client.post("/v1/completions", json=body, headers={"x-workload": workload})


def run_demo(listen_address: str, duration: float | None, scenario_file: str | None) -> int:
    """Until ``duration`` is over, Ctrl-C or SIGTERM: all three a clean stop (exit 0), as for the sidecar."""
    scenario = load_scenario(scenario_file) if scenario_file else default_scenario()
    with stop_on_signals():
        return _run_demo(listen_address, duration, scenario)


def _run_demo(listen_address: str, duration: float | None, scenario: Scenario) -> int:
    model = scenario.models[0]
    started: list[ThreadedServer] = []
    stop = threading.Event()
    try:
        spec, spec_url = serve_in_thread(Simulator(scenario))
        started.append(spec)
        control_spec = ModelSpec(name=model.name, spec_decode=False, drafts_per_second=model.drafts_per_second)
        control, control_url = serve_in_thread(Simulator(steady_scenario(control_spec)))
        started.append(control)
        config = demo_config(listen_address, spec_url, control_url)
        sidecar, tap = _start_sidecar(config)
        started.append(sidecar)
        tap_url = f"http://127.0.0.1:{tap.sock.getsockname()[1]}"
        threading.Thread(target=send_traffic, args=(tap_url, model.name, stop), name="demo-traffic",
                         daemon=True).start()
        _print_urls(sidecar.base_url, spec_url, control_url, tap_url, phase_starts(scenario))
        stop.wait(duration)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (stop_on_signals), also while starting
        pass
    except OSError as exc:
        event(logging.ERROR, "cannot listen", listen_address=listen_address, detail=exc.strerror or str(exc),
              change_with="--web.listen-address (make demo: DEMO_PORT=...)")
        return 1
    finally:
        stop.set()
        for server in reversed(started):
            server.stop()
    return 0


def _start_sidecar(config: Config) -> tuple[ThreadedServer, TapRuntime]:
    host, port = split_listen_address(config.web.listen_address)
    exporter = Exporter(config)
    tap = tap_runtime(config, exporter.views, lambda: exporter.config)
    assert tap is not None, "the demo config has a tap"
    sock = bind_socket(host, port)
    # POST /-/reload works as under `run`: the demo's configuration is built in, so a reload re-applies it.
    reloader = Reloader(exporter, lambda: config)
    return ThreadedServer(build_app(exporter, reloader=reloader, tap=tap), sock, name="sidecar").start(), tap


def phase_starts(scenario: Scenario) -> str:
    """The scenario's phases with when each starts: 'healthy 0 s → degraded 90 s → …', and when it loops."""
    starts = itertools.accumulate((phase.duration for phase in scenario.phases), initial=0.0)
    timeline = " → ".join(f"{phase.name} {start:.0f} s" for phase, start in zip(scenario.phases, starts, strict=False))
    total = sum(phase.duration for phase in scenario.phases)
    return f"{timeline}, then again from {total:.0f} s" if scenario.loop and scenario.phases else timeline


def _print_urls(sidecar: str, spec: str, control: str, tap: str, phases: str) -> None:
    print(f"""
specdecode-exporter demo is running (Ctrl-C to stop).
  status page      {sidecar}/      (α, observed speedup against the control pod, the verdict, routing, charts)
  metrics          {sidecar}/metrics
  status (JSON)    {sidecar}/api/v1/status
  simulated vLLM   {spec}/metrics   (spec decode on)
  control pod      {control}/metrics   (the same model, spec decode off: the baseline and the routing fallback)
  request tap      {tap}/v1/completions   (the demo sends traffic through it)
Phases of the simulated vLLM: {phases}.
Routing is on: once 20 requests of a class (workload × temperature band) show α below the break-even, the tap sends
it to the control pod but for a fifth (the canary); the hot classes (0.7+) go first, about 30 s in, and their counts
on the speculative pod grow by the canary only from then on (Routing on the status page, specdecode_route_*).
In 'degraded' α falls below 0.5 (1m) and the verdict (over 1m here) turns to 'hurting'; about a minute into it an
acceptance gate stops speculation: the page says 'stopped' and the verdict 'not speculating' until the restart. In
'busy' vLLM drafts 2 tokens instead of 3: the mean draft length falls to 2. Every step, when and where: docs/demo.md.
  curl -s {sidecar}/metrics | grep -E 'specdecode_(acceptance_ratio|observed_speedup|speculative_token_share)\\{{'
  curl -s {sidecar}/metrics | grep -E 'specdecode_(verdict|route_class_state|mean_draft_length)\\{{'
Ctrl-C stops it (a backgrounded `make demo &`: `kill %1`).
""", flush=True)
