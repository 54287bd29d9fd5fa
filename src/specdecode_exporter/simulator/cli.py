"""`specdecode-exporter simulate`: serve a fake vLLM /metrics driven by a scenario."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

import uvicorn

from specdecode_exporter.core.config.flags import UsageError, convert
from specdecode_exporter.core.config.validation import ConfigError
from specdecode_exporter.simulator.app import build_app
from specdecode_exporter.simulator.model import ModelSpec
from specdecode_exporter.simulator.scenario import (
    FORMATS,
    SINGLE_ENGINE_FORMATS,
    SINGLE_MODEL_FORMATS,
    Scenario,
    default_scenario,
    load_scenario,
    steady_scenario,
)
from specdecode_exporter.simulator.server import bind_socket, url_for
from specdecode_exporter.simulator.simulator import Simulator

# flag -> help; every flag also reads SPECDECODE_<FLAG> (dots and dashes as underscores)
_FLAGS: dict[str, str] = {
    "--web.listen-address": "host:port to serve on (default 127.0.0.1:8000; ':8000' = all interfaces)",
    "--scenario": "scenario YAML file (default: the packaged 'demo' scenario)",
    "--format": f"exposition format: {', '.join(FORMATS)} (default: the scenario's, else v1)",
    "--model-name": "served model name (replaces the scenario's, which must then have one model)",
    "--engines": "data-parallel engines per model",
    "--num-speculative-tokens": "k, drafted tokens per step",
    "--acceptance-rate": "steady acceptance rate α (accepted/drafted); given: a steady scenario, no phases",
    "--drafts-per-second": "drafts per second per engine",
    "--time-scale": "simulated seconds per real second (default 1)",
    "--seed": "seed for the optional noise",
    "--spec-decode": "true, or false for a control pod: the same model with spec decode off (default true)",
    "--request-acceptance-histogram": "true: also serve vllm:request_spec_decode_acceptance_rate, the per-request "
                                      "α histogram proposed upstream (vllm#44487), one observation per API request "
                                      "(default false, as in released vLLM)",
    "--spec-decode-scheduled-steps": "true: also serve vllm:spec_decode_scheduled_steps, scheduler steps by the k a "
                                     "batch-size schedule chose (proposed upstream, vllm#54748) (default false, as "
                                     "in released vLLM)",
    "--per-request-spec-decode-metrics": "none or summary, as vLLM's flag: metrics.speculative_decoding in "
                                         "responses (default summary)",
    "--enable-per-request-metrics": "true or false, as vLLM's flag: timings in responses (default true)",
    "--pace": "true: stream at the simulated step time; false: as fast as possible (default true)",
}


def env_name(flag: str) -> str:
    # Its own prefix, so a sidecar's SPECDECODE_WEB_LISTEN_ADDRESS never moves a simulator beside it.
    return "SPECDECODE_SIMULATE_" + flag.lstrip("-").upper().replace(".", "_").replace("-", "_")


def dest_name(flag: str) -> str:
    return flag.lstrip("-").replace(".", "_").replace("-", "_")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, help_ in _FLAGS.items():
        env = env_name(flag)
        parser.add_argument(flag, dest=dest_name(flag), default=os.environ.get(env), metavar="VALUE",
                            help=f"{help_} [${env}]")


def _opt(args: argparse.Namespace, flag: str) -> str | None:
    value = getattr(args, dest_name(flag), None)
    return None if value is None or value == "" else str(value)


def parse_listen_address(raw: str) -> tuple[str, int]:
    host, sep, port_text = raw.rpartition(":")
    if not sep:
        raise UsageError(f"--web.listen-address: expected host:port, got {raw!r}")
    host = host.strip("[]") or "0.0.0.0"
    port = convert("--web.listen-address", port_text, int, "host:port with a port 0-65535",
                    lambda p: 0 <= p <= 65535)
    return host, port


def build_scenario(args: argparse.Namespace) -> Scenario:
    """Scenario from --scenario (or the packaged demo) with flag overrides, or a steady one."""
    def integer(flag: str, lo: int) -> int | None:
        raw = _opt(args, flag)
        return None if raw is None else convert(flag, raw, int, f"an integer >= {lo}", lambda v: v >= lo)

    def number(flag: str, lo: float, hi: float) -> float | None:
        raw = _opt(args, flag)
        return None if raw is None else convert(
            flag, raw, float, f"a number between {lo:g} and {hi:g}", lambda v: math.isfinite(v) and lo <= v <= hi)

    fmt = _opt(args, "--format")
    if fmt is not None and fmt not in FORMATS:
        raise UsageError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    alpha = number("--acceptance-rate", 0.0, 1.0)
    seed = integer("--seed", 0)
    changes: dict[str, object] = {}
    spec_decode = _boolean(args, "--spec-decode", True)
    if not spec_decode:
        changes["spec_decode"] = False
    if _boolean(args, "--request-acceptance-histogram", False):
        changes["request_acceptance_histogram"] = True
    if _boolean(args, "--spec-decode-scheduled-steps", False):
        changes["spec_decode_scheduled_steps"] = True
    for key, value in (
        ("engines", integer("--engines", 1)),
        ("num_speculative_tokens", integer("--num-speculative-tokens", 1)),
        ("drafts_per_second", number("--drafts-per-second", 0.0, 1e7)),
        ("name", _opt(args, "--model-name")),
    ):
        if value is not None:
            changes[key] = value
    scenario_file = _opt(args, "--scenario")
    if alpha is not None:
        if scenario_file is not None:
            raise UsageError("--acceptance-rate: builds a steady scenario; do not combine it with --scenario")
        scenario = steady_scenario(ModelSpec(acceptance_rate=alpha))
    else:
        scenario = load_scenario(scenario_file) if scenario_file else default_scenario("demo")
    if "name" in changes and len(scenario.models) != 1:
        raise UsageError("--model-name: the scenario has several models; name them in the scenario file")
    if "num_speculative_tokens" in changes and any(m.position_acceptance for m in scenario.models):
        raise UsageError("--num-speculative-tokens: the scenario sets position_acceptance for a fixed k")
    models = tuple(dataclasses.replace(m, **changes) for m in scenario.models)  # type: ignore[arg-type]
    scenario = dataclasses.replace(scenario, models=models, format=fmt or scenario.format,
                                   seed=scenario.seed if seed is None else seed)
    if scenario.format in SINGLE_ENGINE_FORMATS and any(m.engines != 1 for m in models):
        raise UsageError(f"--engines: format {scenario.format} has no engine label; expected 1")
    if scenario.format in SINGLE_MODEL_FORMATS and len(models) != 1:
        raise UsageError(f"--format: {scenario.format} names no model; the scenario must have one model")
    return scenario


def _boolean(args: argparse.Namespace, flag: str, default: bool) -> bool:
    raw = _opt(args, flag)
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        raise UsageError(f"{flag}: expected true or false, got {raw!r}")
    return raw.lower() == "true"


def server_options(args: argparse.Namespace) -> tuple[str, bool, bool]:
    """What vLLM itself would be started with for the API's per-request metrics, and the stream pacing."""
    level = _opt(args, "--per-request-spec-decode-metrics") or "summary"
    if level not in ("none", "summary"):
        raise UsageError(f"--per-request-spec-decode-metrics: expected none or summary, got {level!r}")
    return level, _boolean(args, "--enable-per-request-metrics", True), _boolean(args, "--pace", True)


