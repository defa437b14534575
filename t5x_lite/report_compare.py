"""One sweep against another: each row's scores and held-out loss beside their change.

A researcher runs a table, changes one thing (a config field), runs it again into a workdir of
its own, then asks what the change did: `t5x-lite report NEW --against OLD` (`report.report(
new, against=old)`). Rows are matched by name (label and objective); each cell of the
comparison is this sweep's mean over seeds and its difference from the other sweep's mean
(this minus that), for every score column both sweeps have, the row average, and the held-out
pre-training loss where both scored the same examples (the records' `held_out_examples`: a
change of the objective's settings changes them, and then the losses do not compare).

A difference is told apart from the seed noise, as the report's bold rule and findings judge
scores, when it exceeds two standard deviations: twice the column's spread over seeds
(`report_table.pooled_std`), pooled over the cells of both sweeps. With one seed in each
there is no spread, and no difference is judged.
"""
from __future__ import annotations

import csv
import dataclasses
import io
from typing import Callable

from t5x_lite.report_render import aligned, markdown_table
from t5x_lite.report_table import Cell, Row, Table, pooled_std, row_name

AVERAGE = "Average"
HELD_OUT = "Held-out loss"


@dataclasses.dataclass(frozen=True)
class Change:
    """One cell: this sweep's mean, the other sweep's, and whether their difference exceeds
    twice the column's spread (None: no spread to judge by, or a side without a number)."""

    ours: float | None
    theirs: float | None
    told_apart: bool | None

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


def _mean(cell: Cell | None) -> float | None:
    """A cell's mean over seeds; None for a cell without a score (failed, missing, none)."""
    return cell.mean if cell is not None and cell.status == "ok" else None


def _held_out_mean(row: Row) -> float | None:
    return _mean(row.held_out)


def _average(row: Row, columns: list[str]) -> float | None:
    """The mean of the row's scores over the shared `columns` (a sweep with more tasks than
    the other averages only those), or None unless each has one."""
    means = [_mean(row.cells[column]) for column in columns]
    return None if None in means else sum(means) / len(means)


def _changes(ours: list[Cell], theirs: list[Cell], spread: float) -> list[Change]:
    """A column's cells of matched rows -> their changes, judged by `spread`."""
    changes = []
    for mine, other in zip(ours, theirs):
        change = Change(_mean(mine), _mean(other), None)
        if spread > 0 and change.difference is not None:
            change = dataclasses.replace(change, told_apart=abs(change.difference) > 2 * spread)
        changes.append(change)
    return changes


def compare(table: Table, other: Table, other_name: str) -> Comparison:
    """`table` against `other` (the sweep in workdir `other_name`). Raises `ValueError` when
    they share no row or no score column: they are not the same table."""
    mine = {row_name(row.label, row.objective): row for row in table.rows}
    theirs = {row_name(row.label, row.objective): row for row in other.rows}
    names = [name for name in mine if name in theirs]
    columns = [column for column in table.columns if column in other.columns]
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
        changes = _changes([mine[n].cells[column] for n in names],
                           [theirs[n].cells[column] for n in names], spreads[column])
        for name, change in zip(names, changes):
            rows[name][column] = change
    for name in names:
        rows[name][AVERAGE] = Change(_average(mine[name], columns), _average(theirs[name], columns),
                                     None)
    comparable = [n for n in names if mine[n].held_out_examples
                  and mine[n].held_out_examples == theirs[n].held_out_examples
                  and None not in (_held_out_mean(mine[n]), _held_out_mean(theirs[n]))]
    with_losses = any(_held_out_mean(mine[n]) is not None for n in names)
    if with_losses:
        spreads[HELD_OUT] = pooled_std(row.held_out for row in both if row.held_out)
        changes = _changes([mine[n].held_out for n in comparable],
                           [theirs[n].held_out for n in comparable], spreads[HELD_OUT])
        by_name = dict(zip(comparable, changes))
        for name in names:
            rows[name][HELD_OUT] = by_name.get(name, Change(_held_out_mean(mine[name]), None, None))
    return Comparison(
        other=other_name,
        columns=(*columns, AVERAGE, *([HELD_OUT] if with_losses else [])),
        rows=rows, spreads=spreads,
        only_ours=tuple(n for n in mine if n not in theirs),
        only_theirs=tuple(n for n in theirs if n not in mine),
        columns_not_shared=tuple(c for c in [*table.columns, *other.columns] if c not in columns),
        held_out_not_comparable=tuple(n for n in names if with_losses and n not in comparable
                                      and _held_out_mean(mine[n]) is not None))


def _cell(change: Change, told_apart: Callable[[str], str]) -> str:
    """'52.56 (-4.39)': this sweep's mean and its difference from the other's."""
    if change.ours is None:
        return "–"
    if change.difference is None:
        return f"{change.ours:.2f} (–)"
    text = f"{change.ours:.2f} ({change.difference:+.2f})"
    return told_apart(text) if change.told_apart else text


def _grid(comparison: Comparison, told_apart: Callable[[str], str]) -> list[list[str]]:
    return [["Row", *comparison.columns],
            *([name, *(_cell(changes[column], told_apart) for column in comparison.columns)]
              for name, changes in comparison.rows.items())]


def _notes(comparison: Comparison, mark: str) -> list[str]:
    spreads = ", ".join(f"{column} {spread:.2f}" for column, spread in comparison.spreads.items())
    notes = [f"Each cell: this sweep's mean over seeds and, in parentheses, this minus "
             f"{comparison.other}'s. {mark}: a difference beyond two standard deviations, twice "
             f"the column's spread over seeds pooled over both sweeps ({spreads}); with one seed "
             f"there is no spread, and no difference is judged. {AVERAGE}: the mean of the row's "
             "columns above, not judged."]
    if HELD_OUT in comparison.columns:
        notes.append(f"{HELD_OUT}: compared only where both sweeps scored the same examples"
                     + (f"; not comparable (other examples: the objective's settings or the "
                        f"seeds differ): {', '.join(comparison.held_out_not_comparable)}."
                        if comparison.held_out_not_comparable else "."))
    for label, names in (("Rows only in this sweep", comparison.only_ours),
                         (f"Rows only in {comparison.other}", comparison.only_theirs),
                         ("Columns not in both sweeps", comparison.columns_not_shared)):
        if names:
            notes.append(f"{label}: {', '.join(names)}.")
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
    """comparison.csv: a line per (row, column) with both means, the difference and whether
    it is told apart (empty where not judged)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["row", "column", "this", "other", "difference", "told_apart"])
    for name, changes in comparison.rows.items():
        for column, change in changes.items():
            writer.writerow([name, column, *("" if v is None else v for v in (
                change.ours, change.theirs, change.difference, change.told_apart))])
    return out.getvalue()
