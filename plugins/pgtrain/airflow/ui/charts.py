"""The models page's training curves: inline SVG drawn on the server, one chart per metric, so that figures of
different scales (an RMSE near 200, an R² near 0.8) never share an axis. No script, nothing fetched; colors come
from the page's stylesheet (classes ``c0``..``c5``), so the charts follow its light and dark themes.

A chart shows one metric for one or more runs (the versions compared): the loss chart ``train_loss`` and
``val_loss``, every other validation figure with its ``train_`` counterpart when one was recorded (the same
quantity, the same scale). Training series are dashed. A vertical marker shows the best epoch (whose parameters
the version kept) when early stopping recorded one. The y axis leaves out a first epoch far from the rest
(``y_range``), so that the curve after it is not drawn flat.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pgtrain.airflow.ui.html import e as _e
from pgtrain.airflow.ui.html import number as _figure
from pgtrain.config.metrics import METRICS

PALETTE_SIZE = 6  # classes c0..c5 in style.css
WIDTH, HEIGHT = 460, 240  # the viewBox: the aspect ratio and the text's scale; the SVG fills its panel's width
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 34
LOSS = "loss"

Run = tuple[str, Sequence[Mapping[str, Any]]]  # (its label, "" for a lone run; its epochs, oldest first)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def chart_groups(runs: Sequence[Run]) -> list[tuple[str, list[str]]]:
    """(chart name, the epoch keys it draws), in page order: the loss, then the registry's validation metrics in
    its order, then any other ``val_*`` figure; each with its ``train_`` counterpart first when recorded."""
    recorded: set[str] = set()
    for _, epochs in runs:
        recorded.update(k for ep in epochs for k, v in ep.items() if _numeric(v))
    groups = [(LOSS, [k for k in ("train_loss", "val_loss") if k in recorded])]
    validation = ([k for k in METRICS if k in recorded and k != "val_loss"]
                  + sorted(k for k in recorded if k.startswith("val_") and k not in METRICS))
    for key in validation:
        train = "train_" + key.removeprefix("val_")
        groups.append((key, [train, key] if train in recorded else [key]))
    return [(name, keys) for name, keys in groups if keys]


def title(name: str) -> str:
    """What a chart is called: the metric's label and which way is better."""
    if name == LOSS:
        return "loss (lower is better)"
    if name in METRICS:
        return f"{METRICS[name].label} ({METRICS[name].better})"
    return name.removeprefix("val_").replace("_", " ")


def metric_charts(runs: Sequence[Run]) -> str:
    """Every chart of ``runs`` (one figure each), or a line saying there is nothing to draw."""
    groups = chart_groups(runs)
    if not groups:
        return "<p class=\"muted\">No epochs recorded.</p>"
    charts = "".join(f'<figure class="chart-card"><figcaption>{_e(title(name))}</figcaption>'
                     f"{line_chart(name, runs, keys)}</figure>" for name, keys in groups)
    return f'<div class="charts">{charts}</div>'


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi], about ``count`` of them."""
    scale = max(1.0, abs(lo), abs(hi))
    if hi - lo <= 1e-9 * scale:
        # Equal, or apart by float noise (an ulp between epochs): a step that small would not move a float (the
        # loop below would never end) or would round to no step at all (an axis of zero height).
        lo, hi = lo - 0.5 * scale, hi + 0.5 * scale
    raw = (hi - lo) / max(count - 1, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value < hi + step * 0.999:
        ticks.append(round(value, 12))
        value += step
    return ticks


def y_range(series: Sequence[Sequence[float]]) -> tuple[float, float]:
    """The values a chart's y axis covers (each sequence one series' values, oldest epoch first): all of them but a
    first epoch far from the rest. The first epoch of a series of 3 or more is left out of the range when it lies
    further outside the later epochs' range than twice that range's width (the later epochs would get less than a
    third of the height): a loss of 2.3 before epochs between 0.05 and 0.3 would set the axis alone and flatten
    every later epoch into a line along the bottom. Such a point is drawn on the plot's edge, hollow (``clipped``),
    its true value in its tooltip and the epochs table. Not a log scale: R² and other figures go negative, and
    differences between versions read as they are."""
    later = [y for ys in series for y in (ys[1:] if len(ys) >= 3 else ys)]
    lo, hi = min(later), max(later)
    span = hi - lo
    for ys in series:
        if len(ys) >= 3 and (span == 0 or lo - 2 * span <= ys[0] <= hi + 2 * span):
            lo, hi = min(lo, ys[0]), max(hi, ys[0])
    return lo, hi


def best_epoch(epochs: Sequence[Mapping[str, Any]]) -> int | None:
    """The epoch whose parameters the run kept when early stopping chose one (``best_epoch`` of the last epoch's
    figures, the best so far), else None: without early stopping the last epoch's are kept."""
    best = epochs[-1].get("best_epoch") if epochs else None
    return best if isinstance(best, int) and not isinstance(best, bool) else None


