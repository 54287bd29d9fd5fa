"""Small charts as inline SVG: no JavaScript, no external assets, readable in any browser and in a saved page.
The status page and `probe --plot x.html` draw with these."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

Point = tuple[float, float]
PALETTE = ("#0969da", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#57606a")


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[Point]
    colour: str = PALETTE[0]
    dashed: bool = False


@dataclass(frozen=True)
class Rule:
    """A horizontal reference line (a threshold) with its label."""

    value: float
    label: str
    colour: str = "#cf222e"


@dataclass(frozen=True)
class Frame:
    width: int = 320
    height: int = 120
    left: int = 44  # room for the y labels
    bottom: int = 18  # room for the x labels
    top: int = 18  # room for the title
    right: int = 8

    @property
    def plot_width(self) -> int:
        return self.width - self.left - self.right

    @property
    def plot_height(self) -> int:
        return self.height - self.top - self.bottom


@dataclass(frozen=True)
class Axis:
    low: float
    high: float
    format: str = "{:.2f}"
    ticks: tuple[float, ...] = field(default=())

    def scale(self, value: float, size: int, flip: bool) -> float:
        span = self.high - self.low or 1.0
        share = (min(max(value, self.low), self.high) - self.low) / span
        return size * (1.0 - share) if flip else size * share


def fit(values: Sequence[float], floor: float | None = 0.0, pad: float = 0.1,
        include: Sequence[float] = ()) -> tuple[float, float]:
    """A y range that shows every value (and the reference lines), padded a little, its ends on round values
    (nice_step), so that the ticks are too."""
    finite = [v for v in (*values, *include) if math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    low, high = min(finite), max(finite)
    if floor is not None:
        low = min(low, floor)
    margin = (high - low) * pad or abs(high) * pad or 1.0
    low, high = (low if floor is not None and low == floor else low - margin), high + margin
    step = nice_step(low, high)
    return math.floor(low / step + 1e-9) * step, math.ceil(high / step - 1e-9) * step


NICE_MULTIPLES = (1.0, 2.0, 5.0)  # a tick step is one of these times a power of ten
MAX_TICK_INTERVALS = 4


def nice_step(low: float, high: float) -> float:
    """The smallest round step (1, 2 or 5 × 10ⁿ) that covers [low, high] in at most MAX_TICK_INTERVALS steps
    from a multiple of itself."""
    span = high - low
    if not span > 0 or not math.isfinite(span):
        return 1.0
    exponent = math.floor(math.log10(span / MAX_TICK_INTERVALS))
    for power in (exponent, exponent + 1, exponent + 2):
        for multiple in NICE_MULTIPLES:
            step = multiple * 10.0 ** power
            if math.ceil(high / step - 1e-9) - math.floor(low / step + 1e-9) <= MAX_TICK_INTERVALS:
                return step
    return 10.0 ** (exponent + 3)


def nice_ticks(low: float, high: float) -> tuple[float, ...]:
    """Every multiple of nice_step between low and high (both ends included when they are multiples)."""
    step = nice_step(low, high)
    first, last = math.ceil(low / step - 1e-9), math.floor(high / step + 1e-9)
    return tuple(round(i * step, 12) for i in range(first, last + 1))


def tick_format(low: float, high: float, suffix: str = "") -> str:
    """A format with as many decimals as the round step between ticks needs."""
    decimals = max(0, -math.floor(math.log10(nice_step(low, high)) + 1e-9))
    return "{:." + str(decimals) + "f}" + suffix


def _ticks(axis: Axis) -> tuple[float, ...]:
    return axis.ticks or nice_ticks(axis.low, axis.high)


LABEL_CHAR_WIDTH = 5.5  # px per character of a 9 px label, generous (an estimate: the SVG is laid out by the browser)
LABEL_GAP = 10.0  # px between the baselines of two reference-line labels


def _label_width(text: str) -> float:
    return len(text) * LABEL_CHAR_WIDTH


def _spread(wanted: Sequence[float], low: float, high: float) -> list[float]:
    """Label baselines as near to ``wanted`` as they can be, at least LABEL_GAP apart, within [low, high]."""
    order = sorted(range(len(wanted)), key=lambda i: wanted[i])
    placed: list[float] = []
    for i in order:
        placed.append(max(wanted[i], placed[-1] + LABEL_GAP) if placed else wanted[i])
    overflow = placed[-1] - high if placed else 0.0
    if overflow > 0:
        placed = [y - overflow for y in placed]
    shift = low - placed[0] if placed and placed[0] < low else 0.0
    out = [0.0] * len(wanted)
    for i, y in zip(order, placed, strict=True):
        out[i] = y + shift
    return out


def _rules(rules: Sequence[Rule], y: Axis, frame: Frame) -> list[str]:
    """Each reference line across the plot, its label in the right margin (never over the data)."""
    esc = html.escape
    right = frame.left + frame.plot_width
    ys = [frame.top + y.scale(rule.value, frame.plot_height, flip=True) for rule in rules]
    labels = _spread([ry + 3 for ry in ys], frame.top + 6, frame.top + frame.plot_height + 3)
    return [f'<line x1="{frame.left}" x2="{right}" y1="{ry:.1f}" y2="{ry:.1f}" stroke="{rule.colour}" '
            f'stroke-dasharray="4 3"/><text x="{right + 4}" y="{ly:.1f}" font-size="9" fill="{rule.colour}">'
            f"{esc(rule.label)}</text>" for rule, ry, ly in zip(rules, ys, labels, strict=True)]


def _legend(series: Sequence[Series], frame: Frame) -> list[str]:
    """The series' names, right-aligned in the title row, each after a sample of its line."""
    esc = html.escape
    parts, x = [], float(frame.width - frame.right)
    for line in reversed(series):
        x -= _label_width(line.name)
        parts.append(f'<text x="{x:.1f}" y="12" font-size="9">{esc(line.name)}</text>')
        dash = ' stroke-dasharray="4 2"' if line.dashed else ""
        parts.append(f'<line x1="{x - 16:.1f}" x2="{x - 3:.1f}" y1="9" y2="9" stroke="{line.colour}" '
                     f'stroke-width="1.5"{dash}/>')
        x -= 24
    return parts


