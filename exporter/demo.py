"""`specdecode-exporter demo`: the simulator and the sidecar wired together on loopback."""

from __future__ import annotations

import logging
import threading

from exporter.collection import Exporter
from exporter.config import Config, TargetConfig, parse_windows, split_listen_address
from exporter.httpserver import ThreadedServer, bind_socket
from exporter.log import event
from exporter.simulator import Simulator, default_scenario, load_scenario
from exporter.simulator.server import serve_in_thread
from exporter.web import build_app

DEMO_INTERVAL_SECONDS = 2.0


def run_demo(listen_address: str, duration: float | None, scenario_file: str | None) -> int:
    scenario = load_scenario(scenario_file) if scenario_file else default_scenario()
    simulator, simulator_url = serve_in_thread(Simulator(scenario))
    config = Config(
        targets=(TargetConfig(name="simulated-vllm", url=f"{simulator_url}/metrics", method="eagle3"),),
        windows=parse_windows("1m,5m,15m,1h", "windows"),
        collect_interval=DEMO_INTERVAL_SECONDS,
        listen_address=listen_address,
    )
    host, port = split_listen_address(listen_address)
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        simulator.stop()
        event(logging.ERROR, "cannot listen", listen_address=listen_address, detail=exc.strerror or str(exc))
        return 1
    sidecar = ThreadedServer(build_app(Exporter(config)), sock, name="sidecar").start()
    print(f"""
specdecode-exporter demo is running (Ctrl-C to stop).
  simulated vLLM   {simulator_url}/metrics   (scenario: healthy → degraded → restart → recovered, looping)
  status page      {sidecar.base_url}/
  metrics          {sidecar.base_url}/metrics
  status (JSON)    {sidecar.base_url}/api/v1/status
Watch α drop below 0.5 in the 'degraded' phase:
  curl -s {sidecar.base_url}/metrics | grep 'specdecode_acceptance_ratio{{'
""", flush=True)
    stop = threading.Event()
    try:
        stop.wait(duration)
    except KeyboardInterrupt:
        pass
    finally:
        sidecar.stop()
        simulator.stop()
    return 0
