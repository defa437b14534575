"""The T5 paper's published ablation results, and how our tasks' scores map onto its columns.

Source: Colin Raffel, Noam Shazeer, Adam Roberts, Katherine Lee, Sharan Narang, Michael Matena,
Yanqi Zhou, Wei Li, Peter J. Liu. "Exploring the Limits of Transfer Learning with a Unified
Text-to-Text Transformer". JMLR 21(140), 2020; arXiv:1910.10683. The numbers are the validation
scores of Tables 2 (architectures), 4 (high-level objectives), 5 (BERT-style variants),
6 (corruption rates) and 7 (corrupted span lengths), and the baseline's standard deviations
over 10 runs from Table 1. Every column is higher-is-better:

  GLUE   the average GLUE score          CNNDM  ROUGE-2-F on CNN/Daily Mail
  SQuAD  exact match on SQuAD v1.1       SGLUE  the average SuperGLUE score
  EnDe, EnFr, EnRo                       BLEU on WMT English to German / French / Romanian

Our tasks stand in for a column as `PAPER_COLUMN_TASKS` says: the `glue_*` tasks (or their
`local_glue_*` namesakes) make up GLUE through `tasks.glue_average`, and one task each makes
up the others (e.g. `local_multi30k_ende` for EnDe). `builtin_*` and other tasks have no
paper column; `group_columns` gives each of them a column of its own, named after the task.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from t5x_lite.config import ConfigError
from t5x_lite.data import tasks

CITATION = ("Raffel et al., Exploring the Limits of Transfer Learning with a Unified "
            "Text-to-Text Transformer, JMLR 2020, arXiv:1910.10683")
COLUMNS = ("GLUE", "CNNDM", "SQuAD", "SGLUE", "EnDe", "EnFr", "EnRo")

# Table 1, "Baseline standard deviation" over 10 runs of the baseline, per column.
BASELINE_STD = dict(zip(COLUMNS, (0.235, 0.065, 0.343, 0.416, 0.112, 0.090, 0.108)))


@dataclasses.dataclass(frozen=True)
class PaperRow:
    """One published row: its label(s) as printed and its score per column (COLUMNS order)."""

    row: str
    objective: str | None  # Table 2's Objective column; None in the other tables
    scores: Mapping[str, float]

    @property
    def average(self) -> float:
        return sum(self.scores.values()) / len(self.scores)


@dataclasses.dataclass(frozen=True)
class PaperTable:
    """A published table: its number, caption, the header of its label column, rows in order."""

    number: int
    caption: str
    row_header: str
    rows: tuple[PaperRow, ...]

    def find(self, row: str, objective: str | None) -> PaperRow | None:
        """The published row with these labels, or None when the paper has no such row.

        `objective` only tells rows apart in Table 2; elsewhere the row label alone decides.
        """
        return next((r for r in self.rows
                     if r.row == row and r.objective in (None, objective)), None)


def _rows(text: str, objective: str | None = None) -> tuple[PaperRow, ...]:
    """Rows from lines 'label; GLUE CNNDM SQuAD SGLUE EnDe EnFr EnRo' (as printed)."""
    rows = []
    for line in text.strip().splitlines():
        label, numbers = line.split(";")
        values = [float(v) for v in numbers.split()]
        rows.append(PaperRow(label.strip(), objective, dict(zip(COLUMNS, values, strict=True))))
    return tuple(rows)


_BERT_STYLE = "BERT-style; 82.96 19.17 80.65 69.85 26.78 40.03 27.41"
_BASELINE = "83.28 19.24 80.88 71.36 26.98 39.82 27.65"  # the baseline (★) of every table

PAPER_TABLES: dict[str, PaperTable] = {
    "table2": PaperTable(2, "Performance of the different architectural variants",
                         "Architecture", _rows(f"""
Encoder-decoder; {_BASELINE}
Enc-dec, shared; 82.81 18.78 80.63 70.73 26.72 39.03 27.46
Enc-dec, 6 layers; 80.88 18.97 77.59 68.42 26.38 38.40 26.95
Language model; 74.70 17.93 61.14 55.02 25.09 35.28 25.86
Prefix LM; 81.82 18.61 78.94 68.11 26.43 37.98 27.39
""", "Denoising") + _rows("""
Encoder-decoder; 79.56 18.59 76.02 64.29 26.27 39.17 26.86
Enc-dec, shared; 79.60 18.13 76.35 63.50 26.62 39.17 27.05
Enc-dec, 6 layers; 78.67 18.26 75.32 64.06 26.13 38.42 26.89
Language model; 73.78 17.54 53.81 56.51 25.23 34.31 25.38
Prefix LM; 79.68 17.84 76.87 64.86 26.28 37.51 26.76
""", "LM")),
    "table4": PaperTable(4, "Performance of the three high-level pre-training objectives",
                         "Objective", _rows(f"""
Prefix language modeling; 80.69 18.94 77.99 65.27 26.86 39.73 27.49
{_BERT_STYLE}
Deshuffling; 73.17 18.59 67.61 58.47 26.11 39.30 25.62
""")),
    "table5": PaperTable(5, "Comparison of variants of the BERT-style pre-training objective",
                         "Objective", _rows(f"""
{_BERT_STYLE}
MASS-style; 82.32 19.16 80.10 69.28 26.79 39.89 27.55
Replace corrupted spans; {_BASELINE}
Drop corrupted tokens; 84.44 19.31 80.52 68.67 27.07 39.76 27.82
""")),
    "table6": PaperTable(6, "Performance of the i.i.d. corruption objective with different "
                         "corruption rates", "Corruption rate", _rows(f"""
