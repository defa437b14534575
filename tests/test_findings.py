"""The paper's findings: they hold on its own numbers, and the verdict rules on made-up tables."""
import dataclasses
import math

import pytest

from t5x_lite import findings, grid, paper_results, report_table
from t5x_lite.findings import (AVERAGE, CANNOT_SEPARATE, CONTRADICTS, FINDINGS, MOST, NOT_RUN,
                               SOME, SUPPORTS, Best, Better, Finding, Scores, Similar, Worst)

A, B, C = ("A", None), ("B", None), ("C", None)


def _scores(means, spread, several_seeds=True):
    """Scores of rows {row: {column: mean}} with the same spread in every column."""
    columns = tuple(next(iter(means.values())))
    return Scores(columns, means, {c: spread for c in columns},
                  frozenset(columns) if several_seeds else frozenset())


def _verdict(predicate, means, spread, columns=findings.ALL_COLUMNS, quantifier=findings.EVERY,
             several_seeds=True):
    finding = Finding("mine", "nowhere", "a claim", (predicate,), columns, quantifier)
    return findings.judge(finding, _scores(means, spread, several_seeds))


# ----------------------------------------------------------------------------- the paper's own


def test_every_paper_table_has_findings_and_they_name_its_rows():
    assert {f.experiment for f in FINDINGS} == set(paper_results.PAPER_TABLES)
    for finding in FINDINGS:
        paper = paper_results.PAPER_TABLES[finding.experiment]
        # Rows as the experiment files label them (Table 2 by row and objective).
        labels = {(row["row"], row.get("objective"))
                  for row in grid.load_experiment(finding.experiment).GRID}
        for predicate in finding.predicates:
            for row in predicate.rows():
                assert row in labels, (finding.claim, row)
                assert paper.find(*row) is not None, (finding.claim, row)


@pytest.mark.parametrize("finding", FINDINGS, ids=lambda f: f"{f.experiment}:{f.claim[:40]}")
def test_each_finding_supports_on_the_papers_numbers(finding):
    verdict = findings.judge(finding, findings.paper_scores(finding.experiment))
    assert verdict.verdict == SUPPORTS, findings.describe(verdict)
    assert all(check.verdict != NOT_RUN for check in verdict.checks)
    assert not verdict.one_seed and not verdict.absent


def _table_of_the_papers_numbers(name):
    """The paper's table as the report's Table: every cell the published score with the
    baseline's spread over its 10 runs."""
    paper = paper_results.PAPER_TABLES[name]
    columns = paper_results.COLUMNS
    rows = tuple(report_table.Row(row.row, row.objective, "", "", {
        c: report_table.Cell("ok", row.scores[c], paper_results.BASELINE_STD[c], 10, row.scores[c])
        for c in columns}, row) for row in paper.rows)
    return report_table.Table(name, "paper", paper, {c: (c,) for c in columns}, rows, {}, ())


@pytest.mark.parametrize("name", sorted(paper_results.PAPER_TABLES))
def test_a_report_table_of_the_papers_numbers_supports_every_finding(name):
    pairs = report_table.findings_of(_table_of_the_papers_numbers(name))
    assert len(pairs) == sum(f.experiment == name for f in FINDINGS)
    for ours, paper in pairs:
        assert ours.verdict == paper.verdict == SUPPORTS
        # The table's pooled spread is the baseline's, so both sides judge the same numbers.
        assert [c.threshold for c in ours.checks] == pytest.approx(
            [c.threshold for c in paper.checks])


def _swap(scores, a, b):
    means = dict(scores.means)
    means[a], means[b] = means[b], means[a]
    return dataclasses.replace(scores, means=means)


@pytest.mark.parametrize("finding", [f for f in FINDINGS
                                     if all(isinstance(p, Better) for p in f.predicates)],
                         ids=lambda f: f"{f.experiment}:{f.claim[:40]}")
def test_a_better_finding_with_its_rows_swapped_contradicts(finding):
    scores = findings.paper_scores(finding.experiment)
    for predicate in finding.predicates:
        scores = _swap(scores, predicate.better, predicate.worse)
    assert findings.judge(finding, scores).verdict == CONTRADICTS


@pytest.mark.parametrize("finding", [f for f in FINDINGS if isinstance(f.predicates[0], Best)],
                         ids=lambda f: f"{f.experiment}:{f.claim[:40]}")
@pytest.mark.parametrize("sigmas, expected", [(3, CONTRADICTS), (1, CANNOT_SEPARATE)])
def test_a_best_or_worst_row_moved_past_its_rival(finding, sigmas, expected):
    """Moved `sigmas` standard deviations past the best (worst) of the others in every column."""
    scores = findings.paper_scores(finding.experiment)
    means = dict(scores.means)
    for predicate in finding.predicates:
        moved = dict(means[predicate.row])
        for column in scores.columns:
            others = [means[row][column] for row in predicate.among]
            rival = max(others) if predicate.direction > 0 else min(others)
            moved[column] = rival - predicate.direction * sigmas * scores.spread[column]
        means[predicate.row] = moved
    verdict = findings.judge(finding, dataclasses.replace(scores, means=means))
    assert verdict.verdict == expected


