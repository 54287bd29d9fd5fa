"""docs/demo.md's timeline is what the demo as installed does: `specdecode-exporter demo` over real HTTP on a free
port for one whole loop of its packaged scenario (about 8 minutes, in real time: the demo has no faster clock), the
status API and the simulated vLLM's phase read every 2 s, and each bold claim of the page's table checked over the
time span its row states (docs/demo.md says how). The numbers live only in that table: the test reads them there,
so the page and the demo cannot drift apart. The routing, the stop with its verdict and the restart included."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.procs import ROOT, child_env, exporter_command, free_port
from specdecode_exporter.core.contract.metrics import CONTRACT

DEMO_PAGE = ROOT / "docs" / "demo.md"
SPEC_TARGET = "simulated-vllm"
_TIME = re.compile(r"^(?:(?P<from>from) )?(?P<start>\d+)(?:–(?P<end>\d+))? s(?: \(± (?P<tolerance>\d+) s\))?$")
_CLAIM = re.compile(r"\*\*(?P<subject>[^*:]+): (?P<value>[^*]+)\*\*")
_TOLERANCE = re.compile(r"each is good to ± (\d+) s")


@dataclass(frozen=True)
class Look:
    """One look at the demo: the simulator's clock and phase, and the sidecar's view of the speculative pod."""

    at: float  # seconds since the demo started (the simulated vLLM's own clock)
    phase: str
    series: dict[str, Any]
    routed: frozenset[str]  # "chat 0.7+", …: the classes routed to the control pod
    classes: frozenset[str]  # every class the tap has seen of the served model


@dataclass(frozen=True)
class Claim:
    subject: str
    value: str
    start: float
    end: float | None  # None: until the run ends
    row: str
    tolerance: float | None = None  # the row's own, where it states one ("(± 15 s)"); else the page's

    def holds(self, look: Look) -> bool:
        return CHECKS[self.subject](self.value, look)


def _window_value(look: Look, key: str) -> float | None:
    value = look.series.get("windows", {}).get("1m", {}).get(key)
    return float(value) if value is not None else None


def _compare(value: float | None, claim: str) -> bool:
    """'below 0.5', 'above 0.6', a figure to two decimals ('2.00') or 'absent' (no sample: no drafts in the
    window); an absent value meets only 'absent'."""
    if value is None or claim == "absent":
        return value is None and claim == "absent"
    word, _, figure = claim.rpartition(" ")
    if word == "below":
        return value < float(figure)
    if word == "above":
        return value > float(figure)
    return round(value, 2) == float(figure)


def _routed(value: str, look: Look) -> bool:
    wanted = look.classes if value == "every class" else frozenset(v.strip() for v in value.split(","))
    return bool(wanted) and wanted <= look.routed


CHECKS: dict[str, Callable[[str, Look], bool]] = {
    "phase": lambda value, look: look.phase == value,
    "verdict": lambda value, look: look.series.get("verdict") == value,
    "speculation": lambda value, look: (look.series.get("speculation") or {}).get("state") == value,
    "routed": _routed,
    "α (1m)": lambda value, look: _compare(_window_value(look, "acceptance_ratio"), value),
    "mean draft length (1m)": lambda value, look: _compare(_window_value(look, "mean_draft_length"), value),
}


def timeline(text: str) -> tuple[float, list[Claim]]:
    """The tolerance the page states and every bold claim of its table with the row's time span."""
    tolerance = _TOLERANCE.search(text)
    assert tolerance is not None, "docs/demo.md states its tolerance ('each is good to ± N s')"
    table = text[text.index("| time | what you see | where you see it |"):]
    claims = []
    for row in table.splitlines()[2:]:
        if not row.startswith("|"):
            break
        when, what, _ = (cell.strip() for cell in row.strip("|").split(" | "))
        span = _TIME.match(when)
        assert span is not None, f"a time is 'A–B s' or 'from A s', optionally followed by '(± N s)': {when!r}"
        assert (span["from"] is None) == (span["end"] is not None), when
        end = None if span["end"] is None else float(span["end"])
        for claim in _CLAIM.finditer(what):
            assert claim["subject"] in CHECKS, f"no check for {claim['subject']!r} (row {when})"
            row_tolerance = None if span["tolerance"] is None else float(span["tolerance"])
            claims.append(Claim(claim["subject"], claim["value"], float(span["start"]), end, when, row_tolerance))
    return float(tolerance.group(1)), claims


def test_the_demo_page_states_claims_the_timeline_test_checks() -> None:
    """Fast: the page parses, every row carries a claim, and every metric it points at is one the sidecar exports."""
    text = DEMO_PAGE.read_text(encoding="utf-8")
    tolerance, claims = timeline(text)
    assert 0 < tolerance <= 15
    assert all(0 < claim.tolerance <= 15 for claim in claims if claim.tolerance is not None)
    subjects = {claim.subject for claim in claims}
    assert {"phase", "verdict", "speculation", "routed"} <= subjects, subjects
    assert {c.value for c in claims if c.subject == "verdict"} >= {"hurting", "not speculating"}
    assert {c.value for c in claims if c.subject == "speculation"} == {"speculating", "stopped"}
    exposed = {spec.exposed_name for spec in CONTRACT}
    named = set(re.findall(r"`(specdecode_[a-z_]+)", text)) - {"specdecode_request_"}
    assert named and named <= exposed, named - exposed


