"""A request's VRAM timeline as an SVG chart (issue 15; `mizuoto say --timeline out.svg`).

It draws a request report's `timeline` (format in report.py): one lane per phase name, time
left to right; in each phase's span, what its components had on the device (green) and its
working memory (orange) against the device's size, bytes streamed from RAM for it (blue strip),
and markers where a component yielded VRAM and for whom (purple), where an exact out-of-memory
retry happened (red) and where a fallback ran (dark red). Every mark has a tooltip (`<title>`).
The browser panel draws the same data from the route.
"""
from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SVG_NS = "http://www.w3.org/2000/svg"
WIDTH = 960
LEFT = 150  # lane labels
RIGHT = 24
TOP = 64  # title, subtitle, time axis
LANE_H = 86
CHAR_W = 6.2  # a character's width at FONT, roughly
BAR_H = 44  # the device's size, bottom to top
STREAM_H = 5
LEGEND_H = 40
FONT = "font-family:sans-serif;font-size:11px"

COLORS = {
    "loaded": ("#43a047", "#2e7d32"),  # alternating per component
    "working": "#fb8c00",
    "streamed": "#1e88e5",
    "span": "#eceff1",
    "yield": "#8e24aa",
    "retry": "#e53935",
    "fallback": "#8b0000",
    "axis": "#90a4ae",
    "text": "#263238",
}
LEGEND = (("loaded", "weights on the device"), ("working", "working memory"),
          ("streamed", "streamed from RAM"), ("yield", "yielded VRAM (for whom: hover)"),
          ("retry", "out-of-memory retry"), ("fallback", "fallback"))


def _el(parent: ET.Element, tag: str, text: str | None = None, **attrs: Any) -> ET.Element:
    el = ET.SubElement(parent, tag, {k.rstrip("_").replace("_", "-"): str(v) for k, v in attrs.items()})
    if text is not None:
        el.text = text
    return el


def _tip(el: ET.Element, text: str) -> ET.Element:
    _el(el, "title", text)
    return el


def _mb(value: float) -> str:
    return f"{value:.1f} MB"


def _short(name: str) -> str:
    return name.split(":", 1)[1] if ":" in name else name


def _tick_step(duration: float) -> float:
    """A round step giving about 5–10 ticks."""
    raw = duration / 8
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _lanes(phases: Sequence[Mapping[str, Any]]) -> list[str]:
    names: list[str] = []
    for phase in phases:
        if phase["name"] not in names:
            names.append(phase["name"])
    return names


def _scale_mb(report: Mapping[str, Any]) -> float:
    """What a lane's full height stands for: the device's size, or the largest phase."""
    stacked = [sum(c["loaded_mb"] for c in p["components"]) + p["working_mb"] for p in report["timeline"]]
    return max([report.get("device_mb") or 0.0, *stacked, 1e-6])


def _phase_tip(phase: Mapping[str, Any]) -> str:
    lines = [f"{phase['name']}: {phase['start_s']:.3f}–{phase['end_s']:.3f} s, working memory "
             f"{_mb(phase['working_mb'])}, reserve {_mb(phase['reserve_mb'])}"]
    lines += [f"{_short(c['name'])}: {_mb(c['loaded_mb'])} on the device, {_mb(c['streamed_mb'])} streamed"
              for c in phase["components"]]
    lines += [f"{_short(y['component'])} gave {_mb(y['mb'])} of VRAM for "
              f"{', '.join(map(_short, y['for_whom']))} at {y['at_s']:.3f} s" for y in phase["yields"]]
    lines += [f"out-of-memory retry {r['attempt']} at {r['at_s']:.3f} s" for r in phase["retries"]]
    lines += [f"fallback {f['what']} at {f['at_s']:.3f} s" for f in phase["fallbacks"]]
    return "\n".join(lines)


def _phase_label(phase: Mapping[str, Any]) -> str:
    loaded = sum(c["loaded_mb"] for c in phase["components"])
    streamed = sum(c["streamed_mb"] for c in phase["components"])
    return f"{_mb(loaded)} on device · {_mb(streamed)} streamed · {_mb(phase['working_mb'])} working"