@pytest.mark.parametrize("finding", [f for f in FINDINGS if isinstance(f.predicates[0], Similar)],
                         ids=lambda f: f"{f.experiment}:{f.claim[:40]}")
def test_a_similar_finding_with_one_row_10_percent_up_contradicts(finding):
    scores = findings.paper_scores(finding.experiment)
    row = finding.predicates[0].similar[0]
    means = {**scores.means, row: {c: 1.1 * v for c, v in scores.means[row].items()}}
    assert findings.judge(finding, dataclasses.replace(scores, means=means)).verdict == CONTRADICTS


# ----------------------------------------------------------------------------- the rules


@pytest.mark.parametrize("a, b, spread, expected", [
    (10.0, 8.0, 0.5, SUPPORTS),  # 2 > 2 sigma = 1
    (10.0, 8.0, 1.5, CANNOT_SEPARATE),  # 2 < 3
    (8.0, 10.0, 0.5, CONTRADICTS),
    (8.0, 10.0, 1.5, CANNOT_SEPARATE),
])
def test_better_is_judged_against_two_standard_deviations(a, b, spread, expected):
    verdict = _verdict(Better(A, B), {A: {"x": a}, B: {"x": b}}, spread)
    assert verdict.verdict == expected
    assert verdict.checks[0].margin == a - b and verdict.checks[0].threshold == 2 * spread


@pytest.mark.parametrize("finding", [f for f in FINDINGS
                                     if not any(isinstance(p, Similar) for p in f.predicates)],
                         ids=lambda f: f"{f.experiment}:{f.claim[:40]}")
def test_no_ordering_is_supported_by_rows_that_do_not_differ(finding):
    """Every row of the paper's table at one score (rows that do not differ, with one nudged to
    the top or the bottom by 0.01, as chance puts one there): no finding that orders rows supports. Before
    2026-12-05 `Best` called a lead of any size "best", and "span length 10 underperforms in
    some cases" supported on rows drawn alike about 70 % of the time at 3 seeds."""
    paper = findings.paper_scores(finding.experiment)
    for row in [key for predicate in finding.predicates for key in predicate.rows()]:
        for nudge in (0.01, -0.01):  # to the top, to the bottom
            means = {key: {c: 50.0 + nudge * (key == row) for c in paper.columns}
                     for key in paper.means}
            verdict = findings.judge(finding, dataclasses.replace(paper, means=means))
            assert verdict.verdict != SUPPORTS, (row, nudge)


def test_one_seed_judges_by_sign_and_says_so():
    means = {A: {"x": 10.0}, B: {"x": 9.9}}
    verdict = _verdict(Better(A, B), means, 0.0, several_seeds=False)
    assert verdict.verdict == SUPPORTS and verdict.one_seed
    headline, _ = findings.describe(verdict)
    assert headline.endswith("One seed: no spread to judge by, so any difference counts.")
    assert _verdict(Better(B, A), means, 0.0, several_seeds=False).verdict == CONTRADICTS
    tie = {A: {"x": 10.0}, B: {"x": 10.0}}
    assert _verdict(Better(A, B), tie, 0.0, several_seeds=False).verdict == CANNOT_SEPARATE
    several = _verdict(Better(A, B), means, 0.5)
    assert not several.one_seed and "One seed" not in findings.describe(several)[0]


@pytest.mark.parametrize("a, expected", [
    (11.5, SUPPORTS),  # 1.5 above B, beyond 2 sigma = 1: alone in bold
    (10.5, CANNOT_SEPARATE),  # the top score, but within 2 sigma of B: tied with it in bold
    (9.5, CANNOT_SEPARATE),  # 0.5 below B: tied with it
    (8.5, CONTRADICTS),  # 1.5 below B: not even bold
])
def test_best_follows_the_bold_rule(a, expected):
    means = {A: {"x": a}, B: {"x": 10.0}, C: {"x": 3.0}}
    assert _verdict(Best(A, (B, C)), means, 0.5).verdict == expected
    # Worst is the mirror image: negate every score.
    negated = {row: {"x": -v["x"]} for row, v in means.items()}
    assert _verdict(Worst(A, (B, C)), negated, 0.5).verdict == expected


@pytest.mark.parametrize("b, spread, expected", [
    (101.0, 0.5, SUPPORTS),  # range 1 + 2 sigma 1 = 2 within 2.5% of 100.5 = 2.51
    (101.0, 1.0, CANNOT_SEPARATE),  # 1 + 2 > 2.51 > 1 - 2
    (104.0, 0.5, CONTRADICTS),  # 4 - 1 = 3 > 2.55
])
def test_similar_is_a_range_within_a_fraction_of_the_score(b, spread, expected):
    verdict = _verdict(Similar((A, B)), {A: {"x": 100.0}, B: {"x": b}}, spread)
    assert verdict.verdict == expected
    assert verdict.checks[0].tolerance == pytest.approx(0.025 * (100 + b) / 2)


