"""A `report_table.Table` drawn as text: Markdown, terminal text, LaTeX and CSV (its PNG
plots: `t5x_lite.report_plots`).

Every format shows the same cells (`_cell_text`: our mean, ± the spread over seeds, the
paper's value in parentheses, bold by the paper's rule), the notes under the table, the
compute, zero-shot and paired held-out tables when the sweep has them (`_sections`), and the
Findings section (`report_table.findings_of`, worded by `findings.describe`).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import re
from typing import Callable, Sequence

from t5x_lite import findings, paper_results
from t5x_lite.data.tasks import missing_glue_parts
from t5x_lite.report_table import (NEAR_CONSTANT_SHARE, RANKED_FIELDS, Cell, Table,
                                   ZeroShotRow, findings_of, pooled_std, row_name)


def _findings_lines(table: Table, verdict: Callable[[str], str], indent: str) -> list[str]:
    """The Findings section's items: '<verdict>: claim (source).' then the checks, indented."""
    lines = []
    for ours, paper in findings_of(table):
        headline, details = findings.describe(ours, paper)
        lines.append(f"- {verdict(ours.verdict)}: {headline}")
        lines += [f"{indent}- {detail}" for detail in details]
    return lines


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _cell_text(cell: Cell, bold: Callable[[str], str], seeds: int = 0) -> str:
    """'61.00 ± 0.50 (83.28)', the score wrapped by `bold` when it is bold; '[2/3 seeds]'
    after a score over fewer than the sweep's `seeds` (`_fewer_seeds`)."""
    if cell.status != "ok":
        text = cell.status if cell.status in ("failed", "undefined", "n/a") else "–"
    else:
        text = bold(f"{cell.mean:.2f}") if cell.bold else f"{cell.mean:.2f}"
        if cell.seeds > 1:
            text += f" ± {cell.std:.2f}"
        if _fewer_seeds(cell, seeds):
            text += f" [{cell.seeds}/{seeds} seeds]"
    return text if cell.paper is None else f"{text} ({cell.paper:.2f})"


def _fewer_seeds(cell: Cell, seeds: int) -> bool:
    """Whether an 'ok' cell is over fewer seeds than the sweep's: some seed's record of one of
    its tasks is missing (it averaged the others without a word)."""
    return cell.status == "ok" and cell.seeds < seeds


PAPER_AVERAGE = "Paper avg"


def _score_columns(table: Table) -> list[str]:
    """The numeric columns: ours, then the paper's row average when some of ours have no paper
    column (e.g. the built-in tasks), so the published numbers still stand beside ours."""
    unmatched = table.paper and any(c not in paper_results.COLUMNS for c in table.columns)
    return [*table.columns, *([PAPER_AVERAGE] if unmatched else [])]


HELD_OUT_LOSS = "Held-out loss"


def _held_out_columns(table: Table) -> list[str]:
    """The pre-training held-out loss column, when the sweep recorded one (`Row.held_out`)."""
    return [HELD_OUT_LOSS] if any(row.held_out for row in table.rows) else []


def _numeric_columns(table: Table) -> list[str]:
    """The right-aligned columns: the held-out loss, if any, then the scores."""
    return [*_held_out_columns(table), *_score_columns(table)]


def _grid(table: Table, bold: Callable[[str], str]) -> list[list[str]]:
    """Header and body of the table as text cells, the scores formatted by `_cell_text`."""
    with_objective = any(row.objective for row in table.rows)
    with_average = PAPER_AVERAGE in _score_columns(table)
    with_held_out = bool(_held_out_columns(table))
    header = [table.paper.row_header if table.paper else "Row",
              *(["Objective"] if with_objective else []), "Params", "Cost",
              *_numeric_columns(table)]
    body = [[row.label, *([row.objective or ""] if with_objective else []), row.params_label,
             row.cost_label,
             *([_cell_text(row.held_out, bold, table.seeds)] if with_held_out else []),
             *(_cell_text(cell, bold, table.seeds) for cell in row.cells.values()),
             *([f"({_number(row.paper and row.paper.average)})"] if with_average else [])]
            for row in table.rows]
    return [header, *body]


def _title(table: Table) -> str:
    name = (f"Table {table.paper.number}: {table.paper.caption}" if table.paper
            else f"Experiment {table.experiment}")
    matched = (f", compute-matched: sweep.budget={table.budget.kind}" if table.budget else "")
    return f"{name} (experiment {table.experiment}, preset {table.preset or '?'}{matched})"


