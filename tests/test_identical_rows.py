"""Rows of a grid that compute the same runs: the sweep warns of them before anything runs
(`grid.identical_rows`), and the report says which rows pre-trained identically."""
import itertools
import json
import warnings

import jax
import numpy as np
import pytest

from t5x_lite import grid, objective_registry, objectives, preview, report, report_table

VOCAB_SIZE = 2048


def _corrupted(objective_configs, layout, seed=0, rows=32):
    """Each objective config's batch of the same `rows` random chunks under one key, as the
    train step corrupts them: a list of {name: array} (the batch and its noise mask)."""
    raw = jax.random.randint(jax.random.PRNGKey(seed), (rows, layout.raw_length), 3,
                             VOCAB_SIZE - 100)
    batches = []
    for config in objective_configs:
        batch, details = objectives.jitted_corrupt_with_details(
            raw, objectives.spec_from_config(config), jax.random.PRNGKey(seed + 1), layout)
        batches.append({**jax.device_get(batch), "noise": np.asarray(details["noise_mask"])})
    return batches


def _same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[name], b[name]) for name in a)


def _expand_warnings(experiment, preset, overrides=()):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        points = grid.expand(experiment, preset, overrides)
    messages = [str(warning.message) for warning in caught]
    return points, [message for message in messages if "will give the same records" in message]


def test_table7_at_demo_lengths_warns_of_the_span_lengths_that_round_alike_and_they_do():
    points, messages = _expand_warnings("table7", "demo")
    assert messages == [
        "table7 --preset demo: rows '2' (span_2) and '3' (span_3) will give the same records: "
        "they differ only in mean_noise_span_length 2.0, 3.0, which span_corruption sees alike "
        "at objective.inputs_length=32: raw_length=34, noise_tokens=5, noise_spans=2",
        "table7 --preset demo: rows '5' (span_5) and '10' (span_10) will give the same records: "
        "they differ only in mean_noise_span_length 5.0, 10.0, which span_corruption sees alike "
        "at objective.inputs_length=32: raw_length=35, noise_tokens=5, noise_spans=1"]
    assert [[p.point for p in group] for group in grid.identical_rows(points)] == [
        ["span_2", "span_3"], ["span_5", "span_10"]]
    # What the warning says, checked on the device: the flagged rows' batches are equal, the
    # others' are not.
    by_point = {p.point: p for p in points}
    layout = points[0].layout
    batches = dict(zip(by_point, _corrupted([p.config.objective for p in points], layout)))
    for first, second in itertools.combinations(by_point, 2):
        alike = {first, second} in ({"span_2", "span_3"}, {"span_5", "span_10"})
        assert _same(batches[first], batches[second]) == alike, (first, second)
    # `preview` warns too, shows what the objective makes of the settings, and each example
    # has them.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = preview.previewed_run("table7", "span_3", "demo", seed=0)
    assert [str(w.message) for w in caught] == messages
    examples = preview.corrupted_examples(run, count=4)
    assert ("objective span_corruption: noise_density 0.15, mean_noise_span_length 3.0 (as it "
            "sees them: raw_length 34, noise_tokens 5, noise_spans 2)") in preview.format_text(
                run, examples)
    assert {(len(e["raw"]), sum(e["noise_mask"])) for e in examples} == {(34, 5)}
    # At the tiny preset's 128 inputs every span length makes its own number of spans.
    # Shorter still, every span length makes one span of one noise token.
    assert _expand_warnings("table7", "demo", ["objective.inputs_length=8"])[1] == [
        "table7 --preset demo: rows '2' (span_2), '3' (span_3), '5' (span_5) and '10' (span_10) "
        "will give the same records: they differ only in mean_noise_span_length 2.0, 3.0, 5.0, "
        "10.0, which span_corruption sees alike at objective.inputs_length=8: raw_length=7, "
        "noise_tokens=1, noise_spans=1"]
    assert _expand_warnings("table7", "tiny")[1] == []
    assert grid.identical_rows(grid.expand("table7", "tiny")) == []