def test_rows_that_all_scored_zero_are_not_called_similar():
    """A 4-step sweep scores 0 everywhere: range 0 within a tolerance of 0 supported the
    paper's "performs nearly as well", where the Better findings could not separate."""
    assert _verdict(Similar((A, B)), {A: {"x": 0.0}, B: {"x": 0.0}}, 0.0).verdict == (
        CANNOT_SEPARATE)
    assert _verdict(Similar((A, B)), {A: {"x": 3.0}, B: {"x": 3.0}}, 0.0).verdict == SUPPORTS
    # Scores near 0 give a tolerance near 0: a BLEU of 0.02 against 0.00 is no contradiction.
    near_zero = {A: {"x": 0.02}, B: {"x": 0.0}}
    assert _verdict(Similar((A, B)), near_zero, 0.0).verdict == CANNOT_SEPARATE
    assert _verdict(Similar((A, B)), {A: {"x": 1.2}, B: {"x": 0.8}}, 0.0).verdict == (
        CONTRADICTS)  # at a mean of 1 point the tolerance applies again
    # Scores of opposite sign (correlations) average 0 but are not near 0: they differ.
    assert _verdict(Similar((A, B)), {A: {"x": -20.0}, B: {"x": 20.0}}, 0.5).verdict == (
        CONTRADICTS)


def test_the_average_and_its_spread():
    scores = Scores(("x", "y"), {A: {"x": 10.0, "y": 20.0}, B: {"x": 12.0}},
                    {"x": 0.3, "y": 0.4}, frozenset({"x", "y"}))
    assert scores.score(A, AVERAGE) == 15.0
    assert scores.score(B, AVERAGE) is None  # no average without every column
    assert scores.threshold(AVERAGE) == pytest.approx(2 * math.sqrt((0.09 + 0.16) / 2))


@pytest.mark.parametrize("quantifier, x, y, z, expected", [
    (MOST, 12, 12, 10, SUPPORTS),  # 2 of 3 support
    (MOST, 12, 10, 8, CANNOT_SEPARATE),  # 1 supports, 1 undecided: a majority still possible
    (MOST, 12, 8, 8, CONTRADICTS),
    (SOME, 8, 10, 12, SUPPORTS),
    (SOME, 8, 8, 10, CANNOT_SEPARATE),
    (SOME, 8, 8, 8, CONTRADICTS),
    (findings.EVERY, 12, 12, 10, CANNOT_SEPARATE),
    (findings.EVERY, 12, 12, 8, CONTRADICTS),
])
def test_quantifiers_over_columns(quantifier, x, y, z, expected):
    means = {A: {"x": x, "y": y, "z": z}, B: {"x": 10, "y": 10, "z": 10}}
    assert _verdict(Better(A, B), means, 0.5, quantifier=quantifier).verdict == expected


def test_missing_rows_and_columns_are_not_run():
    means = {A: {"x": 12.0, "y": 12.0}, B: {"x": 10.0}}
    # B has no "y": that check does not run, the finding is judged on "x" alone.
    verdict = _verdict(Better(A, B), means, 0.5)
    assert verdict.verdict == SUPPORTS
    assert [(c.column, c.verdict, c.missing) for c in verdict.checks] == [
        ("x", SUPPORTS, ()), ("y", NOT_RUN, (B,))]
    assert _verdict(Better(A, C), means, 0.5).verdict == NOT_RUN
    assert _verdict(Better(A, C), means, 0.5).absent == (C,)
    # A paper column the table lacks.
    only_squad = _verdict(Better(A, B), means, 0.5, columns=("SQuAD",))
    assert only_squad.verdict == NOT_RUN
    assert "SQuAD: A > B: not run (no such column in our table)." in findings.describe(
        only_squad)[1]
    # Best compares with the rivals that ran and names the others.
    best = _verdict(Best(A, (B, C)), means, 0.5, columns=("x",))
    assert best.verdict == SUPPORTS and best.checks[0].missing == (C,)  # 2 beyond 2 sigma = 1


def test_describe_shows_our_numbers_and_the_papers():
    ours = _verdict(Better(A, B), {A: {"x": 12.0}, B: {"x": 10.0}}, 0.5)
    paper = _verdict(Better(A, B), {A: {"x": 11.0}, B: {"x": 10.5}}, 0.1)
    headline, lines = findings.describe(ours, paper)
    assert headline == "a claim (nowhere)."
    assert lines == ["x: A at 12.00 vs B at 10.00: +2.00 (paper +0.50), 2σ 1.00: supports."]


def test_the_false_alarm_benchmark_runs_every_finding_through_the_report(benchmark_script):
    """benchmarks/findings_null.py, whose numbers the README and the report's explanation
    quote: every finding of every table is judged, on the report's own path, and on rows that
    do not differ (3 seeds) none supports in more than a few of 30 trials."""
    shares = benchmark_script("findings_null").false_alarms(seeds=3, trials=30)
    assert {table: len(claims) for table, claims in shares.items()} == {
        table: sum(f.experiment == table for f in FINDINGS) for table in shares}
    assert all(0 <= v["contradicts"] <= 1 and v["supports"] <= 0.1
               for claims in shares.values() for v in claims.values())
    assert max(v["contradicts"] for v in shares["table2"].values()) > 0  # the multiplicity
