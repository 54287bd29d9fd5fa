"""specdecode-exporter: run (the sidecar), simulate (a fake vLLM), demo (both), check URL (one-shot verdict),
probe (measure α and the speedup before you ship).

Flags follow Prometheus exporters; each flag can also come from SPECDECODE_<FLAG> (dots and dashes become
underscores, upper case), e.g. SPECDECODE_WEB_LISTEN_ADDRESS. Precedence: flag > env > config file > default.
`run`'s flags are the settings of the config tree that have one (sidecar/config.py declares each, beside what it
configures; the tap's in tap/settings.py); they and their variables are merged into the config file's mapping by
dotted key before the one validation. The tap's flags were --proxy.*: those still work, hidden from --help, with a
warning (sidecar/config.py's RENAMED).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from specdecode_exporter.core.config.kinds import ListenAddress
from specdecode_exporter.core.config.settings import Setting, env_name
from specdecode_exporter.core.config.validation import ConfigError, SourcedError, parse_duration, validate
from specdecode_exporter.core.process.log import setup_logging
from specdecode_exporter.sidecar.config import (
    CONFIG_FILE_FLAG,
    CONTROL_TARGET_FLAG,
    DEFAULT_TARGET_NAME,
    DEFAULT_TARGET_URL,
    DEPRECATED,
    SETTINGS,
    TARGET_FLAG,
    Config,
    OuterFlag,
    config_from_mapping,
    load_config_file,
    target_entries,
    warn_deprecated,
    with_control,
)

PROG = "specdecode-exporter"


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (and where to get help) and exits with code 2. A flag is taken
    only as written: an abbreviation (``--web.listen`` for ``--web.listen-address``, ``--temperature`` for
    ``--temperatures``) is an unknown flag, so a flag added later can never change what an old command line means."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.subcommands: dict[str, OneLineArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)

    def flag_names(self) -> list[str]:
        """Every long flag this parser takes."""
        return [name for action in self._actions for name in action.option_strings if name.startswith("--")]


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


def closest_flag(word: str, flags: Sequence[str]) -> str:
    """The flag an abbreviation stands for (the one flag it begins), else the closest spelling."""
    extensions = [flag for flag in flags if flag.startswith(word)]
    return f"; did you mean {extensions[0]}?" if len(extensions) == 1 else did_you_mean(word, flags)


def unknown_flags(parser: OneLineArgumentParser, extras: Sequence[str]) -> str:
    """The message for arguments a (sub)command does not take. A misspelt flag names itself and the closest flag;
    the argument after it (its value, which argparse may have taken for a positional one) is not blamed."""
    flags = [extra.split("=", 1)[0] for extra in extras if extra.startswith("-")]
    if not flags:
        return f"unrecognized arguments: {' '.join(extras)}"
    hints = [f"{flag}{closest_flag(flag, parser.flag_names())}" for flag in flags]
    return f"unknown flag{'s' if len(flags) > 1 else ''} {', '.join(hints)}"


# The project's other tools share the prefix: simulate's flags (SPECDECODE_SIMULATE_*) and the variables the test,
# bench and real-engine harnesses read (tests/vllm, tests/llamacpp, the soak, fuzz and e2e reports). `run` leaves
# them alone; any other SPECDECODE_* variable it does not know stops the start.
OTHER_TOOLS_PREFIXES = tuple(f"SPECDECODE_{name}_" for name in (
    "SIMULATE", "VLLM", "LLAMA", "GGUF", "SOAK", "FUZZ", "ATHERIS", "E2E", "REQUIRE", "WRITE", "TORCH"))


def check_environment(run: OneLineArgumentParser, environ: Mapping[str, str]) -> None:
    """Every SPECDECODE_* variable is one of `run`'s (or another tool's): a misspelt one is an error, not ignored."""
    known = sorted({env_name(name) for name in run.flag_names() if name != "--help"})
    for variable in sorted(environ):
        if variable.startswith("SPECDECODE_") and variable not in known and not variable.startswith(
                OTHER_TOOLS_PREFIXES):
            raise ConfigError(f"{variable}: not a variable of {PROG} run{did_you_mean(variable, known)} "
                              f"(see {PROG} run --help)")


# run's flags: one per setting of the tree that has one (sidecar/config.py declares each beside what it configures).
RUN_FLAGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.flag)
DEPRECATED_FLAGS: tuple[Setting, ...] = tuple(s for s in DEPRECATED if s.flag)  # --proxy.*: hidden from --help


def _listen(value: str) -> str:
    address: str = validate(ListenAddress, value, "--web.listen-address")
    return address


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace(".", "_").replace("-", "_")


def flag_help(setting: Setting) -> str:
    """A setting's line in `run --help`: its help, its default and its variable."""
    env = f"{setting.env}=true" if setting.switch else setting.env
    return f"{setting.help} (default {setting.shown}; env {env})"


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    # Not settings of the tree: the file the tree is read from, and the targets (a list; each flag one entry).
    parser.add_argument(CONFIG_FILE_FLAG.flag, dest="config_file", metavar="FILE", help=CONFIG_FILE_FLAG.flag_help)
    parser.add_argument(TARGET_FLAG.flag, action="append", metavar=TARGET_FLAG.type_name, help=TARGET_FLAG.flag_help)
    parser.add_argument(CONTROL_TARGET_FLAG.flag, dest="control_target", action="append",
                        metavar=CONTROL_TARGET_FLAG.type_name, help=CONTROL_TARGET_FLAG.flag_help)
    for setting in (*RUN_FLAGS, *DEPRECATED_FLAGS):
        assert setting.flag is not None
        shown = flag_help(setting) if setting in RUN_FLAGS else argparse.SUPPRESS
        if setting.switch:
            parser.add_argument(setting.flag, dest=_dest(setting.flag), action="store_const", const=True, help=shown)
        else:
            parser.add_argument(setting.flag, dest=_dest(setting.flag), metavar=setting.type_name.upper(), help=shown)


