"""A sweep's records as the paper's table: reading results.jsonl, the `Table` and its findings.

`read_results` reads the records a sweep wrote (`t5x_lite.sweep`), `build_table` turns them
into a `Table` in the layout of the paper's table for that experiment, and `findings_of`
judges the paper's conclusions about it on our numbers; `t5x_lite.report_render` draws the
table and `t5x_lite.report` is the command that writes both.

The table follows the paper's conventions:
- rows in the paper's order (rows the paper does not have come last, in the grid's order),
  with the Params and Cost labels the sweep recorded: the paper's label for the architecture
  and our measured ratio beside it, "M (0.65x)" (`accounting.table2_columns`; records written
  before the ratios were recorded show the label alone);
- one column per paper column a task stands in for (GLUE averages the GLUE tasks, see
  `paper_results.group_columns`), then one column per task without a paper column;
- each cell is our score averaged over the seeds that ran, with the spread when there are
  several (sample standard deviation), and the paper's value in parentheses where it has one;
- bold marks scores within two standard deviations of the column's best, the paper's rule. The
  paper's deviation is the spread of its baseline over 10 runs; ours is the spread over seeds,
  pooled over the rows of the column that ran several. When no row did, the deviation is 0 and
  only the best score (and exact ties) is bold: one seed gives no spread to be generous with;
- when the records hold it (`train.eval_every` > 0, `t5x_lite.held_out`), a "Held-out loss"
  column before the scores: the pre-training objective's loss on held-out corpus text over the
  seeds. It is each objective's own loss, so rows compare only when they scored the same
  examples: the records' `held_out_examples` (`held_out.examples_fingerprint`) agree seed by
  seed. Rows that do form a group (`Row.held_out_group`), and within a group of two or more
  the paper's rule bolds the lowest losses, with the group's spread over seeds. It is no paper
  column and takes no part in the average, tau or the findings. With two or more seeds, each
  row's loss minus its group's first row's, seed by seed (`HeldOutDifference`), makes a table
  of its own: the seed moves a group's rows together, so the paired differences spread less;
- Kendall's tau (tau-b) between our row order and the paper's, per paper column and for the
  row average (the mean of a row's columns; the paper's side averages the same paper columns,
  or all seven when some of our columns have no paper column, e.g. the built-in tasks);
- rows whose pre-training losses are equal at every logged step, seed by seed, are named under
  the table (`Table.identical_pretraining`): they ran the same pre-training, so the table
  cannot tell them apart.

A compute-matched sweep (`sweep.budget` "tokens" or "flops", `t5x_lite.grid`) says so in the
table's title and notes, and a second table, "Pre-training compute", gives each row's derived
steps, FLOPs, row tokens and expected loss-bearing tokens per step and total pre-training
FLOPs (also written to compute.csv). The default budget, "steps", leaves the output as it was.

A sweep with zero-shot scores (`sweep.zero_shot`, records with a `zero_shot` entry) gets a
"Zero-shot vs fine-tuned" table: for each task scored zero-shot, each row's zero-shot score
(the pre-trained model ranking the label options, `t5x_lite.zero_shot`) beside its fine-tuned
model's ranked score (the `finetuned_ranked` entry: the same rule, Wang et al. 2022's
comparison) and its decoded one (the main table's), bold by the same rule per column, and a
note per task naming the best row in each, the best score of always predicting one option,
and the rows whose ranking gave one option to most examples; also written to zero_shot.csv.

Under the table, the Findings section judges each of the paper's conclusions about the table
(`t5x_lite.findings`) on our numbers: supports, contradicts, cannot separate (within the spread
over seeds) or not run, with the numbers behind the verdict and the paper's beside them; they
are also written to findings.csv.
"""
from __future__ import annotations

import dataclasses
import math
import os
import warnings
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import scipy.stats

from t5x_lite import findings, paper_results
from t5x_lite.paper_results import PaperRow, PaperTable
from t5x_lite.results import Budget, latest_records, numbered_records

# not_applicable: a task the architecture cannot be scored on (a generation task for
# encoder_only, `evaluation.not_applicable`); the cell shows "n/a", never a number.
STATUSES = ("ok", "failed", "not_applicable")
# Fields every record needs and their JSON types; the rest (labels, timings, curve) are optional.
_REQUIRED = {"experiment": str, "point": str, "row": str, "task": str, "seed": int,
             "status": str}