10%; 82.82 19.00 80.38 69.55 26.87 39.28 27.44
15%; {_BASELINE}
25%; 83.00 19.54 80.96 70.48 27.04 39.83 27.47
50%; 81.27 19.32 79.80 70.33 27.01 39.90 27.49
""")),
    "table7": PaperTable(7, "Performance of the span-corruption objective for different "
                         "average span lengths", "Span length", _rows(f"""
i.i.d.; {_BASELINE}
2; 83.54 19.39 82.09 72.20 26.76 39.99 27.63
3; 83.49 19.62 81.84 72.53 26.86 39.65 27.62
5; 83.40 19.24 82.05 72.23 26.88 39.40 27.53
10; 82.85 19.33 81.84 70.44 26.79 39.49 27.69
""")),
}

def check_grid(experiment: str, grid: Iterable[Mapping[str, Any]]) -> None:
    """Raise `ConfigError` unless every row of an experiment's grid is a row of the paper table
    the report compares it with (`PAPER_TABLES[experiment]`; Table 2's rows by label and
    objective), naming the experiment, the point and the paper's rows. An experiment that is
    not one of the paper's tables has nothing to be checked against."""
    paper = PAPER_TABLES.get(experiment)
    if paper is None:
        return
    for row in grid:
        if paper.find(row["row"], row.get("objective")) is None:
            known = ", ".join(repr(r.row) + (f" ({r.objective})" if r.objective else "")
                              for r in paper.rows)
            objective = (f" with objective {row.get('objective')!r}"
                         if any(r.objective for r in paper.rows) else "")
            raise ConfigError(
                f"{experiment} point {row['point']!r}: row {row['row']!r}{objective} is not a "
                f"row of the paper's Table {paper.number}, which {experiment} is compared with; "
                f"its rows are {known}")


# Paper column -> the tasks that stand in for it (paper task first, then our local stand-in).
PAPER_COLUMN_TASKS = {
    "CNNDM": ("cnn_dailymail", "local_dialogsum"),
    "SQuAD": ("squad", "local_squad"),
    "EnDe": ("wmt_ende", "local_multi30k_ende"),
    "EnFr": ("wmt_enfr", "local_multi30k_enfr"),
    "EnRo": ("wmt_enro", "local_rosts_enro"),
}
# The metric the paper's ablation tables report for a task; tasks not listed here report the
# mean of their metrics (T5's convention for tasks with several, e.g. MRPC's F1 and accuracy).
HEADLINE_METRICS = {
    **{task: "rouge2" for task in PAPER_COLUMN_TASKS["CNNDM"]},
    **{task: "em" for task in PAPER_COLUMN_TASKS["SQuAD"]},
    **{task: "bleu" for column in ("EnDe", "EnFr", "EnRo") for task in PAPER_COLUMN_TASKS[column]},
}


def is_glue_task(task: str) -> bool:
    """Whether `task` counts towards the GLUE average (WNLI does not; `glue_mnli`, validated on
    validation_matched, counts as MNLI's matched score)."""
    return tasks.glue_part(task) is not None


def paper_column(task: str) -> str | None:
    """The paper column `task` stands in for, or None (built-in and other tasks)."""
    if is_glue_task(task):
        return "GLUE"
    return next((c for c, names in PAPER_COLUMN_TASKS.items() if task in names), None)


def column_of(task: str) -> str:
    """The report column of `task`: its paper column, or the task's own name."""
    return paper_column(task) or task


def headline_score(task: str, metrics: Mapping[str, float]) -> float:
    """The one number the paper would report for `task` from all its metrics."""
    if not metrics:
        raise ValueError(f"task {task!r} has no metrics to score")
    metric = HEADLINE_METRICS.get(task)
    if metric is None:
        return sum(metrics.values()) / len(metrics)
    if metric not in metrics:
        raise ValueError(f"task {task!r} reports {metric!r} in the paper, but its metrics are "
                         f"{', '.join(sorted(metrics))}")
    return metrics[metric]


def group_columns(task_names: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Report column -> its tasks: the paper's columns in its order, then one per other task.

    Every GLUE task present goes into GLUE; any other paper column holds exactly one task, and
    two tasks standing in for one column (e.g. `wmt_ende` and `local_multi30k_ende`), or for
    one part of GLUE's average (`glue_rte` and `local_glue_rte`; `tasks.glue_part`), are an
    error, since their scores are not comparable.
    """
    groups: dict[str, list[str]] = {}
    for task in dict.fromkeys(task_names):
        column = column_of(task)
        part = tasks.glue_part(task)
        same = [other for other in groups.get(column, [])
                if column != "GLUE" or (part is not None and tasks.glue_part(other) == part)]
        if same:
            where = (f"the paper column {column!r}" if column != "GLUE"
                     else f"the GLUE part {tasks.glue_part_name(part)!r}")
            raise ValueError(f"tasks {same[0]!r} and {task!r} both stand in for {where}; keep "
                             "one of them")
        groups.setdefault(column, []).append(task)
    order = [c for c in COLUMNS if c in groups] + [c for c in groups if c not in COLUMNS]
    return {column: tuple(sorted(groups[column])) for column in order}


def column_score(column: str, metrics: Mapping[str, Mapping[str, float]]) -> float:
    """The score of `column` from one run's `{task: {metric: value}}` of the column's tasks.

    GLUE is `tasks.glue_average` over the GLUE tasks present; groups missing from the run
    (MNLI and QQP are not in the local data) are left out, so such an average is not the
    paper's. Every other column is the headline score of its one task.
    """
    if column == "GLUE":
        return tasks.glue_average(metrics, allow_missing=True)
    if len(metrics) != 1:
        raise ValueError(f"column {column!r} takes one task's metrics, got tasks "
                         f"{', '.join(sorted(metrics)) or 'none'}")
    (task, values), = metrics.items()
    return headline_score(task, values)