def flag_values(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[dict[str, object], dict[str, str]]:
    """What flags and environment variables give, by dotted key (a flag over its variable), and which of them gave
    each value (for the error about it)."""
    values: dict[str, object] = {}
    origins: dict[str, str] = {}
    for setting in (*RUN_FLAGS, *DEPRECATED_FLAGS):
        assert setting.flag is not None and setting.env is not None
        value, origin = getattr(args, _dest(setting.flag), None), setting.flag
        if value is None:
            value, origin = environ.get(setting.env), setting.env
        if value is not None:
            values[setting.key], origins[setting.key] = setting.from_text(value), origin
    specs, origin = _listed(args.target, TARGET_FLAG, environ)
    controls, control_origin = _listed(args.control_target, CONTROL_TARGET_FLAG, environ)
    targets = target_entries(specs, origin) if specs else []
    if controls:
        if not specs and (args.config_file or environ.get(CONFIG_FILE_FLAG.env)):
            raise SourcedError(f"{control_origin}: give the targets it is the control of with {TARGET_FLAG.flag} too, "
                               "or declare the control in the config file (spec_decode: false)")
        default = [{"name": DEFAULT_TARGET_NAME, "url": DEFAULT_TARGET_URL}]
        targets, origin = with_control(targets or default, controls, control_origin), control_origin
    if targets:
        values["targets"], origins["targets"] = targets, origin
    return values, origins


def _listed(given: list[str] | None, flag: OuterFlag, environ: Mapping[str, str]) -> tuple[list[str], str]:
    """A repeatable flag's entries, else its variable's (comma-separated), and which of the two gave them."""
    if given:
        return given, flag.flag
    return [entry for entry in environ.get(flag.env, "").split(",") if entry], flag.env


def config_from_args(args: argparse.Namespace) -> Config:
    """Flag > environment variable > config file > default: the flags and variables are merged into the file's
    mapping by dotted key, and the whole is validated once."""
    values, origins = flag_values(args, os.environ)
    config_file = args.config_file or os.environ.get(CONFIG_FILE_FLAG.env)
    if config_file:
        return load_config_file(config_file, flags=values, origins=origins)
    return config_from_mapping({}, "defaults", values, origins)


def cmd_run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    from specdecode_exporter.sidecar.webconfig import WebSecurity, load_web_config

    security = WebSecurity(load_web_config(config.web.config_file)) if config.web.config_file else None
    setup_logging(config.log.level, config.log.format)
    warn_deprecated(config)
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


def build_parser(argv: Sequence[str] | None = None) -> OneLineArgumentParser:
    """The parser for ``argv`` (default: the command line): a tool's flags are added only when it is the command."""
    parser = OneLineArgumentParser(prog=PROG, description="Is vLLM's speculative decoding paying off?")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineArgumentParser,
                                     required=True)

    def command(name: str, help: str) -> OneLineArgumentParser:
        sub = commands.add_parser(name, help=help)
        assert isinstance(sub, OneLineArgumentParser)
        parser.subcommands[name] = sub
        return sub

    run = command("run", "run the sidecar (collect vLLM, serve /metrics)")
    add_run_flags(run)
    run.set_defaults(handler=cmd_run)

    check = command("check", "collect a vLLM /metrics URL twice and print a verdict")
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

    demo = command("demo", "run the simulator and the sidecar together")
    demo.add_argument("--web.listen-address", dest="web_listen_address", default="127.0.0.1:9877",
                      help="sidecar address (default 127.0.0.1:9877)")
    demo.add_argument("--scenario", help="simulator scenario file (default: the packaged demo scenario)")
    demo.add_argument("--duration", help="stop after this long (default: run until Ctrl-C)")
    demo.set_defaults(handler=cmd_demo)

    chosen = _command_of(argv)
    for tool in TOOLS:
        sub = command(tool.name, tool.help)
        if tool.name == chosen:
            module = importlib.import_module(tool.module)
            module.add_arguments(sub)
            sub.set_defaults(handler=module.main)
    return parser


def _version() -> str:
    from specdecode_exporter.sidecar.expose import exporter_version

    return exporter_version()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(argv)
    args, extras = parser.parse_known_args(argv)
    if extras:  # reported by the command's own parser: its flags, its --help (the top level lists none of them)
        command = parser.subcommands[args.command]
        command.error(unknown_flags(command, extras))
    try:
        if args.command == "run":
            check_environment(parser.subcommands["run"], os.environ)
        return int(args.handler(args) or 0)
    except ConfigError as exc:
        sys.stderr.write(f"{PROG}: config error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
