"""One sweep against another: each row's scores and held-out loss beside their change.

A researcher runs a table, changes one thing (a config field), runs it again into a workdir of
its own, then asks what the change did: `t5x-lite report NEW --against OLD` (`report.report(
new, against=old)`). Rows are matched by name (label and objective); each cell of the
comparison is this sweep's mean over seeds and its difference from the other sweep's mean
(this minus that), for every score column both sweeps have, the row average, and the held-out
pre-training loss where both scored the same examples (the records' `held_out_examples`: a
change of the objective's settings changes them, and then the losses do not compare).

Where both cells have scores but of different seeds (one sweep ran more, or lost one), the
cell compares the two means over the seeds both ran, marked `[k shared seeds]`: a seed only
one side has would otherwise show as a change. Cells that share no seed compare their whole
means (independent runs).

A difference is told apart from the seed noise in one of two ways. Where both cells have
two or more seeds in common, by a paired t-test over those seeds, p < `P_VALUE` two-sided: a seed
draws the same data order, held-out text and noise in both sweeps, so its two runs share that
part of the noise, as the report's paired held-out losses do (with 2 seeds the test needs the
two differences nearly equal; a fixed "twice the deviation of the differences" would mark one
change in five that does nothing). Otherwise by the report's bold rule: a difference beyond
twice the column's spread over seeds (`report_table.pooled_std`), pooled over every cell of
both sweeps. With one seed in each there is no spread, and no difference is judged. Each cell
is judged alone: of 20 paired cells of a change that does nothing, about one is marked by
chance.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import math
import statistics
from typing import Callable

import scipy.stats

from t5x_lite.report_render import aligned, markdown_table
from t5x_lite.report_table import Cell, Row, Table, pooled_std, row_name

AVERAGE = "Average"
HELD_OUT = "Held-out loss"
P_VALUE = 0.05  # a paired difference is told apart below this two-sided p-value


@dataclasses.dataclass(frozen=True)
class Change:
    """One cell: this sweep's mean, the other sweep's, and whether their difference is
    told apart from the seed noise (None: nothing to judge by, or a side without a number).
    paired: the seeds a paired t-test ran over, with its two-sided `p_value` (0 and None: the
    column's pooled `spread` judged, by twice it). shared_seeds: where the two cells ran
    different seeds, the number both ran, over which `ours` and `theirs` are taken (0: the
    cells' own means)."""

    ours: float | None
    theirs: float | None
    told_apart: bool | None
    paired: int = 0
    p_value: float | None = None
    spread: float | None = None
    shared_seeds: int = 0

    @property
    def difference(self) -> float | None:
        return None if None in (self.ours, self.theirs) else self.ours - self.theirs


@dataclasses.dataclass(frozen=True)
class Comparison:
    """This sweep's rows against `other`'s (a workdir): per row name, a `Change` per column."""

    other: str
    # The shared score columns, then AVERAGE (over those) and, with losses, HELD_OUT.
    columns: tuple[str, ...]
    rows: dict[str, dict[str, Change]]  # row name -> column -> change, in this table's order
    spreads: dict[str, float]  # column -> the spread over seeds its judgements use
    only_ours: tuple[str, ...]  # rows this sweep has and the other lacks
    only_theirs: tuple[str, ...]
    columns_not_shared: tuple[str, ...]  # score columns one sweep has and the other lacks
    held_out_not_comparable: tuple[str, ...]  # rows whose held-out examples differ
    # Columns both have, made of other tasks (not compared), each with its two task lists.
    columns_of_other_tasks: tuple[str, ...] = ()
    sweeps_differ: str | None = None  # the two experiments / presets, where they differ


def _mean(cell: Cell | None) -> float | None:
    """A cell's mean over seeds; None for a cell without a score (failed, missing, none)."""
    return cell.mean if cell is not None and cell.status == "ok" else None


def _held_out_mean(row: Row) -> float | None:
    return _mean(row.held_out)


def _average(means: list[float | None]) -> float | None:
    """The mean of a row's compared means over the shared columns (a sweep with more tasks
    than the other averages only those), or None unless each has one."""
    return None if None in means else sum(means) / len(means)


def paired_p_value(differences: list[float]) -> float:
    """The two-sided p-value of a paired t-test of per-seed differences (two or more) against
    no difference: t = mean / (deviation / sqrt(n)) with n - 1 degrees of freedom; equal
    differences give 0 (1 when all are 0)."""
    mean, deviation = statistics.mean(differences), statistics.stdev(differences)
    if deviation == 0:
        return 1.0 if mean == 0 else 0.0
    t = mean / (deviation / math.sqrt(len(differences)))
    return float(2 * scipy.stats.t.sf(abs(t), len(differences) - 1))


def _change(mine: Cell, other: Cell, pooled: float) -> Change:
    """Two cells of one row and column -> their change over the seeds both ran (all of each
    where they share none), judged by a paired t-test over two or more shared seeds, else by
    twice `pooled`."""
    change = Change(_mean(mine), _mean(other), None)
    if change.difference is None:
        return change
    ours, theirs = dict(mine.per_seed), dict(other.per_seed)
    shared = sorted(ours.keys() & theirs.keys())
    if shared and ours.keys() != theirs.keys():
        change = Change(statistics.mean(ours[seed] for seed in shared),
                        statistics.mean(theirs[seed] for seed in shared), None,
                        shared_seeds=len(shared))
    if len(shared) > 1:
        p_value = paired_p_value([ours[seed] - theirs[seed] for seed in shared])
        return dataclasses.replace(change, told_apart=p_value < P_VALUE, paired=len(shared),
                                   p_value=p_value)
    if pooled > 0:
        return dataclasses.replace(change, told_apart=abs(change.difference) > 2 * pooled,
                                   spread=pooled)
    return change


def compare(table: Table, other: Table, other_name: str) -> Comparison:
    """`table` against `other` (the sweep in workdir `other_name`). Raises `ValueError` when
    they share no row or no score column: they are not the same table."""
    mine = {row_name(row.label, row.objective): row for row in table.rows}
    theirs = {row_name(row.label, row.objective): row for row in other.rows}
    names = [name for name in mine if name in theirs]
    named_in_both = [column for column in table.columns if column in other.columns]
    # A column compares only where both sweeps made it of the same tasks (GLUE of 9 tasks
    # against GLUE of 2 differs by the task mix alone, and was starred as a change).
    columns = [column for column in named_in_both
               if table.columns[column] == other.columns[column]]
    if not names or not columns:
        raise ValueError(
            f"{other_name} shares no {'row' if not names else 'score column'} with this sweep "
            f"({table.experiment}: rows {', '.join(mine)}; columns {', '.join(table.columns)}); "
            "compare a sweep with one of the same experiment and tasks")
    rows: dict[str, dict[str, Change]] = {name: {} for name in names}
    both = (*table.rows, *other.rows)
    spreads = {}
    for column in columns:
        spreads[column] = pooled_std(row.cells[column] for row in both)
        for name in names:
            rows[name][column] = _change(mine[name].cells[column], theirs[name].cells[column],
                                         spreads[column])
    for name in names:
        changes = [rows[name][column] for column in columns]
        rows[name][AVERAGE] = Change(_average([change.ours for change in changes]),
                                     _average([change.theirs for change in changes]), None,
                                     shared_seeds=max(change.shared_seeds for change in changes))
    # Comparable: the same examples, known by their fingerprints (records made before the
    # fingerprints existed say nothing of which examples they scored).
    comparable = [n for n in names if mine[n].held_out_examples
                  and all(examples for _, examples in mine[n].held_out_examples)
                  and mine[n].held_out_examples == theirs[n].held_out_examples
                  and None not in (_held_out_mean(mine[n]), _held_out_mean(theirs[n]))]
    with_losses = any(_held_out_mean(mine[n]) is not None for n in names)
    if with_losses:
        spreads[HELD_OUT] = pooled_std(row.held_out for row in both if row.held_out)
        for name in names:
            rows[name][HELD_OUT] = (
                _change(mine[name].held_out, theirs[name].held_out, spreads[HELD_OUT])
                if name in comparable else Change(_held_out_mean(mine[name]), None, None))
    return Comparison(
        other=other_name,
        columns=(*columns, AVERAGE, *([HELD_OUT] if with_losses else [])),
        rows=rows, spreads=spreads,
        only_ours=tuple(n for n in mine if n not in theirs),
        only_theirs=tuple(n for n in theirs if n not in mine),
        columns_not_shared=tuple(c for c in [*table.columns, *other.columns]
                                 if c not in named_in_both),
        columns_of_other_tasks=tuple(
            f"{c} (here {' + '.join(table.columns[c])}; there {' + '.join(other.columns[c])})"
            for c in named_in_both if c not in columns),
        sweeps_differ=(None if (table.experiment, table.preset) == (other.experiment,
                                                                    other.preset)
                       else f"this sweep is {table.experiment} --preset {table.preset}, "
                            f"{other_name} {other.experiment} --preset {other.preset}"),
        held_out_not_comparable=tuple(n for n in names if with_losses and n not in comparable
                                      and _held_out_mean(mine[n]) is not None))


def _cell(change: Change, told_apart: Callable[[str], str]) -> str:
    """'52.56 (-4.39)': this sweep's mean and its difference from the other's."""
    if change.ours is None:
        return "–"
    if change.difference is None:
        return f"{change.ours:.2f} (–)"
    text = f"{change.ours:.2f} ({change.difference:+.2f})"
    text = told_apart(text) if change.told_apart else text
    return f"{text} [{change.shared_seeds} shared seeds]" if change.shared_seeds else text


def _grid(comparison: Comparison, told_apart: Callable[[str], str]) -> list[list[str]]:
    return [["Row", *comparison.columns],
            *([name, *(_cell(changes[column], told_apart) for column in comparison.columns)]
              for name, changes in comparison.rows.items())]


def _notes(comparison: Comparison, mark: str) -> list[str]:
    spreads = ", ".join(f"{column} {spread:.2f}" for column, spread in comparison.spreads.items())
    notes = [f"Each cell: this sweep's mean over seeds and, in parentheses, this minus "
             f"{comparison.other}'s. {mark}: told apart from the seed noise, by a paired t-test "
             f"(p < {P_VALUE}, two-sided) where both sweeps ran two or more seeds in common, else "
             "by a difference beyond twice the column's spread over seeds pooled over both "
             f"sweeps ({spreads}); with one seed nothing is judged. Each cell is judged alone. "
             f"{AVERAGE}: the mean of the row's columns above, not judged."]
    if any(change.shared_seeds for changes in comparison.rows.values()
           for change in changes.values()):
        notes.append("[k shared seeds]: the two sweeps ran different seeds for this cell; both "
                     "means are over the k seeds both ran (an Average, over its columns' "
                     "shared seeds).")
    if HELD_OUT in comparison.columns:
        notes.append(f"{HELD_OUT}: compared only where both sweeps scored the same examples"
                     + (f"; not comparable (other examples: the objective's settings or the "
                        f"seeds differ): {', '.join(comparison.held_out_not_comparable)}."
                        if comparison.held_out_not_comparable else "."))
    for label, names in (("Rows only in this sweep", comparison.only_ours),
                         (f"Rows only in {comparison.other}", comparison.only_theirs),
                         ("Columns not in both sweeps", comparison.columns_not_shared),
                         ("Columns made of other tasks in the two sweeps, not compared",
                          comparison.columns_of_other_tasks)):
        if names:
            notes.append(f"{label}: {', '.join(names)}.")
    if comparison.sweeps_differ:
        notes.append(f"Other sweeps: {comparison.sweeps_differ}.")
    return notes


def title(comparison: Comparison) -> str:
    return f"Against {comparison.other}"


def to_text(comparison: Comparison) -> str:
    """The terminal rendering: aligned columns, differences told apart marked with '*'."""
    return "\n".join([title(comparison), "", *aligned(_grid(comparison, "{}*".format)), "",
                      *_notes(comparison, "*")]) + "\n"


def to_markdown(comparison: Comparison) -> str:
    """comparison.md: the same, differences told apart in bold."""
    return "\n".join([f"## {title(comparison)}", "",
                      *markdown_table(_grid(comparison, "**{}**".format),
                                      len(comparison.columns)), "",
                      *_notes(comparison, "Bold")]) + "\n"


def to_csv(comparison: Comparison) -> str:
    """comparison.csv: a line per (row, column) with both means, the difference, whether it
    is told apart (empty where not judged), the seeds a paired t-test ran over (0: none) and
    its p-value, or the pooled spread that judged it, and the shared seeds the means are over
    where the sweeps ran different ones (0: each cell's own)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["row", "column", "this", "other", "difference", "told_apart",
                     "paired_seeds", "p_value", "spread", "shared_seeds"])
    for name, changes in comparison.rows.items():
        for column, change in changes.items():
            writer.writerow([name, column, *("" if v is None else v for v in (
                change.ours, change.theirs, change.difference, change.told_apart,
                change.paired, change.p_value, change.spread, change.shared_seeds))])
    return out.getvalue()