_BUDGET_UNITS = {"flops": "training FLOPs", "tokens": "row tokens"}


def _budget_note(table: Table) -> list[str]:
    """The line saying which budget matched the points (none under sweep.budget="steps")."""
    budget = table.budget
    if budget is None:
        return []
    return [f"Compute-matched (sweep.budget={budget.kind}): every point pre-trains for the steps "
            f"that spend what {budget.reference} spends in its {budget.reference_steps} "
            f"configured steps, {budget.total:.4g} {_BUDGET_UNITS.get(budget.kind, budget.kind)}"
            " (steps rounded to the nearest whole step); see the pre-training compute table."]


COMPUTE_TITLE = "Pre-training compute per point"
ZERO_SHOT_TITLE = "Zero-shot vs fine-tuned"


# The zero-shot table's columns per task: (regime, the `ZeroShotRow` field of its cells, which
# for a ranked regime is also the record field of its ranking: `report_table.RANKED_FIELDS`).
ZERO_SHOT_REGIMES = (("zero-shot", "zero_shot"), ("fine-tuned ranked", "finetuned_ranked"),
                     ("fine-tuned decoded", "finetuned"))


def _zero_shot_grid(table: Table, bold: Callable[[str], str]) -> list[list[str]]:
    """Header and body of the zero-shot table: per task, a column per `ZERO_SHOT_REGIMES`."""
    with_objective = any(row.objective for row in table.zero_shot)
    tasks = list(table.zero_shot[0].zero_shot)
    header = [table.paper.row_header if table.paper else "Row",
              *(["Objective"] if with_objective else []),
              *(f"{task} {regime}" for task in tasks for regime, _ in ZERO_SHOT_REGIMES)]
    body = [[row.label, *([row.objective or ""] if with_objective else []),
             *(_cell_text(getattr(row, field)[task], bold, table.seeds) for task in tasks
               for _, field in ZERO_SHOT_REGIMES)]
            for row in table.zero_shot]
    return [header, *body]


def _best_rows(rows: Sequence[ZeroShotRow], cells_of: Callable[[ZeroShotRow], Cell]) -> str:
    """The rows with the best mean score of a column, or 'none scored'."""
    scored = [(cells_of(row).mean, row_name(row.label, row.objective)) for row in rows
              if cells_of(row).status == "ok"]
    if not scored:
        return "none scored"
    best = max(mean for mean, _ in scored)
    return " / ".join(name for mean, name in scored if mean == best) + f" ({best:.2f})"


def _zero_shot_notes(table: Table) -> list[str]:
    notes = [f"{ZERO_SHOT_TITLE}: zero-shot is the pre-trained model, not fine-tuned, predicting "
             "the label option with the highest summed log-likelihood (EOS included; Wang et "
             "al. 2022, arXiv 2204.05832), scored with the task's own metrics; fine-tuned "
             "ranked is the final fine-tuned model predicting by the same rule (Wang et al. "
             "rank both regimes); fine-tuned decoded is the main table's score, the best "
             "validation of the fine-tuned model's greedy output, which must spell a label "
             "exactly (–: a record made before the fine-tuned model was ranked). Bold: "
             "within two standard deviations of the column's best (spread over seeds)."]
    share = f"{NEAR_CONSTANT_SHARE:.0%}"
    for task in table.zero_shot[0].zero_shot:
        best = "; ".join(f"best {regime} "
                         f"{_best_rows(table.zero_shot, lambda r: getattr(r, field)[task])}"
                         for regime, field in ZERO_SHOT_REGIMES)
        constant = table.zero_shot_constant.get(task)
        if constant:
            best += ("; always predicting one option scores at most "
                     + ", ".join(f"{metric} {value:.2f}" for metric, value in constant.items()))
        near = [f"{row_name(row.label, row.objective)} ({regime})" for row in table.zero_shot
                for regime, field in ZERO_SHOT_REGIMES if field in RANKED_FIELDS
                and (row.most_predicted_share[field][task] or 0) >= NEAR_CONSTANT_SHARE]
        if near:
            best += (f"; ranking gave one option to at least {share} of the examples (in some "
                     f"seed) for {', '.join(near)}: their score is about that option's")
        notes.append(f"{task}: {best}.")
    return notes


