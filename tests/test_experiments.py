"""The experiments beyond the T5 tables, experiments/ul2.py, bart.py and families.py: each grid
expands at every preset, each point runs the architecture and objective it says (read back
from the expanded configs), and bad grids stop at expansion. Expansion only, no training."""
import math

import pytest

from t5x_lite import grid, objectives, presets, sweep_point
from t5x_lite.config import UL2_DENOISERS, ConfigError

# (point, model.arch, objective.name, the kinds of its ul2 denoisers: () for other objectives),
# written out from the experiment's docstring rather than from its code.
UL2_POINTS = [
    (f"{arch}/{point}", arch, name, kinds)
    for arch in ("encoder_decoder", "prefix_lm")
    for point, name, kinds in (
        ("span_corruption", "span_corruption", ()), ("prefix_lm", "prefix_lm", ()),
        ("lm", "lm", ()), ("r_only", "ul2", ("R",)), ("s_only", "ul2", ("S",)),
        ("x_only", "ul2", ("X",)), ("ul2", "ul2", ("R", "S", "X")))
]
BART_POINTS = ["token_masking", "token_deletion", "text_infilling", "document_rotation",
               "sentence_permutation", "text_infilling_permutation"]
BART_ROWS = ["Token Masking", "Token Deletion", "Text Infilling", "Document Rotation",
             "Sentence Shuffling", "Text Infilling + Sentence Shuffling"]


def _expand(experiment, preset, tmp_path):
    """The grid at `preset`, the presets reading real data pointed at a one-file corpus."""
    overrides = []
    if preset in ("small", "cpu"):
        (tmp_path / "pretrain" / "wiki").mkdir(parents=True, exist_ok=True)
        (tmp_path / "pretrain" / "wiki" / "part-000.txt").write_text("Title\nText.\n\nTwo\n")
        overrides = [f"data.data_root={tmp_path}"]
    return grid.expand(experiment, preset, overrides)


@pytest.mark.parametrize("preset", presets.PRESETS)
def test_the_ul2_grid_expands_and_each_point_runs_what_it_says(preset, tmp_path):
    points = _expand("ul2", preset, tmp_path)
    seeds = len(points[0].config.sweep.seeds)
    assert [(p.point, p.config.model.arch, p.config.objective.name) for p in points] == [
        (point, arch, name) for point, arch, name, _ in UL2_POINTS for _ in range(seeds)]
    kinds = {point: wanted for point, _, _, wanted in UL2_POINTS}
    for p in points:
        # Every point's record fields are known before it runs (the encoder-decoder's causal
        # LM, whose encoder reads a lone EOS, included).
        assert sweep_point.base_record(p)["params"] > 0
        if p.config.objective.name != "ul2":
            assert p.layout.denoisers == ()
            continue
        mixture = p.config.objective.ul2_denoisers
        assert tuple(sorted({d[0] for d in mixture})) == kinds[p.point]
        # That kind's denoisers of the default mixture, their shares renormalised to sum to 1.
        chosen = [d for d in UL2_DENOISERS if d[0] in kinds[p.point]]
        total = sum(d[3] for d in chosen)
        assert [tuple(d[:3]) for d in mixture] == [d[:3] for d in chosen]
        assert [d[3] for d in mixture] == pytest.approx([d[3] / total for d in chosen])
        # The layout holds the point's own mixture: that is what its step compiles.
        assert [(d.kind, d.noise_density, d.mean_noise_span_length, d.share)
                for d in p.layout.denoisers] == [tuple(d) for d in mixture]
    # Every point of an architecture trains on rows of one size.
    for arch in ("encoder_decoder", "prefix_lm"):
        sizes = {(p.layout.raw_length, p.layout.inputs_length, p.layout.targets_length)
                 for p in points if p.config.model.arch == arch}
        assert len(sizes) == 1
    # One vocabulary with room for the X-denoisers' spans and the mode tokens.
    assert len({p.config.model.num_sentinels for p in points}) == 1


def test_the_ul2_grid_gets_the_sentinels_its_x_denoisers_need_at_512_inputs():
    points = grid.expand("ul2", "paper")
    assert points[0].config.objective.inputs_length == 512
    assert {p.config.model.num_sentinels for p in points} == {130}
    # The preset's 100 are too few: layout_for's own count of what the mixture needs is 130.
    config = presets.sweep_preset("paper")
    config.objective.name = "ul2"
    with pytest.raises(ConfigError, match="model.num_sentinels=100 is too small .* at least 130"):
        objectives.layout_for([config.objective], "encoder_decoder", config.model.vocab_size,
                              config.model.num_sentinels)
    assert grid.load_experiment("ul2").sentinels_needed(32) <= presets.get_preset(
        "demo").model.num_sentinels


@pytest.mark.parametrize("preset", presets.PRESETS)
def test_the_bart_grid_expands_and_each_point_runs_its_noising(preset, tmp_path):
    points = _expand("bart", preset, tmp_path)
    seeds = len(points[0].config.sweep.seeds)
    assert [(p.point, p.row) for p in points] == [
        pair for pair in zip(BART_POINTS, BART_ROWS) for _ in range(seeds)]
    for p in points:
        assert sweep_point.base_record(p)["params_label"] == "2P"
        assert p.config.model.arch == "encoder_decoder"
        assert p.config.objective.name == p.point
        if p.point in ("token_masking", "token_deletion", "text_infilling",
                       "text_infilling_permutation"):
            assert p.config.objective.noise_density == 0.3
        if "infilling" in p.point:
            assert p.config.objective.mean_noise_span_length == 3.0
    assert len({p.layout for p in points}) == 1


