"""specdecode-exporter: run (the sidecar), simulate (a fake vLLM), demo (both), check URL (one-shot verdict),
probe (measure α and the speedup before you ship).

Flags follow Prometheus exporters; each flag can also come from SPECDECODE_<FLAG> (dots and dashes become
underscores, upper case), e.g. SPECDECODE_WEB_LISTEN_ADDRESS. Precedence: flag > env > config file > default.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from specdecode_exporter.core.log import setup_logging
from specdecode_exporter.core.validation import ConfigError, Duration, Size, parse_duration, validate
from specdecode_exporter.sidecar.config import (
    DEFAULT_TARGET_URL,
    DEFAULT_WINDOWS,
    LOG_FORMATS,
    LOG_LEVELS,
    Config,
    FilePath,
    ListenAddress,
    LogFormat,
    LogLevel,
    UrlPath,
    Windows,
    check_config,
    config_from_mapping,
    load_config_file,
    targets_from_flags,
)

PROG = "specdecode-exporter"


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (and where to get help) and exits with code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def env_name(flag: str) -> str:
    return "SPECDECODE_" + flag.lstrip("-").replace(".", "_").replace("-", "_").upper()


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


def unknown_flags(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """The message for arguments a (sub)command does not take, the closest of its flags named."""
    flags = [name for action in parser._actions for name in action.option_strings if name.startswith("--")]
    first = next((extra.split("=", 1)[0] for extra in extras if extra.startswith("-")), "")
    return f"unrecognized arguments: {' '.join(extras)}{did_you_mean(first, flags) if first else ''}"


# The project's other tools share the prefix: simulate's flags (SPECDECODE_SIMULATE_*) and the variables the test,
# bench and real-engine harnesses read (tests/vllm, tests/llamacpp, the soak, fuzz and e2e reports). `run` leaves
# them alone; any other SPECDECODE_* variable it does not know stops the start.
OTHER_TOOLS_PREFIXES = tuple(f"SPECDECODE_{name}_" for name in (
    "SIMULATE", "VLLM", "LLAMA", "GGUF", "SOAK", "FUZZ", "ATHERIS", "E2E", "REQUIRE", "WRITE", "TORCH"))


def check_environment(run: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Every SPECDECODE_* variable is one of `run`'s (or another tool's): a misspelt one is an error, not ignored."""
    known = sorted({env_name(name) for action in run._actions for name in action.option_strings
                    if name.startswith("--") and name != "--help"})
    for variable in sorted(environ):
        if variable.startswith("SPECDECODE_") and variable not in known and not variable.startswith(
                OTHER_TOOLS_PREFIXES):
            raise ConfigError(f"{variable}: not a variable of {PROG} run{did_you_mean(variable, known)} "
                              f"(see {PROG} run --help)")


@dataclass(frozen=True)
class Flag:
    """A flag of `run` that sets one Config field; its value is checked as the config file's key is (``kind``)."""

    flag: str
    field: str  # Config field it sets
    kind: Any  # the annotated type of the config file's key
    help: str
    default_text: str


def _listen(value: str) -> str:
    address: str = validate(ListenAddress, value, "--web.listen-address")
    return address


RUN_FLAGS: tuple[Flag, ...] = (
    Flag("--web.listen-address", "listen_address", ListenAddress, "address to serve on", ":9877"),
    Flag("--web.telemetry-path", "telemetry_path", UrlPath, "path under which to expose metrics", "/metrics"),
    Flag("--web.config.file", "web_config_file", FilePath,
         "exporter-toolkit web config: TLS and basic auth for the sidecar's endpoints", "none"),
    Flag("--collect.interval", "collect_interval", Duration, "how often to collect vLLM's metrics", "5s"),
    Flag("--collect.max-body-size", "max_body_bytes", Size, "largest exposition accepted (decoded)", "16MiB"),
    Flag("--collect.stale-after", "stale_after", Duration, "drop a label set not seen for this long", "10m"),
    Flag("--collect.windows", "windows", Windows, "comma-separated windows for the windowed gauges", DEFAULT_WINDOWS),
    Flag("--log.level", "log_level", LogLevel, f"one of {', '.join(LOG_LEVELS)}", "info"),
    Flag("--log.format", "log_format", LogFormat, f"one of {', '.join(LOG_FORMATS)}", "logfmt"),
)