def _compute_grid(table: Table) -> list[list[str]]:
    """Header and body of the compute table: a row per table row that recorded its compute."""
    with_objective = any(row.objective for row in table.compute)
    header = [table.paper.row_header if table.paper else "Row",
              *(["Objective"] if with_objective else []), "Steps", "FLOPs/step", "Tokens/step",
              "Loss tokens/step", "Pre-training FLOPs", "Of budget"]
    body = [[row.label, *([row.objective or ""] if with_objective else []), str(row.steps),
             f"{row.flops_per_step:.4g}", str(row.tokens_per_step),
             f"{row.loss_tokens_per_step:.1f}", f"{row.pretrain_flops:.4g}",
             f"{row.spent(table.budget):.3f}"]
            for row in table.compute]
    return [header, *body]


def _compute_notes(table: Table) -> list[str]:
    return [f"{COMPUTE_TITLE}, matched by sweep.budget={table.budget.kind}. FLOPs: the "
            "accounting module's training FLOPs (3 x forward matmuls, attention and logits "
            "included) of a step's rows, each point's own objective's lengths; tokens: the row "
            "positions a step processes (batch x (inputs + targets lengths)); Of budget: what "
            "its pre-training spent of the budget, in its unit; loss tokens: the expected "
            "target tokens with a loss weight (objectives.expected_loss_tokens) of an example "
            "that fills its raw length, which prefix_lm's and deshuffling's document segments "
            "often do not (a document's last one is shorter)."]


HELD_OUT_DIFFERENCES_TITLE = "Held-out loss, paired by seed"


def _held_out_differences_grid(table: Table) -> list[list[str]]:
    """Header and body of the paired held-out table: a row per `HeldOutDifference`."""
    rows = table.held_out_differences
    with_objective = any(row.objective for row in rows)
    labelled = _paired_seeds(table) is None  # else the note names the seeds once
    header = [table.paper.row_header if table.paper else "Row",
              *(["Objective"] if with_objective else []), "Compared with", "Difference",
              "Lower in", "Per seed"]
    body = [[row.label, *([row.objective or ""] if with_objective else []), row.reference,
             f"{row.difference.mean:+.3f} ± {row.difference.std:.3f}",
             f"{sum(value < 0 for value in row.per_seed.values())} of {len(row.per_seed)} seeds",
             ", ".join(f"{seed}: {value:+.3f}" if labelled else f"{value:+.3f}"
                       for seed, value in row.per_seed.items())]
            for row in rows]
    return [header, *body]


def _paired_seeds(table: Table) -> tuple[int, ...] | None:
    """The seeds of every paired row, or None when the groups have different seeds (a seed
    failed for one group): then each per-seed value names its seed."""
    seed_sets = {tuple(row.per_seed) for row in table.held_out_differences}
    return seed_sets.pop() if len(seed_sets) == 1 else None


def _held_out_differences_notes(table: Table) -> list[str]:
    shared = _paired_seeds(table)
    seeds = (f"({', '.join(map(str, shared))})" if shared is not None
             else "(the seeds its group shares, named in Per seed)")
    return [f"{HELD_OUT_DIFFERENCES_TITLE}: each row's held-out loss minus that of the row it "
            "is compared with (the first row that scored the same examples), in each seed "
            f"{seeds}, then their mean ± sample deviation; negative: the row's loss is "
            "lower. The seed draws a group's held-out text and noise, which moves all its rows "
            "together, so these differences spread less than the column's losses."]


@dataclasses.dataclass(frozen=True)
class _Section:
    """A table under the main one, drawn alike by every format: its title, its header and body
    as text cells (`numeric` columns last, right-aligned) and the notes under it."""

    title: str
    grid: list[list[str]]
    numeric: int
    notes: list[str]


def _sections(table: Table, bold: Callable[[str], str]) -> list[_Section]:
    """The tables under the main one that the sweep has: the pre-training compute of a
    compute-matched sweep, the zero-shot scores and the paired held-out losses."""
    sections = []
    if table.compute:
        sections.append(_Section(f"{COMPUTE_TITLE} (sweep.budget={table.budget.kind})",
                                 _compute_grid(table), 5, _compute_notes(table)))
    if table.zero_shot:
        sections.append(_Section(ZERO_SHOT_TITLE, _zero_shot_grid(table, bold),
                                 len(ZERO_SHOT_REGIMES) * len(table.zero_shot[0].zero_shot),
                                 _zero_shot_notes(table)))
    if table.held_out_differences:
        sections.append(_Section(HELD_OUT_DIFFERENCES_TITLE, _held_out_differences_grid(table),
                                 3, _held_out_differences_notes(table)))
    return sections


