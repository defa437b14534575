"""The paper's reference numbers and the comparison report built from a results.jsonl."""
import csv
import io
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats
from matplotlib.figure import Figure

from t5x_lite import (accounting, grid, paper_results, report, report_plots, report_render,
                      report_table, sweep_point)
from t5x_lite.architectures import names as architecture_names
from t5x_lite.config import ConfigError, model_config
from t5x_lite.report_table import Cell

DATA = os.path.join(os.path.dirname(__file__), "data")


# ----------------------------------------------------------------------------- paper results


def test_paper_tables_have_the_contract_row_labels_in_order():
    labels = {name: [(row.row, row.objective) for row in table.rows]
              for name, table in paper_results.PAPER_TABLES.items()}
    architectures = ["Encoder-decoder", "Enc-dec, shared", "Enc-dec, 6 layers",
                     "Language model", "Prefix LM"]
    assert labels["table2"] == ([(a, "Denoising") for a in architectures]
                                + [(a, "LM") for a in architectures])
    rows = {name: [row for row, _ in pairs] for name, pairs in labels.items()}
    assert rows["table4"] == ["Prefix language modeling", "BERT-style", "Deshuffling"]
    assert rows["table5"] == ["BERT-style", "MASS-style", "Replace corrupted spans",
                              "Drop corrupted tokens"]
    assert rows["table6"] == ["10%", "15%", "25%", "50%"]
    assert rows["table7"] == ["i.i.d.", "2", "3", "5", "10"]


def test_paper_numbers_spot_checks():
    # Values typed from the paper (issue 7), one per table, read back through the lookup.
    table2 = paper_results.PAPER_TABLES["table2"]
    assert table2.find("Language model", "LM").scores["SQuAD"] == 53.81
    assert table2.find("Enc-dec, 6 layers", "Denoising").scores == dict(
        zip(paper_results.COLUMNS, (80.88, 18.97, 77.59, 68.42, 26.38, 38.40, 26.95)))
    assert paper_results.PAPER_TABLES["table4"].find("Deshuffling", None).scores["GLUE"] == 73.17
    assert paper_results.PAPER_TABLES["table5"].find("Drop corrupted tokens", None) \
        .scores["GLUE"] == 84.44
    assert paper_results.PAPER_TABLES["table6"].find("25%", None).scores["CNNDM"] == 19.54
    assert paper_results.PAPER_TABLES["table7"].find("3", None).scores["SGLUE"] == 72.53
    # The baseline is the same run in Tables 2, 5, 6 and 7.
    baseline = table2.find("Encoder-decoder", "Denoising").scores
    for name, row in (("table5", "Replace corrupted spans"), ("table6", "15%"),
                      ("table7", "i.i.d.")):
        assert paper_results.PAPER_TABLES[name].find(row, None).scores == baseline
    assert paper_results.BASELINE_STD["SQuAD"] == 0.343
    assert table2.find("Prefix LM", None) is None  # Table 2 rows need their objective


@pytest.mark.parametrize("task, column", [
    ("glue_cola", "GLUE"), ("local_glue_rte", "GLUE"), ("glue_mnli_matched", "GLUE"),
    ("glue_wnli", None), ("cnn_dailymail", "CNNDM"), ("local_dialogsum", "CNNDM"),
    ("squad", "SQuAD"), ("local_squad", "SQuAD"), ("wmt_enfr", "EnFr"),
    ("local_multi30k_ende", "EnDe"), ("local_rosts_enro", "EnRo"), ("builtin_reverse", None),
])
def test_paper_column_of_each_task(task, column):
    assert paper_results.paper_column(task) == column


def test_headline_scores_are_the_papers_metrics():
    assert paper_results.headline_score("squad", {"em": 80.0, "f1": 88.0}) == 80.0
    rouge = {"rouge1": 40.0, "rouge2": 19.0, "rougeLsum": 37.0}
    assert paper_results.headline_score("local_dialogsum", rouge) == 19.0
    # Without a paper metric: the mean of the task's metrics (T5's multi-metric convention).
    assert paper_results.headline_score("builtin_sort", {"a": 10.0, "b": 20.0}) == 15.0
    with pytest.raises(ValueError, match="'squad' reports 'em' in the paper, but its metrics "
                                         "are f1"):
        paper_results.headline_score("squad", {"f1": 88.0})


def test_two_points_with_one_row_label_are_refused_not_merged():
    """The later point's scores overwrote the earlier's in one row (records of a sweep made
    before the grid refused such labels)."""
    records = [{"experiment": "table6", "preset": "demo", "point": point, "row": "15%",
                "seed": 0, "task": "builtin_reverse", "status": "ok",
                "metrics": {"accuracy": score}}
               for point, score in (("rate_15", 50.0), ("rate_15_long", 60.0))]
    with pytest.raises(ValueError, match=r"^points rate_15, rate_15_long share the row '15%': "
                                         r"a row of the table holds one point"):
        report_table.build_table(records)


def test_group_columns_and_column_score():
    columns = paper_results.group_columns(
        ["builtin_reverse", "local_glue_rte", "local_squad", "local_glue_cola", "builtin_reverse"])
    assert columns == {"GLUE": ("local_glue_cola", "local_glue_rte"), "SQuAD": ("local_squad",),
                       "builtin_reverse": ("builtin_reverse",)}
    glue = {"local_glue_cola": {"matthews_corrcoef": 20.0}, "local_glue_rte": {"accuracy": 60.0}}
    assert paper_results.column_score("GLUE", glue) == 40.0
    with pytest.raises(ValueError, match="'wmt_ende' and 'local_multi30k_ende' both stand in "
                                         "for the paper column 'EnDe'"):
        paper_results.group_columns(["wmt_ende", "local_multi30k_ende"])
    # In GLUE: one task per part of its average (glue_mnli's validation is MNLI matched).
    with pytest.raises(ValueError, match="'glue_rte' and 'local_glue_rte' both stand in for the "
                                         "GLUE part 'rte'"):
        paper_results.group_columns(["glue_rte", "glue_cola", "local_glue_rte"])
    with pytest.raises(ValueError, match="'glue_mnli' and 'glue_mnli_matched' both stand in for "
                                         "the GLUE part 'mnli matched'"):
        paper_results.group_columns(["glue_mnli", "glue_mnli_matched"])
    assert paper_results.group_columns(["glue_mnli", "glue_mnli_mismatched", "glue_wnli"]) == {
        "GLUE": ("glue_mnli", "glue_mnli_mismatched"), "glue_wnli": ("glue_wnli",)}


