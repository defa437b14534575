"""`t5x-lite report NEW --against OLD`: each row of one sweep against the same row of another."""
import csv
import io
import json
import math
import statistics

import numpy as np
import pytest
import scipy.stats

from t5x_lite import cli, report, report_compare, report_table


def _records(row, scores, losses=None, examples=None):
    """A table6 row's records, one per seed: its builtin_reverse score and held-out loss."""
    return [{"experiment": "table6", "preset": "demo", "point": f"rate_{row}", "row": row,
             "seed": seed, "task": "builtin_reverse", "status": "ok",
             "metrics": {"accuracy": score},
             **({"held_out_loss": losses[seed], "held_out_examples": examples[seed]}
                if losses else {})}
            for seed, score in enumerate(scores)]


def _write(directory, records):
    directory.mkdir()
    (directory / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(directory)


@pytest.fixture
def sweeps(tmp_path):
    """Before and after a change. 10% and 15%: the same two seeds in both sweeps (paired);
    25%: two seeds after, one before (judged by the pooled spread); 50% only before. The 15%
    row's held-out examples differ (as when the change is to the objective)."""
    after = _write(tmp_path / "after", [
        *_records("10%", [50.0, 52.0], [3.0, 3.2], ["x0", "x1"]),
        *_records("15%", [60.0, 62.0], [3.1, 3.3], ["y0", "y1"]),
        *_records("25%", [70.0, 71.0], [3.4, 3.5], ["w0", "w1"])])
    before = _write(tmp_path / "before", [
        *_records("10%", [40.0, 42.0], [3.5, 3.7], ["x0", "x1"]),
        *_records("15%", [61.0, 59.0], [3.6, 3.8], ["z0", "z1"]),
        *_records("25%", [69.0], [3.45], ["w0"]),
        *_records("50%", [30.0, 30.5], [4.0, 4.1], ["v0", "v1"])])
    return after, before


def test_each_shared_row_gets_its_mean_and_change_judged_paired_by_seed_or_pooled(sweeps):
    after, before = sweeps
    comparison = report.report(after, against=before).comparison
    assert comparison.columns == ("builtin_reverse", "Average", "Held-out loss")
    assert list(comparison.rows) == ["10%", "15%", "25%"]
    ten, fifteen, twenty_five = (comparison.rows[row] for row in ("10%", "15%", "25%"))
    # Paired by seed: a paired t-test. 10%: +10 in both seeds, no spread at all: p = 0.
    assert ten["builtin_reverse"] == report_compare.Change(51.0, 41.0, True, paired=2,
                                                           p_value=0.0)
    # 15%: -1 and +3: t = 1 / (2.83 / sqrt 2) = 0.5 with one degree of freedom.
    p_value = scipy.stats.ttest_rel([60, 62], [61, 59]).pvalue
    assert fifteen["builtin_reverse"] == report_compare.Change(61.0, 60.0, False, paired=2,
                                                               p_value=pytest.approx(p_value))
    assert p_value == pytest.approx(0.705, abs=1e-3)
    # 25%: one seed in common (seed 1 only after), so the means are seed 0's and the column's
    # spread judges: root mean variance over every cell of both sweeps with two or more seeds,
    # shared rows or not.
    scores = [[50, 52], [60, 62], [70, 71], [40, 42], [61, 59], [30, 30.5]]
    pooled = math.sqrt(statistics.mean(statistics.variance(s) for s in scores))
    assert comparison.spreads["builtin_reverse"] == pytest.approx(pooled)
    assert twenty_five["builtin_reverse"] == report_compare.Change(
        70.0, 69.0, False, paired=0, spread=pytest.approx(pooled), shared_seeds=1)
    assert 1.0 < 2 * pooled
    assert ten["Average"] == report_compare.Change(51.0, 41.0, None)  # never judged
    # Held-out losses compare where both scored the same examples: 10% only (25%'s seeds and
    # 15%'s examples differ); -0.5 in both seeds.
    assert ten["Held-out loss"] == report_compare.Change(
        pytest.approx(3.1), pytest.approx(3.6), True, paired=2, p_value=pytest.approx(0.0))
    assert fifteen["Held-out loss"] == report_compare.Change(pytest.approx(3.2), None, None)
    assert comparison.held_out_not_comparable == ("15%", "25%")
    assert (comparison.only_ours, comparison.only_theirs) == ((), ("50%",))


def test_the_comparison_is_printed_and_written_as_markdown_and_csv(sweeps, tmp_path, capsys):
    after, before = sweeps
    cli.main(["t5x-lite", "report", after, "--against", before, "--out", str(tmp_path / "out")])
    text = capsys.readouterr().out
    section = text[text.index(f"Against {before}"):].splitlines()
    assert section[2].split() == ["Row", "builtin_reverse", "Average", "Held-out", "loss"]
    assert section[4].split() == ["10%", "51.00", "(+10.00)*", "51.00", "(+10.00)", "3.10",
                                  "(-0.50)*"]
    assert section[5].split() == ["15%", "61.00", "(+1.00)", "61.00", "(+1.00)", "3.20", "(–)"]
    assert f"Rows only in {before}: 50%." in text and "Rows only in this sweep" not in text
    assert ("not comparable (other examples: the objective's settings or the seeds differ): "
            "15%, 25%.") in text
    markdown = (tmp_path / "out" / "comparison.md").read_text()
    assert "| 10% | **51.00 (+10.00)** | 51.00 (+10.00) | **3.10 (-0.50)** |" in markdown
    rows = list(csv.DictReader(io.StringIO((tmp_path / "out" / "comparison.csv").read_text())))
    assert rows[0] == {"row": "10%", "column": "builtin_reverse", "this": "51.0",
                       "other": "41.0", "difference": "10.0", "told_apart": "True",
                       "paired_seeds": "2", "p_value": "0.0", "spread": "",
                       "shared_seeds": "0"}
    assert {(r["row"], r["column"]): r["told_apart"] for r in rows}[("15%", "Average")] == ""


def test_cells_of_different_seeds_compare_over_the_seeds_both_ran(tmp_path, capsys):
    """A seed only one sweep ran showed as a change: 2 seeds (50, 52) against 3 (50, 52, 60)
    read -3.00 where the change on the seeds both ran is 0. Seeds with nothing in common
    compare whole means."""
    this = _write(tmp_path / "this", [*_records("10%", [50.0, 52.0]),
                                      *_records("15%", [70.0])])
    other = _write(tmp_path / "other", [
        *_records("10%", [50.0, 52.0, 60.0]),
        *[{**record, "seed": 5} for record in _records("15%", [66.0])]])
    comparison = report.report(this, against=other).comparison
    ten = comparison.rows["10%"]
    assert ten["builtin_reverse"] == report_compare.Change(
        51.0, 51.0, False, paired=2, p_value=1.0, shared_seeds=2)
    assert ten["Average"] == report_compare.Change(51.0, 51.0, None, shared_seeds=2)
    pooled = math.sqrt(statistics.mean([statistics.variance([50, 52]),
                                        statistics.variance([50, 52, 60])]))
    assert comparison.rows["15%"]["builtin_reverse"] == report_compare.Change(
        70.0, 66.0, False, spread=pytest.approx(pooled))
    cli.main(["t5x-lite", "report", this, "--against", other, "--out", str(tmp_path / "out")])
    text = capsys.readouterr().out
    section = text[text.index(f"Against {other}"):]
    row = next(line for line in section.splitlines() if line.startswith("10%"))
    assert row.split() == ["10%", "51.00", "(+0.00)", "[2", "shared", "seeds]", "51.00", "(+0.00)",
                           "[2", "shared", "seeds]"]
    assert "[k shared seeds]: the two sweeps ran different seeds" in text


def test_the_average_is_over_the_columns_both_sweeps_have(tmp_path):
    more = _records("10%", [50.0]) + [
        {**_records("10%", [50.0])[0], "task": "builtin_module", "metrics": {"accuracy": 90.0}}]
    fewer = _write(tmp_path / "fewer", _records("10%", [40.0]))
    comparison = report.report(_write(tmp_path / "more", more), against=fewer).comparison
    assert comparison.columns == ("builtin_reverse", "Average")
    assert comparison.rows["10%"]["Average"] == report_compare.Change(50.0, 40.0, None)
    assert comparison.columns_not_shared == ("builtin_module",)


def test_a_column_made_of_other_tasks_in_the_other_sweep_is_named_not_compared(tmp_path):
    """GLUE of rte and stsb against GLUE of rte alone differs by the task mix, not by the
    change: it was compared and starred. A sweep of another preset is said to be one."""
    def with_glue(scores, glue_tasks, preset="demo"):
        records = []
        for record in _records("10%", scores):
            records.append({**record, "preset": preset})
            for task in glue_tasks:
                metrics = {"accuracy": 70.0} if task == "glue_rte" else {
                    "pearson_corrcoef": 10.0, "spearman_corrcoef": 10.0}
                records.append({**record, "preset": preset, "task": task, "metrics": metrics})
        return records

    two = _write(tmp_path / "two", with_glue([50.0, 51.0], ["glue_rte", "glue_stsb"]))
    one = _write(tmp_path / "one", with_glue([40.0, 41.0], ["glue_rte"], preset="tiny"))
    comparison = report.report(two, against=one).comparison
    assert comparison.columns == ("builtin_reverse", "Average")
    assert comparison.columns_of_other_tasks == (
        "GLUE (here glue_rte + glue_stsb; there glue_rte)",)
    assert comparison.columns_not_shared == ()
    text = report_compare.to_text(comparison)
    assert ("Columns made of other tasks in the two sweeps, not compared: GLUE (here glue_rte + "
            "glue_stsb; there glue_rte).") in text
    assert f"Other sweeps: this sweep is table6 --preset demo, {one} table6 --preset tiny." in text


def test_one_seed_judges_nothing_and_unrelated_sweeps_are_refused(tmp_path, capsys):
    one = _write(tmp_path / "one", _records("10%", [50.0]))
    other = _write(tmp_path / "other", _records("10%", [40.0]))
    comparison = report.report(one, against=other).comparison
    assert comparison.rows["10%"]["builtin_reverse"] == report_compare.Change(50.0, 40.0, None)
    assert comparison.columns == ("builtin_reverse", "Average")  # no held-out losses
    unrelated = _write(tmp_path / "unrelated", _records("50%", [30.0]))
    with pytest.raises(SystemExit, match=rf"^t5x-lite report: {unrelated} shares no row with "
                                         r"this sweep \(table6: rows 10%; columns "
                                         r"builtin_reverse\)"):
        cli.main(["t5x-lite", "report", one, "--against", unrelated, "--out",
                  str(tmp_path / "refused")])
    assert not (tmp_path / "refused").exists()  # refused before anything was written
    with pytest.raises(SystemExit):
        cli.main(["t5x-lite", "report", one, "--against", str(tmp_path / "missing")])
    assert (f"argument --against: {tmp_path / 'missing'} holds no results.jsonl; give the "
            "workdir of a finished sweep") in capsys.readouterr().err


@pytest.mark.parametrize("seeds", [2, 3, 5, 10])
def test_the_paired_p_value_is_the_paired_t_test(seeds):
    rng = np.random.default_rng(seeds)
    after, before = rng.normal(50, 5, seeds), rng.normal(48, 5, seeds)
    assert report_compare.paired_p_value(list(after - before)) == pytest.approx(
        scipy.stats.ttest_rel(after, before).pvalue, rel=1e-9)


def test_held_out_losses_of_unknown_examples_are_not_compared(tmp_path):
    """Records made before the fingerprints existed hold losses without `held_out_examples`:
    equal on both sides (None, None), they said nothing of which examples were scored, yet the
    losses were compared and a difference marked."""
    after = _write(tmp_path / "after", _records("15%", [60.0, 62.0], [2.10, 2.20], [None, None]))
    before = _write(tmp_path / "before", _records("15%", [61.0, 59.0], [3.10, 3.21], [None, None]))
    comparison = report.report(after, against=before).comparison
    assert comparison.rows["15%"]["Held-out loss"] == report_compare.Change(
        pytest.approx(2.15), None, None)
    assert comparison.held_out_not_comparable == ("15%",)


def test_a_row_s_held_out_examples_are_the_seeds_and_fingerprints_of_its_losses():
    records = _records("10%", [50.0, 52.0], [3.0, 3.2], ["x0", "x1"])
    records.append({**records[0], "task": "builtin_module", "held_out_loss": None})
    table = report_table.build_table(records)
    assert table.rows[0].held_out_examples == ((0, "x0"), (1, "x1"))