BAD_GRID = '''
from t5x_lite import presets

GRID = (dict(point="ok", row="ok", overrides={{"objective.name": "span_corruption"}}),
        dict(point="bad", row="bad", overrides={overrides}))


def get_config(preset):
    return presets.sweep_preset(preset)
'''


@pytest.mark.parametrize("overrides, message", [
    ({"objective.name": "ul2", "objective.ul2_denoisers": (("R", 0.15, 3.0, 0.5),)},
     r"point 'bad': objective.ul2_denoisers shares sum to 0.5; they must sum to 1"),
    ({"objective.name": "ul2", "objective.ul2_denoisers": (("Q", 0.15, 3.0, 1.0),)},
     r"point 'bad': objective.ul2_denoisers\[0\] kind='Q' is not allowed"),
    ({"objective.name": "ul2", "model.arch": "encoder_only"},
     r"point 'bad': objective.name='ul2' is not allowed for model.arch='encoder_only'"),
])
def test_bad_grids_stop_at_expansion(overrides, message, tmp_path):
    path = tmp_path / "bad_grid.py"
    path.write_text(BAD_GRID.format(overrides=repr(overrides)))
    with pytest.raises(ConfigError, match=message):
        grid.expand(str(path), "demo")


def test_only_renormalises_one_kind_of_the_default_mixture():
    only = grid.load_experiment("ul2").only
    for kind in ("R", "S", "X"):
        mixture = only(kind)
        assert {d[0] for d in mixture} == {kind}
        assert math.isclose(sum(d[3] for d in mixture), 1.0)
    assert only("S") == (("S", 0.25, 1.0, 1.0),)
    assert only("X") == tuple((k, r, s, 0.25) for k, r, s, _ in UL2_DENOISERS[3:])


# experiments/families.py: each point's architecture and objective (Wang et al.'s CD:FLM,
# ND:PLM, ED:PLM and their masked LM, T5's span corruption; encoder_only its masked LM only).
FAMILY_POINTS = {
    "encoder_decoder/natural": ("encoder_decoder", "prefix_lm"),
    "encoder_decoder/span_corruption": ("encoder_decoder", "span_corruption"),
    "language_model/natural": ("language_model", "lm"),
    "language_model/span_corruption": ("language_model", "span_corruption"),
    "prefix_lm/natural": ("prefix_lm", "prefix_lm"),
    "prefix_lm/span_corruption": ("prefix_lm", "span_corruption"),
    "encoder_only/natural": ("encoder_only", "bert_style"),
}


@pytest.mark.parametrize("preset", sorted(presets.PRESETS))
def test_families_expands_at_every_preset_to_one_flop_budget(preset, tmp_path):
    points = _expand("families", preset, tmp_path)
    assert {p.point: (p.config.model.arch, p.config.objective.name) for p in points} \
        == FAMILY_POINTS
    assert len(points) == len(FAMILY_POINTS) * len(presets.sweep_preset(preset).sweep.seeds)
    for point in points:
        assert point.config.sweep.zero_shot is True
        if point.config.objective.name == "span_corruption":
            assert (point.config.objective.noise_density,
                    point.config.objective.mean_noise_span_length) == (0.15, 3.0)
    budget, = {p.budget for p in points}
    assert (budget.kind, budget.reference) == ("flops", "encoder_decoder/span_corruption")
    assert budget.reference_steps == presets.sweep_preset(preset).train.steps
    for point in points:  # each spends the one budget to within half of its own step
        per_step = grid.StepCost.of(point.config, point.layout).flops
        assert abs(point.config.train.steps * per_step - budget.total) <= per_step / 2
        # ... on rows of its own objective's lengths, not padded to the family's widest (the
        # language model's steps halved when a prefix LM row joined its family).
        own = objectives.layout_for([point.config.objective], point.layout.family,
                                    point.config.model.vocab_size,
                                    point.config.model.num_sentinels)
        assert (point.layout.inputs_length, point.layout.targets_length) == (
            own.inputs_length, own.targets_length)


def test_an_experiment_file_runs_once_per_process_and_again_once_edited(tmp_path):
    """A sweep loads its experiment several times (overrides, expansion, each point in a
    worker), and a file may register an architecture, which must happen once."""
    path = tmp_path / "one_row.py"
    body = ("from t5x_lite import grid\n_table2 = grid.load_experiment('table2')\n"
            "GRID = _table2.GRID[:{rows}]\nget_config = _table2.get_config\n")
    path.write_text(body.format(rows=1))
    first = grid.load_experiment(str(path))
    assert grid.load_experiment(str(path)) is first and len(first.GRID) == 1
    path.write_text(body.format(rows=10))  # edited (another size, whatever the clock): again
    assert len(grid.load_experiment(str(path)).GRID) == 10