def line_chart(name: str, runs: Sequence[Run], keys: Sequence[str]) -> str:
    """One metric's SVG chart: a series (``g.series``, ``data-series`` the key, ``data-version`` the run's label)
    per run and key, one circle (class "point") per epoch with a finite value, a y axis of its own (``y_range``),
    and a vertical marker (``g.best-epoch``) at each run's best epoch. The SVG scales to its panel's width (a
    viewBox, no fixed size)."""
    series = [(label, key, [(ep["epoch"], float(ep[key])) for ep in epochs if _numeric(ep.get(key))])
              for label, epochs in runs for key in keys]
    series = [s for s in series if s[2]]
    if not series:
        return ""
    ticks = nice_ticks(*y_range([[y for _, y in points] for *_, points in series]))
    y_lo, y_hi = ticks[0], ticks[-1]
    epochs = [x for *_, points in series for x, _ in points]
    x_lo, x_hi = min(epochs), max(max(epochs), min(epochs) + 1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x_lo) / (x_hi - x_lo) * plot_w

    def sy(y: float) -> float:
        return TOP + (y_hi - min(max(y, y_lo), y_hi)) / (y_hi - y_lo) * plot_h

    parts = [f'<svg class="chart" data-chart="{_e(name)}" data-y-min="{_figure(y_lo)}" data-y-max="{_figure(y_hi)}" '
             f'xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="xMidYMid meet" '
             f'role="img" aria-label="{_e(title(name))} per epoch">']
    for tick in ticks:
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{sy(tick):.1f}" y2="{sy(tick):.1f}"/>'
                     f'<text class="tick" x="{LEFT - 6}" y="{sy(tick) + 4:.1f}" text-anchor="end">'
                     f"{_figure(tick)}</text>")
    for x in _epoch_ticks(x_lo, max(epochs)):
        parts.append(f'<text class="tick" x="{sx(x):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{_e(x)}</text>')
    parts.append(f'<text class="axis" x="{LEFT + plot_w / 2}" y="{HEIGHT - 3}" text-anchor="middle">epoch</text>'
                 f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/>')
    styles = _styles(series, keys)
    labels = list(dict.fromkeys(label for label, *_ in series))
    for label, epochs_of in runs:
        best = best_epoch(epochs_of)
        if label in labels and best is not None and x_lo <= best <= max(epochs):
            color = f"c{labels.index(label) % PALETTE_SIZE}" if len(labels) > 1 else "c-best"
            # the label inside the plot: left of a marker near the right edge, one line lower per run
            right = sx(best) > LEFT + plot_w * 0.8
            text_x, anchor = (sx(best) - 3, "end") if right else (sx(best) + 3, "start")
            parts.append(f'<g class="best-epoch {color}" data-epoch="{_e(best)}" data-version="{_e(label)}">'
                         f'<line x1="{sx(best):.1f}" x2="{sx(best):.1f}" y1="{TOP}" y2="{TOP + plot_h}"/>'
                         f'<text x="{text_x:.1f}" y="{TOP + 11 + 11 * labels.index(label)}" text-anchor="{anchor}">'
                         f'{_e(f"{label} best".strip())}</text>'
                         f"<title>{_e(f'{label} best epoch'.strip())} {_e(best)}: its parameters are the "
                         "version's</title></g>")
    clipped = 0
    for (label, key, points), style in zip(series, styles, strict=True):
        name_of = f"{label} {key}".strip()
        parts.append(f'<g class="series {style}" data-series="{_e(key)}" data-version="{_e(label)}">')
        if len(points) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
            parts.append(f'<polyline points="{path}"/>')
        for x, y in points:
            off = not y_lo <= y <= y_hi
            clipped += off
            parts.append(f'<circle class="point{" clipped" if off else ""}" data-epoch="{_e(x)}" cx="{sx(x):.1f}" '
                         f'cy="{sy(y):.1f}" r="3"><title>{_e(name_of)}, epoch {_e(x)}: {_figure(y)}'
                         f'{" (off the scale)" if off else ""}</title></circle>')
        parts.append("</g>")
    parts.append("</svg>")
    legend = "".join(f'<li class="{style}"><span class="swatch"></span>{_e(f"{label} {key}".strip())}</li>'
                     for (label, key, _), style in zip(series, styles, strict=True))
    if clipped:
        legend += '<li class="clipped-note">hollow: off the scale, drawn on its edge (value in its tooltip)</li>'
    return "".join(parts) + f'<ul class="legend">{legend}</ul>'


def _styles(series: Sequence[tuple[str, str, Any]], keys: Sequence[str]) -> list[str]:
    """Each series' classes: its color (the run's when several runs share the chart, else the key's) and whether it
    is a training or a validation figure (dashed or solid)."""
    labels = list(dict.fromkeys(label for label, *_ in series))
    return [f"c{(labels.index(label) if len(labels) > 1 else keys.index(key)) % PALETTE_SIZE} "
            + ("train" if key.startswith("train_") else "val") for label, key, _ in series]


def _epoch_ticks(first: int, last: int, most: int = 8) -> list[int]:
    step = max(1, math.ceil((last - first) / (most - 1)))
    return list(range(first, last + 1, step))