def main(args: argparse.Namespace) -> int:
    try:
        host, port = parse_listen_address(_opt(args, "--web.listen-address") or "127.0.0.1:8000")
        scenario = build_scenario(args)
        raw_scale = _opt(args, "--time-scale")
        scale = 1.0 if raw_scale is None else convert(
            "--time-scale", raw_scale, float, "a positive number", lambda v: math.isfinite(v) and v > 0)
        level, timings, pace = server_options(args)
        sim = Simulator(scenario, time_scale=scale, per_request_metrics=level, request_timings=timings, pace=pace)
    except (UsageError, ConfigError) as exc:
        print(f"specdecode-exporter simulate: error: {exc}", file=sys.stderr)
        return 2
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        print(f"specdecode-exporter simulate: error: --web.listen-address {host}:{port}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    model_list = ", ".join(f"{m.name} (k={m.num_speculative_tokens}, engines={m.engines})" for m in scenario.models)
    print(f"specdecode-exporter simulate: fake vLLM ({scenario.format}, scenario {scenario.name}, "
          f"time scale {scale:g}) serving {model_list} on {url_for(sock)}/metrics", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(build_app(sim), log_level="warning", access_log=False,
                                           lifespan="off", timeout_graceful_shutdown=1))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return 0


if __name__ == "__main__":  # python -m specdecode_exporter.simulator.cli
    _parser = argparse.ArgumentParser(prog="specdecode-exporter simulate", description=__doc__, allow_abbrev=False)
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
