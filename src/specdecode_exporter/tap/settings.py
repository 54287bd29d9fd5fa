"""The request tap's settings: the config's ``tap`` section (flags ``--tap.*``, variables ``SPECDECODE_TAP_*``), each
declared once here with its type, default, help, flag and reload behaviour (core/config/settings.py). The sidecar
validates them (core/config/validation.py, with the keys the targets give defaults to) and hands this very object to the
tap's process, whose relay (upstream, workload_header, connect_timeout), recorder (max_workloads,
temperature_bands), router (route) and drain (drain_timeout) read it as it is; the sidecar reads the rest.

Like the types they are declared with (core/config/kinds.py), these declarations import no validation library: the tap's
process stays lean. Adding a tap setting is a field here and the code that reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from specdecode_exporter.core.config.kinds import (
    Bool,
    Check,
    CheckTyped,
    Choice,
    Duration,
    DurationOrZero,
    Int,
    Invalid,
    ListenAddress,
    Named,
    Number,
    Range,
    Text,
    show,
)
from specdecode_exporter.core.config.settings import Section, setting

OBSERVE, ENFORCE = "observe", "enforce"
MODES = (OBSERVE, ENFORCE)
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")


def _upstream(value: object) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"http://[^/@\s]+/?", value):
        raise Invalid(f"expected http://host:port (the tap relays plain HTTP), got {show(value)}")
    return value.rstrip("/")


def _header_name(value: object) -> str:
    if not isinstance(value, str) or not _HEADER_NAME.fullmatch(value):
        raise Invalid(f"expected an HTTP header name, got {show(value)}")
    return value


def _increasing(bands: tuple[float, ...]) -> tuple[float, ...]:
    if not bands:
        raise Invalid("expected a list of increasing temperatures, got []")
    if list(bands) != sorted(set(bands)):
        raise Invalid(f"must increase, got {list(bands)}")
    return bands


def _prompt_lengths(value: object) -> tuple[int, ...]:
    """Prompt-length band edges: [1024, 4096] or '1024,4096' (a flag), in tokens, increasing."""
    items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(
            (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, str) and v.isdigit()) for v in items):
        raise Invalid(f"expected increasing prompt lengths in tokens like [1024, 4096], got {show(value)}")
    edges = tuple(int(v) for v in items)
    if list(edges) != sorted(set(edges)) or (edges and edges[0] < 1):
        raise Invalid(f"expected increasing prompt lengths in tokens like [1024, 4096], got {show(value)}")
    return edges


def _numbers_text(numbers: tuple[int, ...]) -> str:
    return ",".join(str(n) for n in numbers) or "none"


Upstream = Annotated[str, Check(_upstream), Named("URL")]
"""Where the tap relays to: http://host:port (the tap relays plain HTTP), kept without a trailing slash."""


@dataclass(frozen=True, slots=True)
class RouteSettings(Section):
    """``tap.route``: routing, on when a fallback upstream is set (tap/route.py decides, the relay sends)."""

    fallback_upstream: Upstream = setting(
        help="turn routing on: a pool of the same model without speculative decoding, http://host:port, where the "
             "tap sends the classes of requests speculative decoding slows down", reload=False, shown="off")
    mode: Annotated[str, Choice(*MODES), Named("mode")] = setting(
        OBSERVE, "observe (decide and count only) or enforce (send routed classes to the fallback)", reload=False)
    min_requests: Annotated[Int, Range(2)] = setting(
        50, "requests of a class (with spec-decode metrics) per decision", reload=False)
    canary_share: Annotated[Number, Range(0, 1, above=True)] = setting(
        0.05, "share of a routed class kept on speculative decoding, which measures its speedup and brings it back",
        reload=False)
    prompt_length_bands: Annotated[tuple[int, ...], Check(_prompt_lengths), Named("tokens", _numbers_text)] = setting(
        (), "comma-separated prompt lengths in tokens, e.g. 1024,4096: the prompt-length band becomes part of a "
            "class", reload=False)


@dataclass(frozen=True, slots=True)
class TapSettings(Section):
    """``tap``: the request tap. The sidecar also forwards vLLM's OpenAI API and reads each response's per-request
    metrics. Its process is started with these settings and restarted for any change (no setting reloads)."""

    listen_address: ListenAddress = setting(
        help="turn the request tap on: also forward vLLM's OpenAI API here and record each response's per-request "
             "metrics", reload=False, shown="off")
    upstream: Upstream = setting(
        help="where the tap forwards to, http://host:port", reload=False, shown="the target's scheme, host and port")
    target: Text = setting(help="the target whose series the tap's figures go with", flag=False, reload=False,
                           shown="the first target")
    workload_header: Annotated[str, Check(_header_name)] = setting(
        "x-workload", "the request header that names a request's workload", flag=False, reload=False)
    max_workloads: Annotated[Int, Range(1)] = setting(
        10, "workloads kept as label values (more are counted as other)", flag=False, reload=False)
    temperature_bands: Annotated[tuple[Annotated[Number, Range(0, 10)], ...], CheckTyped(_increasing)] = setting(
        (0.3, 0.7), "the edges of the temperature label's bands", flag=False, reload=False)
    connect_timeout: Duration = setting(3.0, "timeout of connecting to the upstream", flag=False, reload=False)
    drain_timeout: DurationOrZero = setting(
        20.0, "on shutdown: how long requests in flight may take to finish", flag=False, reload=False)
    class_histograms: Bool = setting(
        False, "export the tap's per-request histograms by workload and temperature band too, not only per model "
               "(a drill-down that multiplies their series by the classes in use; α per class stays exact from the "
               "counters)", reload=False)
    route: RouteSettings | None = None  # routing to a pool without spec decode: off unless a fallback is set