_EXPERIMENT = """
from t5x_lite import presets

GRID = ({rows})


def get_config(preset):
    return presets.sweep_preset(preset)
"""


def _experiment_file(directory, name, *rows):
    path = directory / f"{name}.py"
    path.write_text(_EXPERIMENT.format(rows="".join(
        f"dict(point={point!r}, row={row!r}, objective={objective!r}, overrides={{}}), "
        for point, row, objective in rows)))
    return str(path)


def test_sweep_rejects_a_grid_row_the_paper_table_does_not_have(tmp_path):
    # A file named after a paper table is compared with it, so its rows must be the table's.
    bad = _experiment_file(tmp_path, "table6", ("rate_15", "15%", None),
                           ("rate_30", "30%", None))
    with pytest.raises(ConfigError, match=r"table6 point 'rate_30': row '30%' is not a row of "
                                          r"the paper's Table 6.*'10%', '15%', '25%', '50%'"):
        grid.expand(bad, "demo")
    # Table 2's rows are told apart by their objective too.
    (tmp_path / "t2").mkdir()
    bad = _experiment_file(tmp_path / "t2", "table2", ("ed", "Encoder-decoder", "Deshuffling"))
    with pytest.raises(ConfigError, match=r"table2 point 'ed': row 'Encoder-decoder' with "
                                          r"objective 'Deshuffling' is not a row of the paper's "
                                          r"Table 2.*'Encoder-decoder' \(Denoising\)"):
        grid.expand(bad, "demo")
    good = _experiment_file(tmp_path / "t2", "table2", ("ed", "Encoder-decoder", "LM"))
    assert [p.row for p in grid.expand(good, "demo")] == ["Encoder-decoder"]


def test_an_experiment_of_ones_own_has_no_paper_rows_to_match(tmp_path):
    mine = _experiment_file(tmp_path, "my_ablation", ("a", "My row", None),
                            ("b", "30%", "Whatever"))
    # Its two rows have one config, so the grid also warns that they compute the same runs.
    with pytest.warns(UserWarning, match=r"my_ablation --preset demo: rows 'My row' \(a\) and "
                      r"'30%' \(b\) will give the same records: their configs are the same"):
        assert [p.row for p in grid.expand(mine, "demo")] == ["My row", "30%"]


# ----------------------------------------------------------------------------- rules


def test_bolding_rule_within_two_standard_deviations():
    # best 10, 2 x 0.6 = 1.2: 9 is within, 8.5 is not; a missing score is never bold.
    assert report_table.bold_flags([10.0, 9.0, 8.5, None], std=0.6) == [True, True, False, False]
    # One seed: no spread, so only the best and exact ties.
    assert report_table.bold_flags([7.0, 9.0, 9.0], std=0.0) == [False, True, True]
    assert report_table.bold_flags([None, None], std=1.0) == [False, False]


def test_pooled_std_uses_cells_with_several_seeds():
    cells = [Cell("ok", 1.0, std=1.0, seeds=2), Cell("ok", 2.0, std=3.0, seeds=3),
             Cell("ok", 5.0, std=0.0, seeds=1), Cell("failed")]
    assert report_table.pooled_std(cells) == pytest.approx(math.sqrt((1 + 9) / 2))
    assert report_table.pooled_std([Cell("ok", 1.0, seeds=1)]) == 0.0


@pytest.mark.parametrize("ours, paper, expected", [
    ([1, 2, 3, 4], [10, 20, 30, 40], 1.0),
    ([1, 2, 3, 4], [40, 30, 20, 10], -1.0),
    ([1, 2, 3, 4], [1, 2, 4, 3], 4 / 6),  # 5 concordant, 1 discordant pair of 6
    # One tie in ours (pairs 6, tied 1): tau-b = (5 - 0) / sqrt((6 - 1) * 6).
    ([11, 8, 11, 10], [19.24, 17.93, 18.61, 18.59], 5 / math.sqrt(30)),
])
def test_kendall_tau_hand_cases_and_scipy(ours, paper, expected):
    assert report_table.kendall_tau(ours, paper) == pytest.approx(expected)
    assert report_table.kendall_tau(ours, paper) == pytest.approx(
        scipy.stats.kendalltau(ours, paper).statistic)


def test_kendall_tau_undefined():
    assert report_table.kendall_tau([1.0], [2.0]) is None
    assert report_table.kendall_tau([1.0, 1.0], [1.0, 2.0]) is None  # constant: no order to compare


# ----------------------------------------------------------------------------- the report


@pytest.fixture
def workdir(tmp_path):
    """A workdir holding the hand-written results of tests/data/results_table2.jsonl."""
    shutil.copy(os.path.join(DATA, "results_table2.jsonl"), tmp_path / "results.jsonl")
    return tmp_path


def _report(workdir, **kwargs):
    with pytest.warns(UserWarning) as caught:
        result = report.report(str(workdir), **kwargs)
    return result, [str(w.message) for w in caught]


def test_markdown_table_matches_the_hand_written_expectation(workdir):
    result, warned = _report(workdir)
    with open(os.path.join(DATA, "results_table2.md"), encoding="utf-8") as f:
        expected = f.read()
    with open(workdir / "report" / "table.md", encoding="utf-8") as f:
        table, _ = f.read().split("\n### Findings\n")
    assert table == expected  # the Findings section: test_findings_of_the_fixture
    # Lines 23 (no task), 29 (unknown status) and 30 (cut off by a kill) are skipped, each
    # named once.
    assert [w.split("results.jsonl ")[1].split(":")[0:2] for w in warned] == [
        ["line 23", " field 'task' is missing or not a str; skipped"],
        ["line 29", " status 'done' is not one of ok, failed, not_applicable; skipped"],
        ["line 30", " skipping a partly written last line (a killed run's)"],
    ]
    assert "Encoder-decoder  LM         2P      M     56.00 ± 1.41 (79.56)" in result.text
    assert "61.00* ± 1.41 (83.28)" in result.text