@pytest.mark.parametrize("inputs_length", [16, 32, 48])
def test_span_corruption_points_corrupt_alike_exactly_when_their_effective_settings_agree(
        inputs_length):
    """`span_corruption_effective_settings` against the corruption itself, over rates and span
    lengths: two settings give equal batches if and only if their effective settings are
    equal."""
    configs = [dict(name="span_corruption", inputs_length=inputs_length, noise_density=density,
                    mean_noise_span_length=span, random_token_fraction=0.1)
               for density in (0.1, 0.15, 0.25) for span in (1.0, 2.0, 3.0, 4.0, 5.0, 8.0, 10.0)]
    layout = objectives.layout_for(configs, "encoder_decoder", VOCAB_SIZE, 100)
    record = objective_registry.get("span_corruption")
    effective = [json.dumps(record.effective(config), sort_keys=True) for config in configs]
    batches = _corrupted(configs, layout)
    pairs_alike = 0
    for i, j in itertools.combinations(range(len(configs)), 2):
        alike = effective[i] == effective[j]
        pairs_alike += alike
        assert _same(batches[i], batches[j]) == alike, (configs[i], configs[j], effective[i])
    assert pairs_alike > 0  # the grid holds settings that T5's rounding makes equal


def test_rows_differing_only_in_a_setting_their_objective_does_not_read_are_flagged(
        tmp_path):
    path = tmp_path / "unread.py"
    path.write_text(
        "from t5x_lite import presets\n"
        "GRID = (dict(point='iid_span3', row='3', overrides={'objective.name': 'iid_denoising',"
        " 'objective.mean_noise_span_length': 3.0}),\n"
        "        dict(point='iid_span5', row='5', overrides={'objective.name': 'iid_denoising',"
        " 'objective.mean_noise_span_length': 5.0}),\n"
        "        dict(point='iid_rate25', row='25%', overrides={'objective.name': 'iid_denoising',"
        " 'objective.noise_density': 0.25}))\n"
        "def get_config(preset):\n    return presets.sweep_preset(preset)\n")
    points, messages = _expand_warnings(str(path), "demo")
    assert messages == [
        "unread --preset demo: rows '3' (iid_span3) and '5' (iid_span5) will give the same "
        "records: they differ only in mean_noise_span_length 3.0, 5.0, which iid_denoising does "
        "not read (its record's reads=('noise_density',): an objective of one's own that reads "
        "them must name them there)"]
    first, second, third = _corrupted([p.config.objective for p in points], points[0].layout)
    assert _same(first, second) and not _same(first, third)


def test_the_report_names_rows_that_pretrained_identically(tmp_path):
    curve = [[10, 5.0], [20, 4.0]]

    def record(point, row, seed, curve):
        return {"experiment": "table7", "preset": "demo", "point": point, "row": row,
                "seed": seed, "task": "builtin_reverse", "status": "ok",
                "metrics": {"accuracy": 50.0}, "pretrain_curve": curve}

    records = [record("span_2", "2", 0, curve), record("span_3", "3", 0, curve),
               record("span_2", "2", 1, [[10, 5.5], [20, 4.5]]),
               record("span_3", "3", 1, [[10, 5.5], [20, 4.5]]),
               # Equal in seed 0 only: not the same pre-training.
               record("span_5", "5", 0, curve), record("span_5", "5", 1, [[10, 5.5], [20, 4.25]]),
               record("span_1", "i.i.d.", 0, [[10, 6.0], [20, 4.0]])]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert report_table.build_table(records).identical_pretraining == (("2", "3"),)
    text = report.report(str(tmp_path)).text
    assert ("Rows 2 and 3 pre-trained identically (the same loss at every logged step, seed by "
            "seed): at these settings and lengths they ran the same pre-training, so this table "
            "cannot tell them apart.") in text
    assert text.count("pre-trained identically") == 1
    assert "pre-trained identically" in (tmp_path / "report" / "table.md").read_text()