# ----------------------------------------------------------------------------- reading records


def _problem(record: Any) -> str | None:
    """Why `record` cannot be used, or None when it can."""
    if not isinstance(record, dict):
        return "not a JSON object"
    for field, kind in _REQUIRED.items():
        if not isinstance(record.get(field), kind) or isinstance(record.get(field), bool):
            return f"field {field!r} is missing or not a {kind.__name__}"
    if record["status"] not in STATUSES:
        return f"status {record['status']!r} is not one of {', '.join(STATUSES)}"
    metrics = record.get("metrics")
    if record["status"] == "ok" and not (
            isinstance(metrics, dict) and metrics and all(map(_is_number, metrics.values()))):
        return "status 'ok' without a non-empty 'metrics' object of numbers"
    for field in RANKED_FIELDS:
        entry = record.get(field)
        if entry is not None and not (
                isinstance(entry, dict) and entry.get("status") in STATUSES
                and isinstance(entry.get("metrics"), dict)
                and all(map(_is_number, entry["metrics"].values()))
                and (entry["status"] != "ok" or entry["metrics"])):
            return f"{field!r} is not an object with a status and a 'metrics' object of numbers"
    curve = record.get("pretrain_curve") or []
    if not (isinstance(curve, list) and all(
            isinstance(p, list) and len(p) == 2 and all(map(_is_number, p)) for p in curve)):
        return "'pretrain_curve' is not a list of [step, loss] pairs"
    # Optional fields the table sorts or groups by (a hand edit made them tracebacks).
    if not isinstance(record.get("held_out_examples"), (str, type(None))):
        return "'held_out_examples' is not a string (the held-out text's fingerprint)"
    for field in ("grid_index", "grid_rows"):
        if record.get(field) is not None and not (
                isinstance(record[field], int) and not isinstance(record[field], bool)):
            return f"{field!r} is not an integer"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_results(path: str) -> list[dict]:
    """The usable records of a results.jsonl file, in file order.

    A record that is not usable is skipped with a warning naming its line number; a line that
    is not JSON is an error unless it is a killed run's cut-off last line (see
    `results.numbered_records`). A file without usable records, or with records of several
    experiments or presets, is an error.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist; run `t5x-lite sweep` with this workdir "
                                "first")
    records = []
    for line_no, record in numbered_records(path):
        problem = _problem(record)
        if problem:
            warnings.warn(f"{path} line {line_no}: {problem}; skipped")
            continue
        records.append(record)
    if not records:
        raise ValueError(f"{path} holds no usable records")
    sweeps = sorted({(r["experiment"], str(r.get("preset"))) for r in records})
    if len(sweeps) > 1:
        found = ", ".join(f"{experiment} (preset {preset})" for experiment, preset in sweeps)
        raise ValueError(f"{path} mixes the records of several sweeps: {found}; a workdir holds "
                         "one experiment and preset, so give each sweep its own workdir")
    return records


# ----------------------------------------------------------------------------- the table


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (row, column) of the table.

    status: 'ok'; 'failed' when a record of the cell failed; 'n/a' when a task of the cell
      is not applicable to the row's architecture; 'missing' when none ran;
      'undefined' when a seed's score is not a number (STS-B's Pearson correlation of constant
      predictions): shown as 'undefined', left out of spreads, bold and findings like a
      missing cell, since an average or a spread with it would be NaN as well.
    mean, std, seeds: our score over the seeds that ran (std: sample deviation, 0 for one).
    paper: the published score, where the paper has this row and column.
    per_seed: an 'ok' cell's (seed, score) pairs, in seed order (what another sweep's cell is
      paired with, `report_compare`).
    """

    status: str
    mean: float | None = None
    std: float = 0.0
    seeds: int = 0
    paper: float | None = None
    bold: bool = False
    per_seed: tuple[tuple[int, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the table: an architecture (and objective) with its cells over seeds and
    the paper's published row beside it."""

    label: str
    objective: str | None
    params_label: str
    cost_label: str
    cells: dict[str, Cell]  # column -> cell, in the table's column order
    paper: PaperRow | None  # the published row with these labels
    # The pre-training held-out loss over seeds (`t5x_lite.held_out`; lower is better); None
    # when the sweep recorded none. held_out_group: the rows with one number scored the same
    # examples (1, 2, ... in row order), so only they compare; None when unknown.
    held_out: Cell | None = None
    held_out_group: int | None = None
    # (seed, `held_out_examples`) of the records with a loss: which examples it scored.
    held_out_examples: tuple[tuple[int, str | None], ...] = ()

    @property
    def average(self) -> float | None:
        """The mean of the row's columns, or None unless every column has a score."""
        means = [cell.mean for cell in self.cells.values()]
        return None if None in means else float(np.mean(means))


@dataclasses.dataclass(frozen=True)
class HeldOutDifference:
    """A row's held-out loss minus that of the first row of its group (the rows that scored
    the same examples, `Row.held_out_group`), seed by seed. The seed moves every row of a group
    together (it draws their held-out text and noise), so a paired difference has a smaller
    spread than the rows' losses."""

    label: str
    objective: str | None
    reference: str  # the row it is compared with, "label (objective)"
    per_seed: dict[int, float]  # seed -> this row's loss minus the reference's
    difference: Cell  # their mean and sample deviation over seeds


@dataclasses.dataclass(frozen=True)
class Compute:
    """A row's pre-training compute in a compute-matched sweep (the sweep's `_budget_fields`)."""

    label: str
    objective: str | None
    steps: int
    flops_per_step: float
    tokens_per_step: int
    loss_tokens_per_step: float
    pretrain_flops: float

    def spent(self, budget: Budget) -> float:
        """The share of `budget` its pre-training spent (1.0: all of it; a step's rounding, or
        one step at least, moves it)."""
        total = (self.pretrain_flops if budget.kind == "flops"
                 else self.steps * self.tokens_per_step)
        return total / budget.total


# A record's entries of ranked label options (`zero_shot.Ranking` with a status and an error):
# the pre-trained model's, and the fine-tuned model's.
RANKED_FIELDS = ("zero_shot", "finetuned_ranked")
# A ranking that gives one option to at least this share of examples is noted as near-constant.
NEAR_CONSTANT_SHARE = 0.9


@dataclasses.dataclass(frozen=True)
class ZeroShotRow:
    """A row of the zero-shot table: per task scored zero-shot, its zero-shot cell (the
    pre-trained model, `sweep.zero_shot`), its fine-tuned model's ranked cell and its decoded
    one (the record's metrics), and per regime that ranks, the largest share of examples any
    seed's ranking gave one option (None where no seed says)."""

    label: str
    objective: str | None
    zero_shot: dict[str, Cell]  # task -> cell, in the table's task order
    finetuned_ranked: dict[str, Cell]
    finetuned: dict[str, Cell]
    most_predicted_share: dict[str, dict[str, float | None]]  # field -> task -> share


@dataclasses.dataclass(frozen=True)
class Table:
    """An experiment's results as the paper's table: its rows, columns, the paper's numbers,
    the rank agreement with them and the failed records (rendered by `report_render`)."""

    experiment: str
    preset: str
    paper: PaperTable | None  # None for an experiment that is not one of the paper's tables
    columns: dict[str, tuple[str, ...]]  # column -> the tasks it is made of
    rows: tuple[Row, ...]
    tau: dict[str, float | None]  # paper column, or 'average' -> Kendall's tau vs. the paper
    failures: tuple[str, ...]  # one line per failed record: point, seed, task, error
    budget: Budget | None = None  # None: sweep.budget="steps", each point's configured steps
    compute: tuple[Compute, ...] = ()  # one per row, in the rows' order, when budget is set
    zero_shot: tuple[ZeroShotRow, ...] = ()  # one per row, when some record has zero-shot scores
    # Per task of `zero_shot`, the best score of always predicting one option
    # (`zero_shot.constant_metrics`, as recorded).
    zero_shot_constant: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    # One per row after the first of each group of rows that scored the same held-out examples
    # in two or more seeds (`_held_out`), group by group.
    held_out_differences: tuple[HeldOutDifference, ...] = ()
    # The groups of rows (as `row_name`s) whose pre-training was the same, seed by seed
    # (`_identical_pretraining`); `grid.identical_rows` warns of them before a sweep runs.
    identical_pretraining: tuple[tuple[str, ...], ...] = ()
    seeds: int = 0  # the seeds the sweep ran or asked for (`_sweep_seeds`); fewer are marked
    # The rows of the sweep's grid (the records' `grid_rows`; None for records made before
    # they carried it): more than `rows` while a sweep is unfinished.
    grid_rows: int | None = None


def kendall_tau(ours: Sequence[float], paper: Sequence[float]) -> float | None:
    """Kendall's tau-b between two score lists; None when it is undefined (< 2 rows, constant)."""
    if len(ours) < 2:
        return None
    tau = scipy.stats.kendalltau(ours, paper).statistic
    return None if math.isnan(tau) else float(tau)


def bold_flags(means: Sequence[float | None], std: float) -> list[bool]:
    """The paper's rule: True for each score within `2 * std` of the best (higher is better)."""
    scores = [m for m in means if m is not None]
    if not scores:
        return [False] * len(means)
    best = max(scores)
    return [m is not None and m >= best - 2 * std for m in means]


def pooled_std(cells: Iterable[Cell]) -> float:
    """The spread over seeds of a column: root mean variance of the cells with several seeds."""
    variances = [cell.std ** 2 for cell in cells if cell.status == "ok" and cell.seeds > 1]
    return math.sqrt(sum(variances) / len(variances)) if variances else 0.0


def _cell(column: str, tasks: tuple[str, ...], records: list[dict], paper: PaperRow | None) -> Cell:
    """Our score for one row and column from the row's records (one per seed and task)."""
    published = paper.scores.get(column) if paper else None
    mine = [r for r in records if r["task"] in tasks]
    if any(r["status"] == "failed" for r in mine):
        return Cell("failed", paper=published)
    if any(r["status"] == "not_applicable" for r in mine):
        return Cell("n/a", paper=published)
    by_seed: dict[int, dict[str, dict]] = {}
    for record in mine:
        by_seed.setdefault(record["seed"], {})[record["task"]] = record["metrics"]
    scores = {seed: paper_results.column_score(column, metrics)
              for seed, metrics in by_seed.items()
              if set(metrics) == set(tasks)}  # a seed without every task of the column: no score
    if not scores:
        return Cell("missing", paper=published)
    if not all(math.isfinite(value) for value in scores.values()):
        return Cell("undefined", seeds=len(scores), paper=published)
    return _over_seeds(scores, published)


def _over_seeds(scores: Mapping[int, float], paper: float | None = None) -> Cell:
    """An 'ok' cell of one score per seed (seed -> score): their mean and sample deviation
    (0 for one seed)."""
    values = list(scores.values())
    std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return Cell("ok", float(np.mean(values)), std, len(values), paper,
                per_seed=tuple(sorted(scores.items())))


def _paper_average_columns(columns: Iterable[str]) -> tuple[str, ...]:
    """The paper columns its side of the average tau averages (see the module docstring)."""
    columns = tuple(columns)
    if all(c in paper_results.COLUMNS for c in columns):
        return columns
    return paper_results.COLUMNS


def _taus(rows: Sequence[Row], columns: Iterable[str]) -> dict[str, float | None]:
    compared = [row for row in rows if row.paper is not None]
    taus = {}
    for column in columns:
        if column in paper_results.COLUMNS:
            pairs = [(row.cells[column].mean, row.paper.scores[column]) for row in compared
                     if row.cells[column].status == "ok"]
            taus[column] = kendall_tau(*zip(*pairs)) if pairs else None
    averaged = _paper_average_columns(columns)
    pairs = [(row.average, float(np.mean([row.paper.scores[c] for c in averaged])))
             for row in compared if row.average is not None]
    taus["average"] = kendall_tau(*zip(*pairs)) if pairs else None
    return taus


def _label(record: dict, label_field: str, ratio_field: str) -> str:
    """A Params or Cost cell: the recorded label, with the measured ratio when recorded."""
    label, ratio = str(record.get(label_field, "")), record.get(ratio_field)
    return f"{label} ({ratio:.2f}x)" if _is_number(ratio) else label


def _one_line(error: str | None) -> str:
    """A failed record's error on one line: its message's lines joined (a config error lists
    the differing fields on lines of their own), a traceback after it left out."""
    message = str(error or "no error message").split("\nTraceback (most recent call last)")[0]
    return " ".join(message.split())


def build_table(records: Sequence[dict]) -> Table:
    """The comparison table of one sweep's records (as `read_results` returns them).

    When one (point, seed, task) has several records, the last one counts (`latest_records`).
    """
    records = latest_records(records)
    experiment, preset = records[0]["experiment"], str(records[0].get("preset", ""))
    paper = paper_results.PAPER_TABLES.get(experiment)
    columns = paper_results.group_columns(r["task"] for r in records)
    by_row: dict[tuple[str, str | None], list[dict]] = {}  # (row, objective) -> records
    for record in records:
        by_row.setdefault((record["row"], record.get("objective")), []).append(record)
    for key, rows in by_row.items():  # else one point's scores overwrote the other's
        points = sorted({str(record["point"]) for record in rows})
        if len(points) > 1:
            raise ValueError(f"points {', '.join(points)} share the row {row_name(*key)!r}: a "
                             "row of the table holds one point; give each its own row label")
    labels: dict[str, set[str]] = {}  # point -> its row names (a label renamed between runs)
    for key, rows in by_row.items():
        for record in rows:
            labels.setdefault(str(record["point"]), set()).add(row_name(*key))
    for point, names in labels.items():
        if len(names) > 1:
            raise ValueError(f"point {point!r} is recorded under the rows "
                             f"{', '.join(map(repr, sorted(names)))} (its label changed between "
                             "runs): a point is one row; give its records in results.jsonl one "
                             "label")
    published = {key: paper.find(*key) if paper else None for key in by_row}
    # The paper's order; rows it does not have come last, in the grid's order (records made
    # before they carried `grid_index`: first seen; a stable sort).
    grid_order = {key: min(r.get("grid_index", math.inf) for r in rows)
                  for key, rows in by_row.items()}
    keys = sorted(by_row, key=lambda k: (paper.rows.index(published[k]) if published[k]
                                         else len(by_row), grid_order[k]))
    cells = {key: {column: _cell(column, tasks, by_row[key], published[key])
                   for column, tasks in columns.items()} for key in keys}
    for column in columns:
        column_cells = [cells[key][column] for key in keys]
        flags = bold_flags([cell.mean for cell in column_cells], pooled_std(column_cells))
        for key, cell, flag in zip(keys, column_cells, flags):
            cells[key][column] = dataclasses.replace(cell, bold=flag)
    held_out, held_out_groups, differences = _held_out(keys, by_row)
    rows = [Row(key[0], key[1], _label(by_row[key][0], "params_label", "params_ratio"),
                _label(by_row[key][0], "cost_label", "flops_ratio"), cells[key], published[key],
                held_out.get(key), held_out_groups.get(key), _held_out_examples(by_row[key]))
            for key in keys]
    failures = tuple(f"{r['point']} seed {r['seed']} {r['task']}: {_one_line(r.get('error'))}"
                     for r in records if r["status"] == "failed")
    budget, compute = _compute(keys, by_row)
    zero_shot = _zero_shot_rows(keys, by_row)
    constant = {task: _recorded_constant_metrics(by_row, task)
                for task in (zero_shot[0].zero_shot if zero_shot else ())}
    return Table(experiment, preset, paper, columns, tuple(rows), _taus(rows, columns), failures,
                 budget, compute, zero_shot, constant, differences,
                 _identical_pretraining(keys, by_row), _sweep_seeds(records),
                 max((r["grid_rows"] for r in records if r.get("grid_rows") is not None),
                     default=None))


def _sweep_seeds(records: Sequence[dict]) -> int:
    """How many seeds the sweep ran or was asked to run (records' `sweep_seeds`; records made
    before they carried it: the seeds that ran), so that a sweep stopped between seeds is
    marked on every cell, not reported as a sweep of fewer seeds."""
    return len({r["seed"] for r in records} | {seed for r in records
                                               for seed in r.get("sweep_seeds", ())})


def row_name(label: str, objective: str | None) -> str:
    """A row as prose: "Encoder-decoder (Denoising)", or the label alone."""
    return f"{label} ({objective})" if objective else label


def _identical_pretraining(keys: Sequence[tuple[str, str | None]],
                           by_row: dict[tuple[str, str | None], list[dict]]
                           ) -> tuple[tuple[str, ...], ...]:
    """The groups of rows (as `row_name`s, in row order) whose pre-training losses are equal at
    every logged step (`pretrain_curve`) for the same seeds: runs that computed the same thing,
    e.g. rows whose objective settings corrupt text alike at the sweep's lengths
    (`grid.identical_rows`). A row whose records hold no curve is in none."""
    groups: dict[tuple, list[str]] = {}
    for key in keys:
        curves = tuple(sorted({(r["seed"], repr(r["pretrain_curve"])) for r in by_row[key]
                               if r.get("pretrain_curve")}))
        if curves:
            groups.setdefault(curves, []).append(row_name(*key))
    return tuple(tuple(names) for names in groups.values() if len(names) > 1)


def _held_out_examples(records: Sequence[dict]) -> tuple[tuple[int, str | None], ...]:
    """(seed, `held_out_examples`) of the records with a held-out loss, sorted: which examples
    a row's losses scored (None where a record does not say)."""
    return tuple(sorted({(r["seed"], r.get("held_out_examples")) for r in records
                         if _is_number(r.get("held_out_loss"))}))


def _held_out(keys: Sequence[tuple[str, str | None]],
              by_row: dict[tuple[str, str | None], list[dict]]
              ) -> tuple[dict[tuple, Cell], dict[tuple, int], tuple[HeldOutDifference, ...]]:
    """Each row's pre-training held-out loss (`held_out_loss`, one per seed: the records of
    a seed's tasks share it) as a cell; its group: the rows whose records name the same
    examples (`held_out_examples`) for the same seeds, numbered from 1 in row order; and,
    in groups of two or more rows with two or more seeds, each row's `HeldOutDifference` from
    the group's first row. Within a group of two or more, the paper's rule bolds the lowest
    losses (`bold_flags` on the negated means, the group's `pooled_std`); a row alone, or one
    of a sweep run before the records named their examples, has nothing to be compared with.
    A row with a loss that is not finite (a held-out pass that overflowed) is 'undefined',
    like a score that is not a number, and in no group: its NaN would have made the group's
    spread, bold and differences NaN.
    ({}, {}, ()) when no record has a loss (a sweep without `train.eval_every`)."""
    scored = {key: [r for r in by_row[key] if _is_number(r.get("held_out_loss"))]
              for key in keys}
    losses = {key: {r["seed"]: r["held_out_loss"] for r in records}
              for key, records in scored.items()}
    if not any(losses.values()):
        return {}, {}, ()
    undefined = {key for key, by_seed in losses.items()
                 if not all(map(math.isfinite, by_seed.values()))}
    cells = {key: Cell("undefined") if key in undefined
             else _over_seeds(by_seed) if by_seed else Cell("missing")
             for key, by_seed in losses.items()}
    groups: dict[tuple, list[tuple[str, str | None]]] = {}
    for key in (key for key in keys if key not in undefined):
        examples = _held_out_examples(by_row[key])
        if examples and all(fingerprint for _, fingerprint in examples):
            groups.setdefault(examples, []).append(key)
    differences = []
    for group in (group for group in groups.values() if len(group) > 1):
        flags = bold_flags([-cells[key].mean for key in group],
                           pooled_std(cells[key] for key in group))
        for key, flag in zip(group, flags):
            cells[key] = dataclasses.replace(cells[key], bold=flag)
        reference = losses[group[0]]
        if len(reference) > 1:  # the group's rows share their seeds (their examples name them)
            for key in group[1:]:
                per_seed = {seed: losses[key][seed] - reference[seed] for seed in sorted(reference)}
                differences.append(HeldOutDifference(key[0], key[1], row_name(*group[0]),
                                                     per_seed, _over_seeds(per_seed)))
    numbers = {key: number for number, group in enumerate(groups.values(), 1) for key in group}
    return cells, numbers, tuple(differences)


def _as_ranked(record: dict, field: str) -> dict | None:
    """`record` with its `field` entry (one of `RANKED_FIELDS`) as its status and metrics; a
    record without one is failed when its run failed (no stage ran), else None (a sweep
    without it, or a record made before it)."""
    entry = record.get(field)
    if entry is None:
        return {**record, "metrics": {}} if record["status"] == "failed" else None
    return {**record, "status": entry["status"], "metrics": entry["metrics"]}


def _most_predicted_share(records: Sequence[dict], field: str, task: str) -> float | None:
    """The largest share of examples that one seed's ranking (`field`) of `task` gave one
    option, over `records`; None when none says (records made before it was recorded)."""
    shares = [r[field]["most_predicted_share"] for r in records
              if r["task"] == task and (r.get(field) or {}).get("most_predicted_share") is not None]
    return max(shares) if shares else None


def _with_bold(cells: dict[tuple, dict[str, Cell]], tasks: Sequence[str]) -> None:
    """Set the bold flags of `cells` ({row key: {task: cell}}) per task column, in place."""
    for task in tasks:
        column = [row[task] for row in cells.values()]
        for row, flag in zip(cells.values(), bold_flags([c.mean for c in column],
                                                        pooled_std(column))):
            row[task] = dataclasses.replace(row[task], bold=flag)


def _zero_shot_rows(keys: Sequence[tuple[str, str | None]],
                    by_row: dict[tuple[str, str | None], list[dict]]) -> tuple[ZeroShotRow, ...]:
    """Each row's zero-shot and fine-tuned cells of the tasks some record scored zero-shot
    (those with label options); () when no record holds zero-shot scores."""
    tasks = list(dict.fromkeys(r["task"] for key in keys for r in by_row[key]
                               if (r.get("zero_shot") or {}).get("status") in ("ok", "failed")))
    if not tasks:
        return ()
    ranked = {field: {key: {t: _cell(t, (t,), [z for r in by_row[key]
                                                if (z := _as_ranked(r, field)) is not None], None)
                            for t in tasks} for key in keys} for field in RANKED_FIELDS}
    tuned_cells = {key: {t: _cell(t, (t,), by_row[key], None) for t in tasks} for key in keys}
    for cells in (*ranked.values(), tuned_cells):
        _with_bold(cells, tasks)
    return tuple(ZeroShotRow(
        key[0], key[1], ranked["zero_shot"][key], ranked["finetuned_ranked"][key],
        tuned_cells[key], {field: {t: _most_predicted_share(by_row[key], field, t) for t in tasks}
                           for field in RANKED_FIELDS})
        for key in keys)


def _recorded_constant_metrics(by_row: dict[tuple[str, str | None], list[dict]], task: str
                               ) -> dict[str, float]:
    """The best score of always predicting one option of `task` (`zero_shot.constant_metrics`,
    per metric), from the first record whose zero-shot entry has it; {} when none has."""
    for records in by_row.values():
        for record in records:
            found = (record.get("zero_shot") or {}).get("constant_metrics")
            if record["task"] == task and found:
                return found
    return {}


_COMPUTE_FIELDS = ("pretrain_steps", "flops_per_step", "tokens_per_step", "loss_tokens_per_step",
                   "pretrain_flops")


def _compute(keys: Sequence[tuple[str, str | None]],
             by_row: dict[tuple[str, str | None], list[dict]]
             ) -> tuple[Budget | None, tuple[Compute, ...]]:
    """The budget and each row's compute, from the first record of a row that has them; (None,
    ()) when no record was compute-matched."""
    matched = [r for key in keys for r in by_row[key] if r.get("budget")]
    if not matched:
        return None, ()
    first = matched[0]
    budget = Budget(str(first["budget"]), str(first.get("budget_reference")),
                    int(first.get("budget_reference_steps") or 0),
                    float(first.get("budget_total") or 0.0))
    compute = []
    for key in keys:
        record = next((r for r in by_row[key]
                       if all(_is_number(r.get(f)) for f in _COMPUTE_FIELDS)), None)
        if record is not None:
            compute.append(Compute(key[0], key[1], *(record[f] for f in _COMPUTE_FIELDS)))
    return budget, tuple(compute)


# ----------------------------------------------------------------------------- findings


def _scores(table: Table) -> findings.Scores:
    """Our table as the numbers the paper's findings are judged on."""
    return findings.Scores(
        columns=tuple(table.columns),
        means={(row.label, row.objective): {column: cell.mean for column, cell in row.cells.items()
                                            if cell.status == "ok"} for row in table.rows},
        spread={column: pooled_std(row.cells[column] for row in table.rows)
                for column in table.columns},
        several_seeds=frozenset(column for column in table.columns if any(
            row.cells[column].status == "ok" and row.cells[column].seeds > 1
            for row in table.rows)))


def findings_of(table: Table) -> list[tuple[findings.Verdict, findings.Verdict]]:
    """Each of the paper's findings about the table's experiment judged on our numbers, paired
    with the same finding judged on the paper's (its row averages over the paper columns ours
    stand for, as for tau). Empty for an experiment that is not one of the paper's tables."""
    ours = findings.evaluate(table.experiment, _scores(table))
    if not ours:
        return []
    paper = findings.paper_scores(table.experiment, _paper_average_columns(table.columns))
    return list(zip(ours, findings.evaluate(table.experiment, paper), strict=True))