class _Chart:
    def __init__(self, report: Mapping[str, Any]) -> None:
        self.report = report
        self.phases = list(report["timeline"])
        self.lanes = _lanes(self.phases)
        ends = [p["end_s"] for p in self.phases]
        self.duration = max([report.get("duration_s") or 0.0, *ends, 1e-3])
        self.scale = _scale_mb(report)
        self.last_in_lane = {p["lane"]: p for p in self.phases}
        self.height = TOP + LANE_H * max(1, len(self.lanes)) + LEGEND_H
        self.root = ET.Element("svg", {"xmlns": SVG_NS, "width": str(WIDTH), "height": str(self.height),
                                       "viewBox": f"0 0 {WIDTH} {self.height}", "style": FONT})

    def x(self, seconds: float) -> float:
        return round(LEFT + (WIDTH - LEFT - RIGHT) * min(max(seconds, 0.0), self.duration) / self.duration, 2)

    def lane_top(self, lane: int) -> float:
        return TOP + lane * LANE_H

    def draw(self) -> ET.Element:
        self._title()
        self._axis()
        for lane, name in enumerate(self.lanes):
            top = self.lane_top(lane)
            _el(self.root, "text", name, x=8, y=top + BAR_H / 2 + 8, fill=COLORS["text"], font_weight="bold")
            _el(self.root, "line", x1=LEFT, x2=WIDTH - RIGHT, y1=top + LANE_H - 4, y2=top + LANE_H - 4,
                stroke=COLORS["axis"], stroke_width=0.5)
        for phase in self.phases:
            self._phase(phase)
        self._legend()
        return self.root

    def _title(self) -> None:
        r = self.report
        head = (f"Request {r['id']} on {r['device']}: {self.duration:.2f} s, "
                f"{_mb(r['streamed_mb'])} streamed from RAM")
        _el(self.root, "text", head, x=8, y=18, fill=COLORS["text"], font_size=14, font_weight="bold")
        extra = [f"{r['oom_retries']} out-of-memory retries"] if r["oom_retries"] else []
        extra += [f"fallbacks: {', '.join(r['fallbacks'])}"] if r["fallbacks"] else []
        comps = "; ".join(f"{_short(c['name'])} {_mb(c['total_mb'])}" for c in r["components"])
        _el(self.root, "text", " · ".join([f"components: {comps}" if comps else "no component placed", *extra]),
            x=8, y=36, fill=COLORS["text"])

    def _axis(self) -> None:
        y = TOP - 8
        _el(self.root, "line", x1=LEFT, x2=WIDTH - RIGHT, y1=y, y2=y, stroke=COLORS["axis"])
        step = _tick_step(self.duration)
        for i in range(int(self.duration / step) + 1):
            t = i * step
            _el(self.root, "line", x1=self.x(t), x2=self.x(t), y1=y - 3, y2=y + 3, stroke=COLORS["axis"])
            _el(self.root, "text", f"{t:g} s", x=self.x(t), y=y - 5, fill=COLORS["text"], text_anchor="middle")

    def _phase(self, phase: Mapping[str, Any]) -> None:
        top = self.lane_top(phase["lane"])
        x0, x1 = self.x(phase["start_s"]), self.x(phase["end_s"])
        width = max(x1 - x0, 1.0)
        group = _tip(_el(self.root, "g", class_="phase", data_phase=phase["name"]), _phase_tip(phase))
        _el(group, "rect", x=x0, y=top, width=width, height=BAR_H, fill=COLORS["span"])
        bottom = top + BAR_H
        for i, comp in enumerate(phase["components"]):
            h = BAR_H * comp["loaded_mb"] / self.scale
            _tip(_el(group, "rect", x=x0, y=round(bottom - h, 2), width=width, height=round(h, 2),
                     fill=COLORS["loaded"][i % 2], class_="loaded", data_component=comp["name"]),
                 f"{_short(comp['name'])}: {_mb(comp['loaded_mb'])} on the device")
            bottom -= h
        h = BAR_H * phase["working_mb"] / self.scale
        _el(group, "rect", x=x0, y=round(bottom - h, 2), width=width, height=round(h, 2), fill=COLORS["working"],
            class_="working")
        if any(c["streamed_mb"] > 0 for c in phase["components"]):
            _el(group, "rect", x=x0, y=top - STREAM_H - 1, width=width, height=STREAM_H, fill=COLORS["streamed"],
                class_="streamed")
        if width > 230 or phase is self.last_in_lane[phase["lane"]]:
            self._label(group, _phase_label(phase), x0, top + BAR_H + 13)
        for y in phase["yields"]:
            text = f"{_short(y['component'])} gave {_mb(y['mb'])} of VRAM for {', '.join(map(_short, y['for_whom']))}"
            self._marker(group, y["at_s"], top, "yield", text)
            self._label(group, text, self.x(y["at_s"]), top + BAR_H + 26, COLORS["yield"])
        for r in phase["retries"]:
            self._marker(group, r["at_s"], top, "retry", f"out-of-memory retry {r['attempt']} ({r['error']})")
        for f in phase["fallbacks"]:
            self._marker(group, f["at_s"], top, "fallback", f"fallback: {f['what']}")

    def _label(self, group: ET.Element, text: str, x: float, y: float, color: str = COLORS["text"]) -> None:
        """Text starting at `x`, or ending there where it would run off the chart."""
        if x + CHAR_W * len(text) <= WIDTH - RIGHT:
            _el(group, "text", text, x=x + 3, y=y, fill=color)
        else:
            _el(group, "text", text, x=x, y=y, fill=color, text_anchor="end")

    def _marker(self, group: ET.Element, at_s: float, top: float, kind: str, text: str) -> None:
        x = self.x(at_s)
        mark = _tip(_el(group, "g", class_=kind), text)
        _el(mark, "line", x1=x, x2=x, y1=top - 2, y2=top + BAR_H + 2, stroke=COLORS[kind], stroke_width=2,
            stroke_dasharray="3,2" if kind != "yield" else "none")
        _el(mark, "path", d=f"M{x - 5},{top - 10} L{x + 5},{top - 10} L{x},{top - 2} Z", fill=COLORS[kind])

    def _legend(self) -> None:
        y = self.height - LEGEND_H / 2
        x = 8.0
        for key, label in LEGEND:
            color = COLORS[key][0] if isinstance(COLORS[key], tuple) else COLORS[key]
            _el(self.root, "rect", x=x, y=y - 9, width=12, height=12, fill=color)
            _el(self.root, "text", label, x=x + 16, y=y + 1, fill=COLORS["text"])
            x += 22 + CHAR_W * len(label)
        _el(self.root, "text", f"a lane's height: {_mb(self.scale)}", x=WIDTH - RIGHT, y=y + 1,
            fill=COLORS["text"], text_anchor="end")


def svg(report: Mapping[str, Any]) -> str:
    """One request report's timeline as an SVG document."""
    return ET.tostring(_Chart(report).draw(), encoding="unicode", xml_declaration=True)


def write_svg(report: Mapping[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(svg(report), encoding="utf-8")
    return path