def test_findings_of_the_fixture(workdir):
    """The paper's Table 2 findings judged on the fixture's table (results_table2.md). Spreads
    over seeds: GLUE 1.41, CNNDM 1.00, builtin_reverse 2.31, so 2 sigma 2.83, 2.00, 4.62."""
    result, _ = _report(workdir)
    verdicts = {ours.finding.claim: ours for ours, _ in report_table.findings_of(result.table)}
    best = verdicts["The encoder-decoder with the denoising objective performs best on every "
                    "task."]
    # GLUE: 61 vs Prefix LM's 59, the top but within 2 sigma; CNNDM: 11 tied with Prefix LM's
    # 11; builtin_reverse: 72 tied with Prefix LM's (Enc-dec, shared's 80 is left out: the
    # paper finds sharing nearly as good).
    assert [(c.column, c.verdict) for c in best.checks] == [
        ("GLUE", "cannot separate"), ("CNNDM", "cannot separate"),
        ("builtin_reverse", "cannot separate")]
    assert best.verdict == "cannot separate"
    assert "the best of the others Prefix LM (Denoising) at 59.00" in best.checks[0].compared
    # The language model (denoising) is 8, 3 and 30 below the worst of the others; its LM row
    # did not run.
    worst = verdicts["The plain decoder-only language model, whose causal mask also covers the "
                     "input, is the worst architecture."]
    assert worst.verdict == "supports"
    assert [c.margin for c in worst.checks if c.verdict != "not run"] == [8.0, 3.0, 30.0]
    # No architecture ran both objectives with every column: nothing to compare.
    denoising = verdicts["A denoising objective always gives better downstream performance "
                         "than language modeling."]
    assert denoising.verdict == "not run"
    text = result.text[result.text.index("\nFindings\n"):]
    assert "- CANNOT SEPARATE: The encoder-decoder with the denoising objective performs best " \
           "on every task (section 3.2.4)." in text
    assert ("GLUE: Encoder-decoder (Denoising) at 61.00, the best of the others Prefix LM "
            "(Denoising) at 59.00: +2.00 (paper +1.46), 2σ 2.83: cannot separate.") in text
    # the paper: 83.28 vs Prefix LM (Denoising)'s 81.82
    assert ("builtin_reverse: Encoder-decoder (Denoising) at 72.00, the best of the others "
            "Prefix LM (Denoising) at 72.00 (without Encoder-decoder (LM)): +0.00") in text
    assert "- SUPPORTS: The plain decoder-only language model" in text
    assert "- NOT RUN: A denoising objective always gives" in text
    with open(workdir / "report" / "table.md", encoding="utf-8") as f:
        markdown = f.read()
    assert "- **cannot separate**: The encoder-decoder with the denoising objective" in markdown
    assert "- **supports**: The plain decoder-only language model" in markdown
    with open(workdir / "report" / "findings.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert {(r["column"], r["check_verdict"], r["paper_margin"]) for r in rows
            if r["claim"] == best.finding.claim} == {
        ("GLUE", "cannot separate", "1.4600"), ("CNNDM", "cannot separate", "0.2700"),
        ("builtin_reverse", "cannot separate", "")}


def test_one_seed_findings_say_there_is_no_spread(tmp_path):
    _write(tmp_path / "results.jsonl", [
        _record(point="a", row="10%", metrics={"accuracy": 50.0}),
        _record(point="b", row="15%", metrics={"accuracy": 50.5}),
        _record(point="c", row="25%", metrics={"accuracy": 49.8}),
        _record(point="d", row="50%", metrics={"accuracy": 40.0}),
    ])
    text = report.report(str(tmp_path)).text
    # 10%, 15% and 25% range over 0.7, within 2.5% of about 50: similar, by sign alone.
    assert ("- SUPPORTS: The corruption rate has a limited effect on performance (section "
            "3.3.3). One seed: no spread to judge by, so any difference counts."
            in text)
    # The GLUE and SQuAD comparisons of 15% and 50% have no column to run in.
    assert "- NOT RUN: A corruption rate of 50% significantly degrades" in text


def test_paper_average_column_only_when_a_task_has_no_paper_column(workdir):
    with pytest.warns(UserWarning):
        records = report_table.read_results(str(workdir / "results.jsonl"))
    mapped = report_table.build_table([r for r in records if r["task"] != "builtin_reverse"])
    assert "Paper avg" not in report_render.to_markdown(mapped)
    with_builtin = report_render.to_text(report_table.build_table(records))
    assert with_builtin.splitlines()[2].rstrip().endswith("Paper avg")


def test_latex_escapes_every_character_latex_reads_otherwise_once():
    """A researcher's labels reach table.tex as written: the README's own cost label "< M"
    typeset as an inverted "!", and a backslash, ~ or ^ as commands; an escape's own
    backslash and braces are not escaped again."""
    assert report_render._latex(r"< M ~x^2 \ a_b & {1}% #$ > ± σ –") == (
        r"$<$ M \textasciitilde{}x\textasciicircum{}2 \textbackslash{} a\_b \& \{1\}\% \#\$ "
        r"$>$ $\pm$ $\sigma$ --")