# --proxy.route.*: routing (proxy.route), each the config key of the same name; off without a fallback upstream.
ROUTE_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("--proxy.route.fallback-upstream", "URL",
     "turn routing on: a pool of the same model without speculative decoding, http://host:port, where the tap sends "
     "the classes of requests speculative decoding slows down (default off)"),
    ("--proxy.route.mode", "MODE", "observe (decide and count only) or enforce (send routed classes to the fallback) "
                                   "(default observe)"),
    ("--proxy.route.min-requests", "N", "requests of a class (with spec-decode metrics) per decision (default 50)"),
    ("--proxy.route.canary-share", "SHARE", "share of a routed class kept on speculative decoding, which measures "
                                            "its speedup and brings it back (default 0.05)"),
    ("--proxy.route.prompt-length-bands", "TOKENS", "comma-separated prompt lengths in tokens, e.g. 1024,4096: the "
                                                    "prompt-length band becomes part of a class (default none)"),
)


def _scalar(text: str) -> int | float | str:
    """A flag's text as the YAML key's value would be: a number where it reads as one."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def _route_flags(args: argparse.Namespace) -> dict[str, Any]:
    """--proxy.route.* (or their env variables) as route.<key>: value, for the proxy section."""
    out: dict[str, Any] = {}
    for flag, _, _ in ROUTE_FLAGS:
        value = _from_env(args, _dest(flag), flag)
        if value is not None:
            key = flag.removeprefix("--proxy.route.").replace("-", "_")
            out[f"route.{key}"] = _scalar(value) if key in ("min_requests", "canary_share") else value
    return out


def _switch(value: bool | str | None) -> bool | str | None:
    """A switch flag (True) or its env variable's text as the YAML key's value would be; other text is left for the
    config validator to refuse."""
    if isinstance(value, str):
        return {"true": True, "false": False}.get(value.strip().lower(), value)
    return value


def _from_env(args: argparse.Namespace, dest: str, flag: str) -> Any:
    return _given(args, dest, flag)[0]


def _given(args: argparse.Namespace, dest: str, flag: str) -> tuple[Any, str]:
    """A flag's value and what gave it: the flag, else its environment variable (named in an error about it)."""
    value = getattr(args, dest, None)
    if value is not None:
        return value, flag
    return os.environ.get(env_name(flag)), env_name(flag)


def _proxy_sources(args: argparse.Namespace) -> dict[str, str]:
    """proxy.<key> → the flag or variable that set it, for the errors the config validation raises about it."""
    flags = ["--proxy.listen-address", "--proxy.upstream", "--proxy.class-histograms", *(f for f, _, _ in ROUTE_FLAGS)]
    sources = {}
    for flag in flags:
        value, source = _given(args, _dest(flag), flag)
        if value is not None:
            sources["proxy." + flag.removeprefix("--proxy.").replace("-", "_")] = source
    return sources