def _with_room_for(frame: Frame, rules: Sequence[Rule]) -> Frame:
    """The frame widened so that the reference-line labels fit in its right margin; the plot keeps its width."""
    need = int(max((_label_width(rule.label) for rule in rules), default=0.0)) + 8
    if need <= frame.right:
        return frame
    return replace(frame, width=frame.width + need - frame.right, right=need)


def _axes(x: Axis, y: Axis, frame: Frame) -> list[str]:
    """Tick labels outside the plot: y on the left, x below."""
    esc = html.escape
    parts = []
    for tick in _ticks(y):
        ty = frame.top + y.scale(tick, frame.plot_height, flip=True)
        parts.append(f'<text x="{frame.left - 4}" y="{ty + 3:.1f}" font-size="9" text-anchor="end">'
                     f"{esc(y.format.format(tick))}</text>")
    for tick in _ticks(x):
        tx = frame.left + x.scale(tick, frame.plot_width, flip=False)
        anchor = "end" if tick >= x.high else "start" if tick <= x.low else "middle"  # stay inside the frame
        parts.append(f'<text x="{tx:.1f}" y="{frame.height - 5}" font-size="9" text-anchor="{anchor}">'
                     f"{esc(x.format.format(tick))}</text>")
    return parts


def _lines(series: Sequence[Series], x: Axis, y: Axis, frame: Frame) -> list[str]:
    esc = html.escape
    parts = []
    for line in series:
        coords = [(frame.left + x.scale(px, frame.plot_width, flip=False),
                   frame.top + y.scale(py, frame.plot_height, flip=True))
                  for px, py in line.points if math.isfinite(px) and math.isfinite(py)]
        if not coords:
            continue
        dash = ' stroke-dasharray="5 3"' if line.dashed else ""
        path = " ".join(f"{cx:.1f},{cy:.1f}" for cx, cy in coords)
        parts.append(f'<polyline fill="none" stroke="{line.colour}" stroke-width="1.5"{dash} points="{path}">'
                     f"<title>{esc(line.name)}</title></polyline>")
        if len(coords) == 1:
            parts.append(f'<circle cx="{coords[0][0]:.1f}" cy="{coords[0][1]:.1f}" r="2" fill="{line.colour}"/>')
    return parts