def test_csv_and_latex_hold_the_same_cells(workdir):
    _report(workdir)
    with open(workdir / "report" / "table.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5 * 3  # five rows, three columns
    first = rows[0]
    assert (first["row"], first["objective"], first["column"], first["mean"], first["std"],
            first["seeds"], first["bold"], first["paper"]) == (
        "Encoder-decoder", "Denoising", "GLUE", "61.0000", "1.4142", "2", "1", "83.28")
    failed = [r for r in rows if r["status"] == "failed"]
    assert [(r["row"], r["objective"], r["column"]) for r in failed] == [
        ("Encoder-decoder", "LM", "builtin_reverse")]
    with open(workdir / "report" / "table.tex", encoding="utf-8") as f:
        latex = f.read()
    assert r"\textbf{61.00} $\pm$ 1.41 (83.28)" in latex
    assert (r"Architecture & Objective & Params & Cost & GLUE & CNNDM & builtin\_reverse & "
            r"Paper avg \\") in latex
    assert r"\begin{tabular}{llllrrrr}" in latex  # four label columns, four numeric ones


def test_plots_are_written(workdir):
    result, _ = _report(workdir, out_dir=str(workdir / "out"))
    pngs = sorted(os.path.basename(p) for p in result.files if p.endswith(".png"))
    assert pngs == ["bars_CNNDM.png", "bars_GLUE.png", "bars_builtin_reverse.png",
                    "pretrain_loss.png"]
    for path in result.files:
        assert os.path.dirname(path) == str(workdir / "out")
        if path.endswith(".png"):
            with open(path, "rb") as f:
                assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_bar_plots_draw_each_row_s_mean_its_spread_and_the_paper_s_number(workdir,
                                                                             monkeypatch):
    """What a bar plot shows, not only that it is a PNG: a bar per row at its mean, an error
    bar of its spread over seeds, and the paper's number as a diamond at its row."""
    figures = {}
    monkeypatch.setattr(report_plots, "_save",
                        lambda figure, path: figures.__setitem__(os.path.basename(path), figure))
    result, _ = _report(workdir, out_dir=str(workdir / "plots"))
    cells = [row.cells["GLUE"] for row in result.table.rows]
    assert any(cell.std > 0 for cell in cells) and any(cell.paper for cell in cells)
    axes = figures["bars_GLUE.png"].axes[0]
    from matplotlib.container import BarContainer

    bars = next(c for c in axes.containers if isinstance(c, BarContainer))
    assert [bar.get_height() for bar in bars] == pytest.approx([c.mean or 0.0 for c in cells])
    segments = bars.errorbar.lines[2][0].get_segments()
    assert [(top[1] - bottom[1]) / 2 for bottom, top in segments] == pytest.approx(
        [c.std for c in cells])
    diamonds = np.asarray(axes.collections[-1].get_offsets())
    np.testing.assert_allclose(diamonds, [(i, c.paper) for i, c in enumerate(cells)
                                          if c.paper is not None])


def test_the_command_draws_its_plots_off_screen_without_a_display(workdir):
    """`t5x-lite report` over SSH: no DISPLAY, no MPLBACKEND; it writes the PNGs and never
    loads pyplot (which would pick an interactive backend where one is installed). The
    fixture's three skipped lines are one line each on stderr, as the command's errors are."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "MPLBACKEND")}
    code = ("import sys; from t5x_lite import cli; cli.main(['t5x-lite', 'report', sys.argv[1]]); "
            "print('pyplot loaded' if 'matplotlib.pyplot' in sys.modules else 'no pyplot')")
    done = subprocess.run([sys.executable, "-c", code, str(workdir)], env=env, timeout=300,
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "no pyplot", done.stderr
    skipped = [line for line in done.stderr.splitlines() if "results.jsonl line" in line]
    assert [line.split(": ")[:2] for line in skipped] == [["t5x-lite report", "warning"]] * 3
    assert "UserWarning" not in done.stderr and "warnings.warn" not in done.stderr
    assert (workdir / "report" / "pretrain_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _write(path, records):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))


def _record(**fields):
    return {"experiment": "table6", "preset": "tiny", "point": "p", "row": "15%", "seed": 0,
            "task": "builtin_reverse", "status": "ok", "metrics": {"accuracy": 50.0}, **fields}


def _matched(point, row, steps, flops_per_step, **fields):
    """A record of a flops-matched sweep (the fields `sweep_point._budget_fields` adds)."""
    return _record(point=point, row=row, budget="flops", budget_reference="rate_10",
                   budget_reference_steps=100, budget_total=100 * 3e9, pretrain_steps=steps,
                   flops_per_step=flops_per_step, tokens_per_step=512,
                   loss_tokens_per_step=40.5, pretrain_flops=steps * flops_per_step, **fields)


def test_a_report_interrupted_while_rendering_leaves_every_file_whole(tmp_path, monkeypatch):
    """Each file is written whole or not at all: a report stopped while making a file (a
    signal, a bug in a renderer) leaves the previous report's file, not an empty one."""
    _write(tmp_path / "results.jsonl", [
        _matched("rate_10", "10%", 100, 3e9), _matched("rate_15", "15%", 120, 2.5e9)])
    report.report(str(tmp_path))
    before = (tmp_path / "report" / "table.tex").read_text()
    assert before

    def interrupted(table):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "to_latex", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report.report(str(tmp_path))
    assert (tmp_path / "report" / "table.tex").read_text() == before
    # A plot interrupted while being written: the old one stays, no partial file.
    monkeypatch.undo()
    plots = {plot: plot.read_bytes() for plot in (tmp_path / "report").glob("*.png")}
    assert plots

    def half_written(figure, target, **kwargs):
        target.write(b"half a png")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", half_written)
    with pytest.raises(KeyboardInterrupt):
        report.report(str(tmp_path))
    assert {plot: plot.read_bytes() for plot in plots} == plots
    assert sorted(p.name for p in (tmp_path / "report").iterdir()
                  if p.name.startswith(".") or "partial" in p.name) == []


def test_a_compute_matched_sweep_gets_a_compute_table_in_every_rendering(tmp_path):
    _write(tmp_path / "results.jsonl", [
        _matched("rate_10", "10%", 100, 3e9), _matched("rate_15", "15%", 120, 2.5e9),
        _matched("rate_15", "15%", 120, 2.5e9, seed=1)])
    result = report.report(str(tmp_path))
    table = result.table
    assert table.budget == report_table.Budget("flops", "rate_10", 100, 3e11)
    assert [(c.label, c.steps, c.pretrain_flops) for c in table.compute] == [
        ("10%", 100, 3e11), ("15%", 120, 3e11)]
    markdown = (tmp_path / "report" / "table.md").read_text()
    assert markdown.startswith("## Table 6: ") and "compute-matched: sweep.budget=flops" in \
        markdown.splitlines()[0]
    assert "| 15% | 120 | 2.5e+09 | 512 | 40.5 | 3e+11 | 1.000 |" in markdown
    assert "spend what rate_10 spends in its 100 configured steps, 3e+11 training FLOPs" in markdown
    compute = result.text[result.text.index("Pre-training compute per point"):].splitlines()
    assert next(line for line in compute if line.startswith("15%")).split() == [
        "15%", "120", "2.5e+09", "512", "40.5", "3e+11", "1.000"]
    latex = (tmp_path / "report" / "table.tex").read_text()
    assert latex.count(r"\begin{tabular}") == 2 and r"15\% & 120 & 2.5e+09 & 512" in latex
    rows = list(csv.DictReader(io.StringIO((tmp_path / "report" / "compute.csv").read_text())))
    assert [(r["row"], r["steps"], r["budget"], r["budget_spent"]) for r in rows] == [
        ("10%", "100", "flops", "1.000000"), ("15%", "120", "flops", "1.000000")]
    # A point that rounded to more than it was given says so, in the budget's own unit.
    tokens = report_table.Compute("25%", None, 7, 1e9, 512, 40.0, 7e9)
    assert tokens.spent(report_table.Budget("tokens", "rate_10", 6, 6 * 512)) == pytest.approx(
        7 / 6)
    assert tokens.spent(report_table.Budget("flops", "rate_10", 5, 5e9)) == pytest.approx(1.4)
    # Records of a sweep with the default budget have none of it.
    default = tmp_path / "default"
    default.mkdir()
    _write(default / "results.jsonl", [_record(point="rate_10", row="10%")])
    result = report.report(str(default))
    assert result.table.budget is None
    assert "compute-matched" not in result.text.lower()
    assert "Pre-training compute" not in result.text
    assert not (default / "report" / "compute.csv").exists()


def test_the_held_out_loss_is_a_column_beside_the_scores_over_seeds(tmp_path):
    # Two seeds per row (one record per seed and task).
    losses = {"10%": (3.0, 3.2), "15%": (3.1, 3.3), "50%": (4.0, 4.2)}
    _write(tmp_path / "results.jsonl", [
        _record(point=f"rate_{row[:-1]}", row=row, seed=seed, task=task, held_out_loss=loss)
        for row, pair in losses.items() for seed, loss in enumerate(pair)
        for task in ("builtin_reverse", "builtin_module")])
    result = report.report(str(tmp_path))
    cells = {row.label: row.held_out for row in result.table.rows}
    spread = math.sqrt(0.02)  # each row's sample sd is sqrt(0.02); pooled the same
    assert [c.mean for c in cells.values()] == pytest.approx([3.1, 3.2, 4.1])
    # Records that do not name their examples (written before `held_out_examples`): no row
    # is known to compare with another, so none is bold.
    assert [(c.seeds, c.bold) for c in cells.values()] == [(2, False)] * 3
    assert [row.held_out_group for row in result.table.rows] == [None] * 3
    assert not result.table.held_out_differences
    assert not (tmp_path / "report" / "held_out_differences.csv").exists()
    assert cells["10%"].std == pytest.approx(spread)
    markdown = (tmp_path / "report" / "table.md").read_text()
    header = next(line for line in markdown.splitlines() if line.startswith("| Corruption"))
    assert header.split(" | ")[2:4] == ["Cost", "Held-out loss"]
    assert "| 3.10 ± 0.14 | " in markdown and "| 4.10 ± 0.14 | " in markdown
    assert f"lowest of such rows (spread over seeds {spread:.3f})." in markdown
    assert "Not known which examples (a sweep older than the records' held_out_examples): " \
        "10%, 15%, 50%." in markdown
    rows = list(csv.DictReader(io.StringIO((tmp_path / "report" / "table.csv").read_text())))
    held = [(r["row"], r["mean"], r["seeds"]) for r in rows if r["column"] == "held_out_loss"]
    assert held == [("10%", "3.1000", "2"), ("15%", "3.2000", "2"), ("50%", "4.1000", "2")]
    # Neither a score column nor part of the average.
    assert list(result.table.columns) == ["builtin_reverse", "builtin_module"]
    # Records without it (eval_every 0, or written before it existed): no column.
    plain = tmp_path / "plain"
    plain.mkdir()
    _write(plain / "results.jsonl", [_record(point="rate_10", row="10%")])
    assert "Held-out loss" not in report.report(str(plain)).text


def test_a_held_out_loss_that_is_not_finite_makes_its_row_undefined_not_its_group(tmp_path):
    """One NaN loss (a held-out pass that overflowed) made its row nan ± nan, the group's
    spread NaN (so no row bold, not even the lowest) and every paired difference NaN."""
    losses = {"10%": (3.0, 3.2), "15%": (3.1, float("nan")), "25%": (4.0, 4.2), "50%": (3.05, 3.25)}
    _write(tmp_path / "results.jsonl", [
        _record(point=f"rate_{row[:-1]}", row=row, seed=seed, held_out_loss=loss,
                held_out_examples=f"x{seed}")
        for row, pair in losses.items() for seed, loss in enumerate(pair)])
    result = report.report(str(tmp_path))
    cells = {row.label: row.held_out for row in result.table.rows}
    assert cells["15%"].status == "undefined"
    assert [(cells[r].mean, cells[r].bold) for r in ("10%", "25%", "50%")] == [
        (pytest.approx(3.1), True), (pytest.approx(4.1), False), (pytest.approx(3.15), True)]
    assert {row.label: row.held_out_group for row in result.table.rows} == {
        "10%": 1, "15%": None, "25%": 1, "50%": 1}
    differences = {d.label: d.difference.mean for d in result.table.held_out_differences}
    assert differences == {"25%": pytest.approx(1.0), "50%": pytest.approx(0.05)}
    assert "| undefined |" in (tmp_path / "report" / "table.md").read_text()
    assert "nan" not in result.text


def test_held_out_losses_are_compared_only_among_rows_that_scored_the_same_examples(tmp_path):
    """Table 2's rows: the denoising rows scored one set of examples per seed, the LM rows of
    the encoder-decoders and the prefix LM another (the prefix LM objective), the language
    model a third (its causal LM objective) with the lowest loss of all: bold is the paper's
    rule within each set of two or more rows, so never the language model's."""
    def rows(objective, losses, examples):
        return [_record(experiment="table2", point=f"{row}/{objective}", row=row,
                        objective=objective, seed=seed, held_out_loss=loss,
                        held_out_examples=f"{examples}{seed}",
                        held_out_curve=[[100, loss + 1.0], [200, loss]])
                for row, pair in losses.items() for seed, loss in enumerate(pair)]

    records = [
        *rows("Denoising", {"Encoder-decoder": (3.0, 3.2), "Enc-dec, shared": (2.95, 3.25),
                            "Enc-dec, 6 layers": (3.6, 3.8)}, "d"),
        *rows("LM", {"Encoder-decoder": (4.0, 4.2), "Prefix LM": (4.4, 4.6)}, "p"),
        *rows("LM", {"Language model": (2.0, 2.2)}, "c"),
        # Another set of examples in seed 1 (say, another corruption rate): not comparable.
        _record(experiment="table2", point="x", row="Prefix LM", objective="Denoising", seed=0,
                held_out_loss=1.0, held_out_examples="d0"),
        _record(experiment="table2", point="x", row="Prefix LM", objective="Denoising", seed=1,
                held_out_loss=1.0, held_out_examples="e1"),
    ]
    _write(tmp_path / "results.jsonl", records)
    result = report.report(str(tmp_path))
    held = {(row.label, row.objective): (row.held_out.bold, row.held_out_group)
            for row in result.table.rows}
    # Bold within two pooled sds of the group's lowest mean: denoising, 2 x 0.168 of 3.10.
    assert held == {("Encoder-decoder", "Denoising"): (True, 1),
                    ("Enc-dec, shared", "Denoising"): (True, 1),
                    ("Enc-dec, 6 layers", "Denoising"): (False, 1),
                    ("Prefix LM", "Denoising"): (False, 2),
                    ("Encoder-decoder", "LM"): (True, 3),
                    ("Prefix LM", "LM"): (False, 3),
                    ("Language model", "LM"): (False, 4)}
    markdown = (tmp_path / "report" / "table.md").read_text()
    assert "| **3.10** ± 0.14 |" in markdown and "| 2.10 ± 0.14 |" in markdown
    assert ("Scored the same examples: Encoder-decoder (Denoising), Enc-dec, shared "
            "(Denoising), Enc-dec, 6 layers (Denoising); Encoder-decoder (LM), Prefix LM (LM). "
            "Alone: Prefix LM (Denoising), Language model (LM).") in markdown
    assert (tmp_path / "report" / "held_out_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The curves: a panel per objective, a line per row, the mean of its seeds.
    figure = report_plots._curves_figure(records, "held_out_curve", "held-out")
    panels = {axes.get_title(): axes for axes in figure.axes}
    assert list(panels) == ["Denoising", "LM"]
    lines = {line.get_label(): line for line in panels["Denoising"].get_lines()}
    assert list(lines) == ["Encoder-decoder", "Enc-dec, shared", "Enc-dec, 6 layers"]
    assert list(lines["Encoder-decoder"].get_xdata()) == [100, 200]
    assert list(lines["Encoder-decoder"].get_ydata()) == pytest.approx([4.1, 3.1])
    assert [line.get_label() for line in panels["LM"].get_lines()] == [
        "Encoder-decoder", "Prefix LM", "Language model"]
    assert "mean of seeds 0, 1; shaded: their range" in figure.get_suptitle()

    # Paired by seed within each group, against the group's first row.
    paired = [(d.label, d.objective, d.reference, d.per_seed)
              for d in result.table.held_out_differences]
    assert paired == [
        ("Enc-dec, shared", "Denoising", "Encoder-decoder (Denoising)",
         pytest.approx({0: -0.05, 1: 0.05})),
        ("Enc-dec, 6 layers", "Denoising", "Encoder-decoder (Denoising)",
         pytest.approx({0: 0.6, 1: 0.6})),
        ("Prefix LM", "LM", "Encoder-decoder (LM)", pytest.approx({0: 0.4, 1: 0.4}))]
    assert ("| Enc-dec, shared | Denoising | Encoder-decoder (Denoising) | +0.000 ± 0.071 | "
            "1 of 2 seeds | -0.050, +0.050 |") in markdown
    assert "### Held-out loss, paired by seed" in markdown
    assert "Held-out loss, paired by seed" in result.text
    assert r"Enc-dec, 6 layers & Denoising & Encoder-decoder (Denoising) & +0.600 $\pm$ 0.000" \
        in (tmp_path / "report" / "table.tex").read_text()
    lines = (tmp_path / "report" / "held_out_differences.csv").read_text().splitlines()
    assert lines[0] == "experiment,preset,row,objective,reference,mean,std,seeds,per_seed"
    assert lines[3] == "table2,tiny,Prefix LM,LM,Encoder-decoder (LM),0.4000,0.0000,2," \
        "0:0.4000 1:0.4000"


def test_paired_values_name_their_seeds_when_groups_have_different_seeds(tmp_path):
    """A seed that failed for one group's rows leaves that group fewer seeds than another's:
    the note cannot name one seed list, so each paired value names its seed."""
    records = [_record(point=f"{row}/{objective}", row=row, objective=objective, seed=seed,
                       held_out_loss=loss + seed / 10, held_out_examples=f"{objective}{seed}")
               for objective, rows, seeds in (("A", {"x": 3.0, "y": 3.5}, (0, 1, 2)),
                                              ("B", {"x": 4.0, "y": 3.8}, (0, 2)))
               for row, loss in rows.items() for seed in seeds]
    _write(tmp_path / "results.jsonl", records)
    report.report(str(tmp_path))
    markdown = (tmp_path / "report" / "table.md").read_text()
    assert "| 2 of 2 seeds | 0: -0.200, 2: -0.200 |" in markdown
    assert "| 0 of 3 seeds | 0: +0.500, 1: +0.500, 2: +0.500 |" in markdown
    assert "in each seed (the seeds its group shares, named in Per seed)" in markdown
    # One seed set for all: the values are bare and the note names the seeds once.
    _write(tmp_path / "results.jsonl", [r for r in records if r["seed"] != 1])
    report.report(str(tmp_path))
    markdown = (tmp_path / "report" / "table.md").read_text()
    assert "| 0 of 2 seeds | +0.500, +0.500 |" in markdown
    assert "in each seed (0, 2)," in markdown


def test_records_of_two_experiments_are_an_error(tmp_path):
    _write(tmp_path / "results.jsonl",
           [_record(), _record(experiment="table4", row="BERT-style")])
    with pytest.raises(ValueError, match=r"mixes the records of several sweeps: table4 \(preset "
                                         r"tiny\), table6 \(preset tiny\)"):
        report.report(str(tmp_path))


def test_missing_or_empty_results(tmp_path):
    with pytest.raises(FileNotFoundError, match="results.jsonl does not exist"):
        report.report(str(tmp_path))
    started = tmp_path / "started"  # a sweep that has claimed its workdir, recorded nothing
    started.mkdir()
    (started / "sweep.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="has recorded no point yet"):
        report.report(str(started))
    (tmp_path / "results.jsonl").write_text("[1, 2]\n")
    with pytest.warns(UserWarning, match="line 1: not a JSON object"):
        with pytest.raises(ValueError, match="holds no usable records"):
            report.report(str(tmp_path))


def test_a_record_whose_optional_fields_are_malformed_is_skipped_with_a_warning(tmp_path):
    """Hand-edited fields the table groups or sorts by were tracebacks (unhashable list, a
    string compared with ints)."""
    _write(tmp_path / "results.jsonl", [
        _record(), _record(point="b", row="B", held_out_examples=["x"]),
        _record(point="c", row="C", grid_index="3")])
    with pytest.warns(UserWarning) as caught:
        table = report.report(str(tmp_path)).table
    assert [str(w.message).split(": ", 1)[1] for w in caught] == [
        "'held_out_examples' is not a string (the held-out text's fingerprint); skipped",
        "'grid_index' is not an integer; skipped"]
    assert [row.label for row in table.rows] == ["15%"]  # the one usable record's


def test_other_experiments_have_no_paper_column_or_tau(tmp_path):
    _write(tmp_path / "results.jsonl", [
        _record(experiment="mine", point="b", row="B", metrics={"accuracy": 30.0}),
        _record(experiment="mine", point="a", row="A", metrics={"accuracy": 60.0}),
        _record(experiment="mine", point="a", row="A", task="builtin_sort", status="failed",
                metrics={}, error="boom"),
    ])
    result = report.report(str(tmp_path))
    table = result.table
    assert [row.label for row in table.rows] == ["B", "A"]  # no paper order: as first seen
    assert [row.cells["builtin_reverse"].bold for row in table.rows] == [False, True]
    assert table.rows[0].cells["builtin_sort"].status == "missing"
    assert table.rows[1].cells["builtin_sort"].status == "failed"
    assert table.tau == {"average": None}
    text = io.StringIO(result.text).readlines()
    assert text[2].split() == ["Row", "Params", "Cost", "builtin_reverse", "builtin_sort"]
    assert not any("Kendall" in line for line in text)
    assert "Failed: a seed 0 builtin_sort: boom\n" in text


def test_a_point_recorded_under_two_row_labels_is_an_error(tmp_path):
    """An experiment file's row renamed between two runs of its sweep split the point's seeds
    into two rows of one seed each."""
    _write(tmp_path / "results.jsonl", [
        _record(experiment="mine", point="p", row="Old label", seed=0),
        _record(experiment="mine", point="p", row="New label", seed=1)])
    with pytest.raises(ValueError, match="point 'p' is recorded under the rows 'New label', "
                                         "'Old label' \\(its label changed between runs\\)"):
        report.report(str(tmp_path))


def test_a_grid_the_paper_lacks_says_how_many_of_its_rows_have_records(tmp_path):
    """A half-finished ul2 / bart / own-file sweep read as a finished table of fewer rows: the
    records carry their grid's row count, and the report counts the rows still to come."""
    _write(tmp_path / "results.jsonl", [
        _record(experiment="mine", point="a", row="A", grid_index=0, grid_rows=3),
        _record(experiment="mine", point="b", row="B", grid_index=1, grid_rows=3)])
    result = report.report(str(tmp_path))
    assert result.table.grid_rows == 3
    assert "Partial: 2 of the grid's 3 rows have records" in result.text
    assert "Partial: 2 of the grid's 3 rows" in (tmp_path / "report" / "table.md").read_text()
    whole = tmp_path / "whole"  # every row recorded, or records made before the field: no note
    whole.mkdir()
    _write(whole / "results.jsonl", [
        _record(experiment="mine", point="a", row="A", grid_rows=1),
        _record(experiment="mine", point="b", row="B")])
    assert "Partial" not in report.report(str(whole)).text


def test_rows_the_paper_lacks_follow_the_grid_and_a_failure_shows_whole(tmp_path):
    """A point re-run after the others appends its records last: the rows still follow the
    grid (`grid_index`), not the file; a failure's message keeps its later lines (the first
    alone hid why: "...incompatible config:" without the differing field)."""
    error = ("ConfigError: the checkpoints in x were written with an incompatible config:\n"
             "  objective.noise_density: saved 0.15 != now 0.25\nresume with the saved settings")
    _write(tmp_path / "results.jsonl", [
        _record(experiment="mine", point="b", row="B", grid_index=1),
        _record(experiment="mine", point="c", row="C", grid_index=2, status="failed",
                metrics={}, error=error),
        _record(experiment="mine", point="a", row="A", grid_index=0),  # re-run: appended last
    ])
    table = report.report(str(tmp_path)).table
    assert [row.label for row in table.rows] == ["A", "B", "C"]
    assert table.failures == (
        "c seed 0 builtin_reverse: ConfigError: the checkpoints in x were written with an "
        "incompatible config: objective.noise_density: saved 0.15 != now 0.25 resume with the "
        "saved settings",)


def test_a_seed_whose_score_is_not_a_number_makes_the_cell_undefined(tmp_path):
    """STS-B's Pearson correlation of constant predictions is NaN: the cell says 'undefined'
    and, like a missing cell, stays out of the column's spread and bold, so the other rows are
    still judged with a spread that is a number."""
    _write(tmp_path / "results.jsonl", [
        _record(experiment="mine", point="a", row="A", seed=0, metrics={"accuracy": 60.0}),
        _record(experiment="mine", point="a", row="A", seed=1, metrics={"accuracy": 62.0}),
        _record(experiment="mine", point="b", row="B", seed=0, metrics={"accuracy": float("nan")}),
        _record(experiment="mine", point="b", row="B", seed=1, metrics={"accuracy": 90.0}),
    ])
    table = report.report(str(tmp_path)).table
    a, b = (row.cells["builtin_reverse"] for row in table.rows)
    assert (b.status, b.seeds, b.mean) == ("undefined", 2, None)
    assert report_table.pooled_std([a, b]) == pytest.approx(math.sqrt(2.0))  # A's alone
    assert (a.bold, b.bold) == (True, False)
    line = next(line for line in report.report(str(tmp_path)).text.splitlines()
                if line.startswith("B "))
    assert "undefined" in line and "nan" not in line


def test_params_and_cost_are_the_papers_labels_with_our_measured_ratios():
    records = [{**sweep_point.base_record(point), "task": "builtin_reverse", "status": "ok",
                "metrics": {"accuracy": 50.0}} for point in grid.expand("table2", "demo")]
    labels = {(row.label, row.objective): (row.params_label, row.cost_label)
              for row in report_table.build_table(records).rows}
    # The paper's Table 2: 2P / M, P / M, P / M/2, P / M, P / M, whatever the objective.
    papers = {"Encoder-decoder": ("2P", "M"), "Enc-dec, shared": ("P", "M"),
              "Enc-dec, 6 layers": ("P", "M/2"), "Language model": ("P", "M"),
              "Prefix LM": ("P", "M")}
    for (row, _), (params, cost) in labels.items():
        assert (params.split(" (")[0], cost.split(" (")[0]) == papers[row]
    # The reference of both ratios is the decoder-only language model itself.
    assert labels[("Language model", "LM")] == ("P (1.00x)", "M (1.00x)")
    # At the demo size the logits dominate the cost: the full encoder-decoder measures well
    # under M, and its label stays the paper's M with the measured ratio beside it.
    cost = labels[("Encoder-decoder", "Denoising")][1]
    assert cost.startswith("M (") and float(cost.removeprefix("M (").removesuffix("x)")) < 0.9


@pytest.mark.parametrize("arch", architecture_names())
def test_at_t5_base_size_the_measured_ratios_sit_near_the_papers_labels(arch):
    # Within a factor sqrt(2) of the label's nominal multiple: at the paper's size (T5 base,
    # 512 + 512 tokens) the counts bear the structural labels out.
    cfg = model_config()
    cfg.arch = arch
    columns = accounting.table2_columns(cfg, 512, 512)
    nominal = {"P": 1.0, "2P": 2.0, "M": 1.0, "M/2": 0.5}
    assert abs(math.log2(columns.params_ratio / nominal[columns.params_label])) < 0.5
    assert abs(math.log2(columns.flops_ratio / nominal[columns.cost_label])) < 0.5


def _zero_shot(accuracy=None, status="ok", **ranking):
    return {"status": status, "metrics": {} if accuracy is None else {"accuracy": accuracy},
            "error": None if status == "ok" else "no label options", **ranking}


def test_zero_shot_scores_get_their_table_beside_the_finetuned_ones(tmp_path):
    """Wang et al.'s comparison: one row wins zero-shot, another after fine-tuning, each
    fine-tuned model ranked as the pre-trained one is and decoded; a generation task has no
    zero-shot column, a record made before the fine-tuned model was ranked shows 'missing'
    there, a point whose pre-training failed shows 'failed' in every regime, and the notes
    give the best constant prediction and the rows whose ranking was near-constant."""
    module = dict(task="builtin_module")
    constant = dict(most_predicted_share=0.5, constant_metrics={"accuracy": 26.0})
    _write(tmp_path / "results.jsonl", [
        _record(point="lm", row="10%", zero_shot=_zero_shot(40.0, **constant),
                finetuned_ranked=_zero_shot(70.0, **constant), metrics={"accuracy": 60.0},
                **module),
        _record(point="lm", row="10%", seed=1, zero_shot=_zero_shot(42.0, **constant),
                finetuned_ranked=_zero_shot(72.0, most_predicted_share=0.4),
                metrics={"accuracy": 62.0}, **module),
        _record(point="lm", row="10%", zero_shot=_zero_shot(status="not_applicable")),
        _record(point="dn", row="15%", metrics={"accuracy": 90.0}, **module,
                zero_shot=_zero_shot(25.0, most_predicted_share=0.95,
                                     constant_metrics={"accuracy": 26.0})),
        _record(point="dn", row="15%", zero_shot=_zero_shot(status="not_applicable")),
        _record(point="x", row="25%", status="failed", metrics={}, error="boom", **module),
    ])
    result = report.report(str(tmp_path))
    rows = {row.label: row for row in result.table.zero_shot}
    assert list(rows["10%"].zero_shot) == ["builtin_module"]  # builtin_reverse: no column
    assert rows["10%"].zero_shot["builtin_module"].mean == pytest.approx(41.0)
    assert rows["10%"].zero_shot["builtin_module"].bold
    assert rows["10%"].finetuned_ranked["builtin_module"].mean == pytest.approx(71.0)
    assert rows["15%"].finetuned_ranked["builtin_module"].status == "missing"
    assert rows["15%"].finetuned["builtin_module"].mean == 90.0
    assert not rows["15%"].zero_shot["builtin_module"].bold
    assert rows["25%"].zero_shot["builtin_module"].status == "failed"
    assert rows["25%"].finetuned_ranked["builtin_module"].status == "failed"
    assert ("builtin_module: best zero-shot 10% (41.00); best fine-tuned ranked 10% (71.00); "
            "best fine-tuned decoded 15% (90.00); always predicting one option scores at most "
            "accuracy 26.00; ranking gave one option to at least 90% of the examples (in some "
            "seed) for 15% (zero-shot): their score is about that option's.") in result.text
    markdown = (tmp_path / "report" / "table.md").read_text()
    # 15% ran seed 0 only, 10% both: its cells say over how many of the sweep's seeds.
    assert "| 15% | 25.00 [1/2 seeds] | – | **90.00** [1/2 seeds] |" in markdown
    assert "| 25% | failed | failed | failed |" in markdown
    assert "Zero-shot vs fine-tuned" in (tmp_path / "report" / "table.tex").read_text()
    lines = (tmp_path / "report" / "zero_shot.csv").read_text().splitlines()
    assert lines[1:4] == [
        "table6,tiny,10%,,builtin_module,zero-shot,ok,41.0000,1.4142,2,1",
        "table6,tiny,10%,,builtin_module,fine-tuned ranked,ok,71.0000,1.4142,2,1",
        "table6,tiny,10%,,builtin_module,fine-tuned decoded,ok,61.0000,1.4142,2,0"]


def test_a_sweep_stopped_between_seeds_marks_every_cell_with_the_seeds_it_has(tmp_path):
    """A sweep of seeds 0, 1, 2 stopped after seed 0 reported as a finished one-seed sweep:
    its records say which seeds it was asked for."""
    asked = dict(sweep_seeds=[0, 1, 2], task="builtin_module")
    _write(tmp_path / "results.jsonl", [
        _record(point="lm", row="10%", metrics={"accuracy": 60.0}, **asked),
        _record(point="dn", row="15%", metrics={"accuracy": 90.0}, **asked)])
    result = report.report(str(tmp_path))
    assert result.table.seeds == 3
    markdown = (tmp_path / "report" / "table.md").read_text()
    assert "| 10% |  |  | 60.00 [1/3 seeds] |" in markdown and "[k/3 seeds]: " in markdown


def test_records_without_zero_shot_scores_report_as_before(tmp_path):
    _write(tmp_path / "results.jsonl", [_record()])
    result = report.report(str(tmp_path))
    assert result.table.zero_shot == () and "Zero-shot" not in result.text
    assert not (tmp_path / "report" / "zero_shot.csv").exists()
