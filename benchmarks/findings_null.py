"""How often the report calls the paper's findings supported or contradicted on tables whose rows
do not differ: the false alarms of its verdict rules (`t5x_lite/findings.py`).

    python benchmarks/findings_null.py [--seeds 3] [--trials 400] [--spread 1.0]

Each trial writes one record per grid row, seed and task of each of the paper's tables (Tables
2 and 4 to 7) with every metric drawn from one normal distribution (mean 50, sd `--spread`), so
no row differs from any other: of a finding that orders rows (better, best, worst) every
verdict but "cannot separate" is a false alarm, while a "similar" finding's "supports" is the
right answer, which the rules give only where the seed spread is small against 2.5 % of the
score (in every trial at sd 0.3, in none at sd 1; the false alarms do not depend on sd). The
tasks stand for six of the paper's columns (SST-2 for GLUE, DialogSum for CNNDM, SQuAD,
Multi30k En-De and En-Fr, RoSt En-Ro), each with the one metric the report reads for the
paper's column (`paper_results.HEADLINE_METRICS`); the records go through the report's own path
(`report_table.build_table`, `findings_of`). Prints one JSON object: per table and finding, the
share of trials whose verdict is "supports" and "contradicts". With one seed there is no spread
and every difference counts, as the report says of such a table.
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import warnings

from t5x_lite import grid, paper_results, report_table

TABLES = ("table2", "table4", "table5", "table6", "table7")
TASKS = ("local_glue_sst2", "local_dialogsum", "local_squad", "local_multi30k_ende",
         "local_multi30k_enfr", "local_rosts_enro")


def null_records(experiment: str, seeds: int, spread: float, rng: random.Random) -> list[dict]:
    """One trial's records of `experiment`: every metric of every row, seed and task drawn
    from N(50, spread)."""
    return [dict(experiment=experiment, preset="null", point=row["point"], row=row["row"],
                 objective=row.get("objective"), seed=seed, task=task, status="ok",
                 metrics={paper_results.HEADLINE_METRICS.get(task, "accuracy"):
                          rng.gauss(50.0, spread)})
            for row in grid.load_experiment(experiment).GRID
            for seed in range(seeds) for task in TASKS]


def false_alarms(seeds: int = 3, trials: int = 400, spread: float = 1.0,
                 ) -> dict[str, dict[str, dict[str, float]]]:
    """{table: {claim: {"supports": share, "contradicts": share}}} over `trials` trials."""
    rng = random.Random(0)
    shares: dict[str, dict[str, dict[str, float]]] = {}
    for experiment in TABLES:
        verdicts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for _ in range(trials):
            with warnings.catch_warnings():  # one seed: the table warns of its missing spread
                warnings.simplefilter("ignore")
                table = report_table.build_table(null_records(experiment, seeds, spread, rng))
            for ours, _ in report_table.findings_of(table):
                verdicts[ours.finding.claim][ours.verdict] += 1
        shares[experiment] = {claim: {verdict: round(counts[verdict] / trials, 4)
                                      for verdict in ("supports", "contradicts")}
                              for claim, counts in verdicts.items()}
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--spread", type=float, default=1.0, help="the scores' sd (points)")
    args = parser.parse_args()
    print(json.dumps(false_alarms(args.seeds, args.trials, args.spread), indent=2))


if __name__ == "__main__":
    main()