def _named(exc: ConfigError, sources: Mapping[str, str]) -> ConfigError:
    """The error with the config key it names replaced by the flag or variable that gave the value (and without
    the config file's path before it: the value did not come from the file)."""
    message = str(exc)
    for key, source in sources.items():
        if message.startswith(key + ":"):
            return ConfigError(source + message[len(key):])
        at = message.find(f": {key}:")  # after the file's path
        if at >= 0:
            return ConfigError(source + message[at + 2 + len(key):])
    return exc


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace(".", "_").replace("-", "_")


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config.file", dest="config_file", metavar="FILE",
                        help=f"YAML configuration (env {env_name('--config.file')})")
    parser.add_argument("--monitoring.config-file", dest="monitoring_config_file", metavar="FILE",
                        help="the monitoring config the verdict reads (thresholds, bands), merged onto the shipped "
                             f"one; the same file the rules and dashboard are built from "
                             f"(env {env_name('--monitoring.config-file')})")
    parser.add_argument("--target", action="append", metavar="[NAME=]URL",
                        help=f"vLLM /metrics URL; repeatable (default {DEFAULT_TARGET_URL}; env SPECDECODE_TARGET, "
                             "comma-separated)")
    parser.add_argument("--collect.timeout", dest="collect_timeout", metavar="DURATION",
                        help="timeout of one collection, for --target targets (default 3s)")
    parser.add_argument("--proxy.listen-address", dest="proxy_listen_address", metavar="ADDRESS",
                        help="turn the request tap on: also forward vLLM's OpenAI API here and record each "
                             f"response's per-request metrics (default off; env {env_name('--proxy.listen-address')})")
    parser.add_argument("--proxy.upstream", dest="proxy_upstream", metavar="URL",
                        help="where the tap forwards to, http://host:port (default: the target's scheme, host and "
                             f"port; env {env_name('--proxy.upstream')})")
    parser.add_argument("--proxy.class-histograms", dest="proxy_class_histograms", action="store_const", const=True,
                        help="export the tap's per-request histograms by workload and temperature band too, not only "
                             "per model (costs series; see the README's series per pod; default off; env "
                             f"{env_name('--proxy.class-histograms')}=true)")
    for name, metavar, text in ROUTE_FLAGS:
        parser.add_argument(name, dest=_dest(name), metavar=metavar, help=f"{text}; env {env_name(name)}")
    for flag in RUN_FLAGS:
        parser.add_argument(flag.flag, dest=_dest(flag.flag), metavar="VALUE",
                            help=f"{flag.help} (default {flag.default_text}; env {env_name(flag.flag)})")


def config_from_args(args: argparse.Namespace) -> Config:
    """Flags > env > config file > defaults."""
    config_file = _from_env(args, "config_file", "--config.file")
    monitoring_file = _from_env(args, "monitoring_config_file", "--monitoring.config-file")
    timeout_text, timeout_source = _given(args, "collect_timeout", "--collect.timeout")
    timeout = parse_duration(timeout_text, timeout_source) if timeout_text else 3.0
    urls = args.target or [u for u in (os.environ.get("SPECDECODE_TARGET") or "").split(",") if u]
    try:
        flagged_targets = targets_from_flags(urls, timeout) if urls else None
    except ConfigError as exc:
        raise exc if args.target else _named(exc, {"--target": "SPECDECODE_TARGET"}) from None
    proxy_flags = {"listen_address": _from_env(args, "proxy_listen_address", "--proxy.listen-address"),
                   "upstream": _from_env(args, "proxy_upstream", "--proxy.upstream"),
                   "class_histograms": _switch(_from_env(args, "proxy_class_histograms", "--proxy.class-histograms")),
                   **_route_flags(args)}
    try:
        config = (load_config_file(config_file, monitoring_file, flagged_targets, proxy_flags) if config_file
                  else config_from_mapping({}, "defaults", monitoring_file,
                                           flagged_targets or targets_from_flags([DEFAULT_TARGET_URL], timeout),
                                           proxy_flags))
    except ConfigError as exc:
        raise _named(exc, _proxy_sources(args)) from None
    overrides: dict[str, Any] = {}
    for flag in RUN_FLAGS:
        value, source = _given(args, _dest(flag.flag), flag.flag)
        if value is not None:
            overrides[flag.field] = validate(flag.kind, value, source)
    return check_config(replace(config, **overrides))


def cmd_run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    from specdecode_exporter.sidecar.webconfig import WebSecurity, load_web_config

    security = WebSecurity(load_web_config(config.web_config_file)) if config.web_config_file else None
    setup_logging(config.log_level, config.log_format)
    from specdecode_exporter.sidecar.web import serve

    return serve(config, load=lambda: config_from_args(args), security=security)


def cmd_check(args: argparse.Namespace) -> int:
    from specdecode_exporter.check.command import run_check

    duration = parse_duration(args.duration, "--duration")
    timeout = parse_duration(args.timeout, "--timeout")
    # A failed collection is check's one-line answer on stderr, not a log line beside it; a bug still logs.
    setup_logging("error", "logfmt")
    return run_check(args.url, duration, timeout, sys.stdout, sys.stderr,
                     send_test_completion=args.send_test_completion,
                     adaptive_verification=args.adaptive_verification)