def line_chart(title: str, series: Sequence[Series], x: Axis, y: Axis, rules: Sequence[Rule] = (),
               frame: Frame = Frame(), empty: str = "no data yet", legend: bool = False) -> str:
    """Lines over a shared x axis, with labelled y ticks and horizontal reference lines. Every label lies outside
    the plotted area: ticks left and below, reference lines' labels in the right margin, the legend (``legend``:
    the names of the series drawn) beside the title."""
    esc = html.escape
    frame = _with_room_for(frame, rules)
    drawn = _lines(series, x, y, frame)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{frame.width}" height="{frame.height}" '
             f'viewBox="0 0 {frame.width} {frame.height}" role="img" aria-label="{esc(title)}" class="chart">',
             f'<text x="{frame.left}" y="12" font-size="11" font-weight="bold">{esc(title)}</text>',
             f'<rect x="{frame.left}" y="{frame.top}" width="{frame.plot_width}" height="{frame.plot_height}" '
             'fill="#f6f8fa" stroke="#d0d7de" class="plot"/>',
             *_axes(x, y, frame), *_rules(rules, y, frame), *drawn]
    if legend and drawn:
        parts += _legend([line for line in series if line.points], frame)
    if not drawn:
        parts.append(f'<text x="{frame.left + frame.plot_width / 2}" y="{frame.top + frame.plot_height / 2}" '
                     f'font-size="10" text-anchor="middle" fill="#57606a">{esc(empty)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(title: str, bars: Sequence[tuple[str, float]], colours: Sequence[str] = (), frame: Frame = Frame(),
              value_format: str = "{:.0%}", empty: str = "no data yet") -> str:
    """Vertical bars with a label under each (a distribution: share of requests per acceptance band)."""
    esc = html.escape
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{frame.width}" height="{frame.height}" '
             f'viewBox="0 0 {frame.width} {frame.height}" role="img" aria-label="{esc(title)}" class="chart">',
             f'<text x="{frame.left}" y="12" font-size="11" font-weight="bold">{esc(title)}</text>']
    highest = max((value for _, value in bars), default=0.0)
    if highest <= 0:
        parts.append(f'<text x="{frame.width / 2}" y="{frame.height / 2}" font-size="10" text-anchor="middle" '
                     f'fill="#57606a">{esc(empty)}</text></svg>')
        return "".join(parts)
    slot = frame.plot_width / len(bars)
    for i, (label, value) in enumerate(bars):
        height = frame.plot_height * value / highest
        bx, by = frame.left + i * slot + 1, frame.top + frame.plot_height - height
        colour = colours[i] if i < len(colours) else PALETTE[0]
        parts.append(f'<rect x="{bx:.1f}" y="{by:.1f}" width="{max(1.0, slot - 2):.1f}" height="{height:.1f}" '
                     f'fill="{colour}"><title>{esc(label)}: {esc(value_format.format(value))}</title></rect>')
        if len(bars) <= 10 or i % max(1, len(bars) // 10) == 0:
            parts.append(f'<text x="{bx + slot / 2 - 1:.1f}" y="{frame.height - 5}" font-size="8" '
                         f'text-anchor="middle">{esc(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)