def _sentence_end(text: str) -> str:
    """`text` ending a sentence: with a full stop, unless it ends with one ("i.i.d.")."""
    return text if text.endswith(".") else f"{text}."


def _held_out_note(table: Table) -> list[str]:
    """What the held-out loss column is and which of its rows compare (`Row.held_out_group`)."""
    if not _held_out_columns(table):
        return []
    groups: dict[int | None, list[str]] = {}
    for row in table.rows:
        if row.held_out and row.held_out.status == "ok":
            groups.setdefault(row.held_out_group, []).append(row_name(row.label, row.objective))
    alone = [names[0] for number, names in groups.items() if number and len(names) == 1]
    compared = "; ".join(", ".join(names) for number, names in groups.items()
                         if number and len(names) > 1)
    unknown = groups.get(None, [])
    return [f"{HELD_OUT_LOSS}: the pre-training objective's loss on held-out corpus text at the "
            "last step (train.eval_every; lower is better). It is each objective's own loss, so "
            "rows compare only when they scored the same examples (the same text, objective "
            "settings and noise, seed by seed); bold: within two standard deviations of the "
            "lowest of such rows (spread over seeds "
            f"{pooled_std(row.held_out for row in table.rows if row.held_out):.3f})."
            + (f" Scored the same examples: {compared}." if compared else "")
            + (f" Alone: {_sentence_end(', '.join(alone))}" if alone else "")
            + (f" Not known which examples (a sweep older than the records' held_out_examples)"
               f": {', '.join(unknown)}." if unknown else "")]


def _notes(table: Table, bold_name: str = "Bold") -> list[str]:
    """The lines under the table: tau, the bolding rule, sources of the columns, failures."""
    taus = ", ".join(f"{column} {_number(tau)}" for column, tau in table.tau.items())
    notes = _partial_note(table)
    if table.paper:
        notes += [f"Kendall's tau of our row order vs. the paper's: {taus}.",
                  f"In parentheses: the paper's Table {table.paper.number} "
                  f"({paper_results.CITATION})."]
        if PAPER_AVERAGE in _score_columns(table):
            notes.append(f"{PAPER_AVERAGE}: the mean of the paper's {len(paper_results.COLUMNS)} "
                         f"columns ({', '.join(paper_results.COLUMNS)}) for the row; the tasks "
                         "without a paper column are compared with it.")
    spreads = ", ".join(f"{column} {pooled_std(row.cells[column] for row in table.rows):.2f}"
                        for column in table.columns)
    notes.append(f"{bold_name}: within two standard deviations of the column's best; the "
                 f"deviation is the spread over seeds ({spreads}), 0 with one seed, so then only "
                 "the best is bold.")
    notes += _held_out_note(table)
    notes += [f"Rows {', '.join(group[:-1])} and {group[-1]} pre-trained identically (the same "
              "loss at every logged step, seed by seed): at these settings and lengths they ran "
              "the same pre-training, so this table cannot tell them apart."
              for group in table.identical_pretraining]
    for column, tasks in table.columns.items():
        if column == "GLUE":
            missing = missing_glue_parts(tasks)
            notes.append(f"GLUE from {', '.join(tasks)}" + (
                f"; without {', '.join(missing)}, so not the paper's GLUE average." if missing
                else "."))
        elif (column,) != tasks:
            notes.append(f"{column} from {', '.join(tasks)}.")
    if any(_fewer_seeds(cell, table.seeds) for row in table.rows
           for cell in [*row.cells.values(), *([row.held_out] if row.held_out else [])]):
        notes.append(f"[k/{table.seeds} seeds]: a score over k of the sweep's {table.seeds} "
                     "seeds, the other seeds' records of its tasks missing (not run yet, or "
                     "lost); its mean, spread and bold are over those k.")
    notes += [f"Failed: {failure}" for failure in table.failures]
    return notes + _budget_note(table)


def _partial_note(table: Table) -> list[str]:
    """A line naming the paper's rows that have no records (a sweep not finished, or a grid of
    some of them): the tau and the findings are then over the others only. For another
    experiment, a line counting its grid's rows that have records, when some have none."""
    if table.paper is None:
        if table.grid_rows is None or len(table.rows) >= table.grid_rows:
            return []
        return [f"Partial: {len(table.rows)} of the grid's {table.grid_rows} rows have records "
                "(the sweep is not finished; `t5x-lite sweep ... --dry_run` lists what is "
                "left); its bold and findings are over those rows only."]
    ours = {id(row.paper) for row in table.rows if row.paper is not None}
    missing = [row_name(row.row, row.objective) for row in table.paper.rows
               if id(row) not in ours]
    if not missing:
        return []
    count = len(table.paper.rows)
    return [f"Partial: {count - len(missing)} of the paper's {count} rows have records (not "
            f"{', '.join(missing)}); Kendall's tau and the findings are over those only."]


