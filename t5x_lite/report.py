"""`t5x-lite report DIR`: a sweep's results.jsonl as the paper's table, beside the paper's numbers.

`report(workdir)` reads `workdir/results.jsonl` (one record per grid point and task, written by
`t5x_lite.sweep`), builds a `Table` in the layout of the paper's table for that experiment
(`t5x_lite.report_table`, whose docstring gives the paper's conventions the table follows)
and writes it to `workdir/report/` as Markdown, CSV and LaTeX (`t5x_lite.report_render`), with
PNG plots (`t5x_lite.report_plots`). `Report.text` is the terminal rendering. With `against`
(another sweep's workdir), the sweep is also compared with that one row by row
(`t5x_lite.report_compare`): what changing one thing did.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from t5x_lite import report_compare, run_folders
from t5x_lite.config import ConfigError
from t5x_lite.report_plots import write_plots
from t5x_lite.report_render import (compute_csv, findings_csv, held_out_differences_csv, to_csv,
                                    to_latex, to_markdown, to_text, zero_shot_csv)
from t5x_lite.report_table import Table, build_table, read_results
from t5x_lite.results import results_path, write_atomically


def _sweep_records(workdir: str) -> list[dict]:
    """The usable records of the sweep in `workdir` (`read_results`); a folder of a training
    run is named as such, and a sweep that has started but recorded nothing yet too."""
    held = run_folders.held_kind(workdir)
    if held is not None and held[0] != run_folders.SWEEP:
        raise FileNotFoundError(f"{workdir} holds {run_folders.DESCRIBED[held[0]]} "
                                f"({held[1]}), not a sweep; `t5x-lite eval --checkpoint "
                                f"{workdir}` scores it")
    path = results_path(workdir)
    if held is not None and not path.exists():
        raise FileNotFoundError(f"the sweep in {workdir} has recorded no point yet (no "
                                f"{path.name}); report it once its first point has finished")
    return read_results(str(path))


@dataclasses.dataclass(frozen=True)
class Report:
    """What `report` made of a sweep: the table, its terminal text and the files written."""

    table: Table
    text: str  # the terminal rendering, with a line naming what was written
    files: tuple[str, ...]  # every file written
    comparison: report_compare.Comparison | None = None  # against another sweep, when asked


def report(workdir: str, *, out_dir: str | None = None, against: str | None = None) -> Report:
    """Reads `workdir/results.jsonl` and writes table.md, table.csv, table.tex, findings.csv
    (compute.csv too for a compute-matched sweep, zero_shot.csv for one with zero-shot
    scores, held_out_differences.csv for one with held-out losses of several seeds to pair)
    and the PNG plots to `out_dir` (default `workdir/report`). Nothing interactive
    opens: the plots are drawn off screen. `against`: another sweep's workdir, read before
    anything is written; the comparison with it goes to comparison.md and comparison.csv and
    ends the text."""
    if against is not None and os.path.realpath(against) == os.path.realpath(workdir):
        raise ConfigError(f"--against {against} is the reported sweep's own workdir: compare it "
                          "with another sweep's")
    records = _sweep_records(workdir)
    table = build_table(records)
    comparison = None
    if against is not None:
        comparison = report_compare.compare(table, build_table(_sweep_records(against)), against)
    out_dir = out_dir or os.path.join(workdir, "report")
    os.makedirs(out_dir, exist_ok=True)
    files = []
    renders = [("table.md", to_markdown), ("table.csv", to_csv), ("table.tex", to_latex),
               ("findings.csv", findings_csv)]
    if table.compute:
        renders.append(("compute.csv", compute_csv))
    if table.zero_shot:
        renders.append(("zero_shot.csv", zero_shot_csv))
    if table.held_out_differences:
        renders.append(("held_out_differences.csv", held_out_differences_csv))
    if comparison is not None:
        renders += [("comparison.md", lambda _: report_compare.to_markdown(comparison)),
                    ("comparison.csv", lambda _: report_compare.to_csv(comparison))]
    for name, render in renders:
        files.append(os.path.join(out_dir, name))
        write_atomically(Path(files[-1]), render(table))  # never half a file, if interrupted
    files += write_plots(table, records, out_dir)
    written = f"Wrote {len(files)} files to {out_dir}."
    against_text = f"\n{report_compare.to_text(comparison)}" if comparison else ""
    return Report(table, f"{to_text(table)}{against_text}\n{written}\n", tuple(files),
                  comparison)
