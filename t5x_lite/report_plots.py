"""A sweep's report as PNG plots, drawn off screen (no pyplot, no display: it works over SSH).

`write_plots` draws the loss curves the records hold (training and held-out, one line per table
row, one panel per objective) and a bar chart per score column with the paper's values beside
ours; `t5x_lite.report` calls it after the text renderings (`t5x_lite.report_render`).
"""
from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from t5x_lite.report_table import Table, row_name
from t5x_lite.results import latest_records, write_atomically

if TYPE_CHECKING:  # imported when plotting: matplotlib takes a second to import
    from matplotlib.figure import Figure


def _curves_figure(records: Sequence[dict], field: str, title: str) -> Figure | None:
    """The [[step, loss], ...] curves in the records' `field`, one line per table row: the mean
    over its seeds at the steps they all reached, their range shaded. One panel per objective
    label (Table 2's denoising and LM losses lie far apart; a table without objective labels
    has one panel), so that a sweep of many seeds stays readable. None when no record has a
    curve."""
    from matplotlib.figure import Figure  # see write_plots

    curves: dict[tuple[str, str | None], dict[int, dict[int, float]]] = {}  # row -> seed -> curve
    for r in latest_records(records):
        if r.get(field):  # a point's records (one per task) share its curve
            curves.setdefault((r["row"], r.get("objective")), {}).setdefault(
                r["seed"], {step: loss for step, loss in r[field]})
    if not curves:
        return None
    objectives = list(dict.fromkeys(objective for _, objective in curves))
    figure = Figure(figsize=(7.5, 0.8 + 3.2 * len(objectives)), layout="constrained")
    for axes, objective in zip(figure.subplots(len(objectives), 1, squeeze=False)[:, 0],
                               objectives):
        for (label, row_objective), by_seed in curves.items():
            steps = sorted(set.intersection(*(set(curve) for curve in by_seed.values())))
            if row_objective != objective or not steps:
                continue
            losses = np.array([[curve[step] for step in steps] for curve in by_seed.values()])
            (line,) = axes.plot(steps, losses.mean(axis=0), label=label,
                                marker="." if len(steps) < 20 else None)
            if len(by_seed) > 1:
                axes.fill_between(steps, losses.min(axis=0), losses.max(axis=0),
                                  color=line.get_color(), alpha=0.2, linewidth=0)
        axes.set(xlabel="pre-training step", ylabel="loss", title=objective or "")
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1, 1))
    seeds = sorted({seed for by_seed in curves.values() for seed in by_seed})
    figure.suptitle(title + (f"\nmean of seeds {', '.join(map(str, seeds))}; shaded: their range"
                             if len(seeds) > 1 else ""))
    return figure


def write_plots(table: Table, records: Sequence[dict], out_dir: str) -> list[str]:
    """PNG plots: `pretrain_loss.png`, each row's pre-training loss curve (`_curves_figure`),
    `held_out_loss.png`, its held-out losses at each evaluation (when recorded,
    `t5x_lite.held_out`), and `bars_<column>.png` per column, our scores as bars (spread over
    seeds as error bars) and the paper's as black diamonds. Returns the paths written."""
    # Imported here: matplotlib takes a second to import, which the table-only readers skip.
    from matplotlib.figure import Figure  # no pyplot: no global state, no display, over SSH too

    paths = []
    curves = {"pretrain_loss.png": ("pretrain_curve", "Pre-training loss"),
              "held_out_loss.png": ("held_out_curve", "Held-out pre-training loss")}
    for file_name, (field, title) in curves.items():
        figure = _curves_figure(records, field,
                                f"{title}: {table.experiment}, preset {table.preset}")
        if figure is not None:
            paths.append(os.path.join(out_dir, file_name))
            _save(figure, paths[-1])
    x = np.arange(len(table.rows))
    names = [row_name(row.label, row.objective) for row in table.rows]
    for column in table.columns:
        cells = [row.cells[column] for row in table.rows]
        figure = Figure(figsize=(3.5 + 0.9 * len(cells), 4.5), layout="constrained")
        axes = figure.add_subplot()
        axes.bar(x, [c.mean or 0.0 for c in cells], yerr=[c.std for c in cells],
                 color=["tab:blue" if c.bold else "tab:gray" for c in cells],
                 label="ours (blue: bold)")
        published = [(i, c.paper) for i, c in enumerate(cells) if c.paper is not None]
        if published:
            axes.scatter(*zip(*published), marker="D", color="black", zorder=3, label="paper")
        for i, cell in enumerate(cells):
            if cell.status != "ok":
                axes.text(i, 0, cell.status if cell.status in ("failed", "undefined", "n/a")
                          else "not run",
                          rotation=90, ha="center", va="bottom")
        axes.set_xticks(x, names, rotation=30, ha="right")
        axes.set(ylabel=column, title=f"{column}: {table.experiment}, preset {table.preset}")
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1, 1))
        paths.append(os.path.join(out_dir, f"bars_{re.sub(r'[^A-Za-z0-9_.-]', '_', column)}.png"))
        _save(figure, paths[-1])
    return paths


def _save(figure: Any, path: str) -> None:
    """Write `figure` as the PNG `path` whole or not at all (`results.write_atomically`, as the
    report's text files): an interrupted report leaves the old plot, never half a new one."""
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=120)
    write_atomically(Path(path), png.getvalue())