def markdown_table(grid: list[list[str]], numeric: int) -> list[str]:
    """A header row and body as Markdown lines, the last `numeric` columns right-aligned."""
    header, *body = grid
    return ["| " + " | ".join(header) + " |",
            "|" + "---|" * (len(header) - numeric) + "---:|" * numeric,
            *("| " + " | ".join(row) + " |" for row in body)]


def to_markdown(table: Table) -> str:
    """`table` as table.md: its title, the rows beside the paper's, the notes, then each
    further section (pre-training compute, zero-shot, paired held-out losses) as its own
    Markdown table, then the findings as a list."""
    bold = "**{}**".format
    lines = [f"## {_title(table)}", "",
             *markdown_table(_grid(table, bold), len(_numeric_columns(table))), "",
             *_notes(table)]
    for section in _sections(table, bold):
        lines += ["", f"### {section.title}", "", *markdown_table(section.grid, section.numeric),
                  "", *section.notes]
    items = _findings_lines(table, lambda verdict: f"**{verdict}**", "  ")
    if items:
        lines += ["", "### Findings", "", findings.EXPLANATION, "", *items]
    return "\n".join(lines) + "\n"


def aligned(grid: list[list[str]]) -> list[str]:
    """A header row and body as terminal lines: columns padded to their widest cell, a rule
    under the header."""
    widths = [max(len(row[i]) for row in grid) for i in range(len(grid[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in grid]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def to_text(table: Table) -> str:
    """The terminal rendering: aligned columns, bold scores marked with '*'."""
    bold = "{}*".format
    lines = [_title(table), "", *aligned(_grid(table, bold)), "",
             *_notes(table, bold_name="*")]
    for section in _sections(table, bold):
        lines += ["", section.title, "", *aligned(section.grid), "", *section.notes]
    items = _findings_lines(table, lambda verdict: verdict.upper(), "    ")
    if items:
        lines += ["", "Findings", "", findings.EXPLANATION, "", *items]
    return "\n".join(lines) + "\n"


# Each character LaTeX reads otherwise, as LaTeX writes it; in one pass, so that no escape
# is escaped again. A researcher's row labels reach the table too ("< M": an inverted "!"
# in LaTeX's default font encoding unescaped).
_LATEX_ESCAPES = {
    **{c: "\\" + c for c in "&%$#_{}"}, "\\": r"\textbackslash{}", "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}", "<": "$<$", ">": "$>$", "±": r"$\pm$", "–": "--",
    "σ": r"$\sigma$"}
_LATEX_SPECIAL = re.compile("|".join(map(re.escape, _LATEX_ESCAPES)))


def _latex(text: str) -> str:
    return _LATEX_SPECIAL.sub(lambda match: _LATEX_ESCAPES[match.group()], text)


def _latex_table(grid: list[list[str]], numeric: int, caption: str) -> list[str]:
    """A booktabs `table` environment of text cells whose bold parts are marked \\x00...\\x01."""
    def line(cells: list[str]) -> str:
        escaped = (_latex(c).replace("\x00", "\\textbf{").replace("\x01", "}") for c in cells)
        return " & ".join(escaped) + r" \\"

    header, *body = grid
    spec = "l" * (len(header) - numeric) + "r" * numeric
    return [r"\begin{table}[t]", r"\centering", rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
            line(header), r"\midrule", *(line(row) for row in body), r"\bottomrule",
            r"\end{tabular}", rf"\caption{{{caption}}}", r"\end{table}"]


def to_latex(table: Table) -> str:
    """Booktabs `table` environments (needs \\usepackage{booktabs})."""
    bold = "\x00{}\x01".format  # markers, escaped by _latex_table
    lines = _latex_table(_grid(table, bold), len(_numeric_columns(table)),
                         f"{_latex(_title(table))}. "
                         + " ".join(_latex(note) for note in _notes(table)))
    for section in _sections(table, bold):
        lines += ["", *_latex_table(section.grid, section.numeric,
                                    " ".join(_latex(note) for note in section.notes))]
    items = findings_of(table)
    if items:
        lines += ["", r"\paragraph{Findings}", _latex(findings.EXPLANATION), r"\begin{itemize}"]
        for ours, paper in items:
            headline, details = findings.describe(ours, paper)
            lines += [rf"\item \textbf{{{ours.verdict}}}: {_latex(headline)}", r"\begin{itemize}",
                      *(rf"\item {_latex(detail)}" for detail in details), r"\end{itemize}"]
        lines.append(r"\end{itemize}")
    return "\n".join(lines) + "\n"


def to_csv(table: Table) -> str:
    """One line per (row, column): our mean, spread, seeds, status, bold flag and paper value;
    the pre-training held-out loss, when recorded, as the column `held_out_loss`."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["experiment", "preset", "row", "objective", "params", "cost", "column",
                     "tasks", "status", "mean", "std", "seeds", "bold", "paper"])
    for row in table.rows:
        cells = {**({"held_out_loss": row.held_out} if row.held_out else {}), **row.cells}
        for column, cell in cells.items():
            writer.writerow([table.experiment, table.preset, row.label, row.objective or "",
                             row.params_label, row.cost_label, column,
                             " ".join(table.columns.get(column, ())), cell.status,
                             "" if cell.mean is None else f"{cell.mean:.4f}",
                             f"{cell.std:.4f}", cell.seeds, int(cell.bold),
                             "" if cell.paper is None else f"{cell.paper:.2f}"])
    return out.getvalue()


def compute_csv(table: Table) -> str:
    """One line per row of a compute-matched sweep: its budget, steps and compute."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["experiment", "preset", "budget", "budget_reference", "row", "objective",
                     "steps", "flops_per_step", "tokens_per_step", "loss_tokens_per_step",
                     "pretrain_flops", "budget_spent"])
    for row in table.compute:
        writer.writerow([table.experiment, table.preset, table.budget.kind,
                         table.budget.reference, row.label, row.objective or "", row.steps,
                         f"{row.flops_per_step:.6g}", row.tokens_per_step,
                         f"{row.loss_tokens_per_step:.4f}", f"{row.pretrain_flops:.6g}",
                         f"{row.spent(table.budget):.6f}"])
    return out.getvalue()


def zero_shot_csv(table: Table) -> str:
    """One line per (row, task scored zero-shot, regime): mean, spread, seeds, status, bold."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["experiment", "preset", "row", "objective", "task", "regime", "status",
                     "mean", "std", "seeds", "bold"])
    for row in table.zero_shot:
        for task in row.zero_shot:
            for regime, field in ZERO_SHOT_REGIMES:
                cell = getattr(row, field)[task]
                writer.writerow([table.experiment, table.preset, row.label, row.objective or "",
                                 task, regime, cell.status,
                                 "" if cell.mean is None else f"{cell.mean:.4f}",
                                 f"{cell.std:.4f}", cell.seeds, int(cell.bold)])
    return out.getvalue()


def held_out_differences_csv(table: Table) -> str:
    """One line per `HeldOutDifference`: the row, the row it is compared with, the mean and
    spread over seeds, and each seed's difference ("seed:value" separated by spaces)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["experiment", "preset", "row", "objective", "reference", "mean", "std",
                     "seeds", "per_seed"])
    for row in table.held_out_differences:
        writer.writerow([table.experiment, table.preset, row.label, row.objective or "",
                         row.reference, f"{row.difference.mean:.4f}",
                         f"{row.difference.std:.4f}", row.difference.seeds,
                         " ".join(f"{seed}:{value:.4f}" for seed, value in row.per_seed.items())])
    return out.getvalue()


def findings_csv(table: Table) -> str:
    """One line per check of each finding: the finding's verdict, then the check's column,
    predicate, verdict and numbers, and the paper's margin for the same check."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["experiment", "claim", "source", "verdict", "column", "predicate",
                     "compared", "check_verdict", "margin", "two_sigma", "tolerance",
                     "paper_margin"])

    def number(value: float | None) -> str:
        return "" if value is None else f"{value:.4f}"

    for ours, paper in findings_of(table):
        published = {(check.predicate, check.column): check.margin for check in paper.checks}
        for check in ours.checks:
            writer.writerow([table.experiment, ours.finding.claim, ours.finding.source,
                             ours.verdict, check.column, check.predicate.describe(),
                             check.compared, check.verdict, number(check.margin),
                             number(check.threshold if check.margin is not None else None),
                             number(check.tolerance),
                             number(published.get((check.predicate, check.column)))])
    return out.getvalue()