def cmd_demo(args: argparse.Namespace) -> int:
    from specdecode_exporter.demo import run_demo

    setup_logging("info", "logfmt")
    duration = parse_duration(args.duration, "--duration") if args.duration else None
    return run_demo(_listen(args.web_listen_address), duration, args.scenario)


@dataclass(frozen=True)
class Tool:
    """A subcommand whose flags live in its own package (``module`` has add_arguments(parser) and main(args));
    the package is imported only when the subcommand runs, so `run` never loads a tool."""

    name: str
    help: str
    module: str


TOOLS: tuple[Tool, ...] = (
    Tool("simulate", "serve a fake vLLM /metrics (for demos and tests)", "specdecode_exporter.simulator.cli"),
    Tool("probe", "measure α, TPOT and the speedup per temperature and prompt group", "specdecode_exporter.probe.cli"),
)


def _command_of(argv: Sequence[str] | None) -> str | None:
    """The subcommand an argument list names: its first argument that is not an option."""
    args = sys.argv[1:] if argv is None else argv
    return next((arg for arg in args if not arg.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv`` (default: the command line): a tool's flags are added only when it is the command."""
    parser = OneLineArgumentParser(prog=PROG, description="Is vLLM's speculative decoding paying off?")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineArgumentParser,
                                     required=True)

    run = commands.add_parser("run", help="run the sidecar (collect vLLM, serve /metrics)")
    add_run_flags(run)
    run.set_defaults(handler=cmd_run)

    check = commands.add_parser("check", help="collect a vLLM /metrics URL twice and print a verdict")
    check.add_argument("url", help="e.g. http://127.0.0.1:8000/metrics")
    check.add_argument("--duration", default="10s", help="time between first and last collection (default 10s)")
    check.add_argument("--timeout", default="5s", help="timeout of one collection (default 5s)")
    check.add_argument("--send-test-completion", action="store_true",
                       help="also send vLLM one 1-token completion (to the served model) to tell whether its responses "
                            "carry the per-request metrics the request tap reads (vLLM's --per-request-spec-decode-"
                            "metrics summary, --enable-per-request-metrics); exit code 1 if the answer cannot tell. "
                            "Without it, check sends nothing and only names those flags")
    check.add_argument("--adaptive-verification", action="store_true",
                       help="vLLM runs with enable_adaptive_verification (it does not export that): withhold α and "
                            "what builds on it, as the sidecar's target key adaptive_verification does, rather than "
                            "guess whether its drafted-token counter counts proposed or verified tokens")
    check.set_defaults(handler=cmd_check)

    demo = commands.add_parser("demo", help="run the simulator and the sidecar together")
    demo.add_argument("--web.listen-address", dest="web_listen_address", default="127.0.0.1:9877",
                      help="sidecar address (default 127.0.0.1:9877)")
    demo.add_argument("--scenario", help="simulator scenario file (default: the packaged demo scenario)")
    demo.add_argument("--duration", help="stop after this long (default: run until Ctrl-C)")
    demo.set_defaults(handler=cmd_demo)

    chosen = _command_of(argv)
    for tool in TOOLS:
        sub = commands.add_parser(tool.name, help=tool.help)
        if tool.name == chosen:
            module = importlib.import_module(tool.module)
            module.add_arguments(sub)
            sub.set_defaults(handler=module.main)
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


def _version() -> str:
    from specdecode_exporter.sidecar.expose import exporter_version

    return exporter_version()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(argv)
    args, extras = parser.parse_known_args(argv)
    if extras:  # reported by the command's own parser: its flags, its --help (the top level lists none of them)
        command = _subcommands(parser)[args.command]
        command.error(unknown_flags(command, extras))
    try:
        if args.command == "run":
            check_environment(_subcommands(parser)["run"], os.environ)
        return int(args.handler(args) or 0)
    except ConfigError as exc:
        sys.stderr.write(f"{PROG}: config error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