def test_the_demos_banner_agrees_with_its_page() -> None:
    """What the demo prints when it starts: its phases at the times the page's table gives them, routing on, and
    the page to read."""
    printed = subprocess.run([*exporter_command(), "demo", "--web.listen-address", f"127.0.0.1:{free_port()}",
                              "--duration", "1s"], capture_output=True, text=True, timeout=60, env=child_env(),
                             check=True).stdout
    phases = re.search(r"^Phases of the simulated vLLM: (.*), then again from (\d+) s\.$", printed, re.M)
    assert phases is not None, printed
    printed_starts = [(name, float(start)) for name, start in re.findall(r"(\w+) (\d+) s", phases.group(1))]
    _, claims = timeline(DEMO_PAGE.read_text(encoding="utf-8"))
    page_phases = [(claim.value, claim.start) for claim in claims if claim.subject == "phase"]
    assert page_phases == [*printed_starts, (printed_starts[0][0], float(phases.group(2)))], printed
    for said in ("Routing is on", "docs/demo.md", "'not speculating'", "'hurting'"):
        assert said in printed, said


def look_at(base: str, simulator: str) -> Look:
    state = httpx.get(f"{simulator}/-/state", timeout=5).json()
    status = httpx.get(f"{base}/api/v1/status", timeout=5).json()
    spec = next(t for t in status["targets"] if t["name"] == SPEC_TARGET)
    series = spec["series"][0] if spec["series"] else {}
    model = series.get("model_name")
    classes = [c for c in (spec.get("routing") or {}).get("classes", []) if c["model_name"] == model]
    return Look(state["sim_time_seconds"], state["phase"]["name"], series,
                frozenset(f"{c['workload']} {c['temperature']}" for c in classes if c["routed"]),
                frozenset(f"{c['workload']} {c['temperature']}" for c in classes))


def printed_simulator(log: Path, alive: Callable[[], bool]) -> str:
    """The simulated vLLM's base URL, from the lines the demo prints once everything listens."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert alive(), log.read_text()
        found = re.search(r"^  simulated vLLM\s+(http://\S+)/metrics", log.read_text(), re.M)
        if found and "Ctrl-C stops" in log.read_text():
            return found.group(1)
        time.sleep(0.2)
    raise AssertionError(log.read_text())


def watch(tmp_path: Path, until: float) -> list[Look]:
    """The demo from its start until its clock passes ``until``, a look every 2 s."""
    port = free_port()
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*exporter_command(), "demo", "--web.listen-address", f"127.0.0.1:{port}",
                                 "--duration", f"{until + 60:.0f}s"], stdout=out, stderr=out, text=True,
                                env=child_env())
    looks: list[Look] = []
    try:
        simulator = printed_simulator(log, lambda: proc.poll() is None)
        while not looks or looks[-1].at < until:
            assert proc.poll() is None, log.read_text()
            with contextlib.suppress(httpx.TimeoutException):  # a loaded machine: the next look will do
                looks.append(look_at(f"http://127.0.0.1:{port}", simulator))
            time.sleep(2)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert proc.returncode == 0 and "Traceback" not in log.read_text(), log.read_text()
    return looks


def misses(claim: Claim, tolerance: float, looks: list[Look]) -> list[str]:
    """Where the demo contradicts the claim: not holding inside its span (short of the tolerance at each end), or
    holding already before the span began (less the tolerance). What a row says of its end is the next row's claim:
    the verdict that follows, α absent, …"""
    row = f"{claim.row} {claim.subject}: {claim.value}"
    tolerance = claim.tolerance if claim.tolerance is not None else tolerance
    inside = [look for look in looks
              if claim.start + tolerance <= look.at and (claim.end is None or look.at <= claim.end - tolerance)]
    found = [f"{row}: at {look.at:.0f} s it does not hold" for look in inside if not claim.holds(look)]
    if not inside:
        found.append(f"{row}: no look inside the span")
    before = [look for look in looks if look.at <= claim.start - tolerance]
    if before and claim.holds(before[-1]):
        found.append(f"{row}: it already holds at {before[-1].at:.0f} s")
    return found


@pytest.mark.timeout(720)
def test_the_demo_does_what_its_page_says_when_it_says(tmp_path: Path) -> None:
    tolerance, claims = timeline(DEMO_PAGE.read_text(encoding="utf-8"))
    until = max(claim.end or claim.start for claim in claims) + 2 * max(
        [tolerance, *(claim.tolerance for claim in claims if claim.tolerance is not None)])
    looks = watch(tmp_path, until)
    found = [miss for claim in claims for miss in misses(claim, tolerance, looks)]
    story = "\n".join(f"{look.at:5.0f} {look.phase:9} {look.series.get('verdict')!s:15} "
                      f"{(look.series.get('speculation') or {}).get('state')!s:11} "
                      f"α1m {_window_value(look, 'acceptance_ratio')} k̄ {_window_value(look, 'mean_draft_length')} "
                      f"routed {sorted(look.routed)}" for look in looks)
    assert not found, "\n".join(found) + "\n\nwhat the demo did:\n" + story
