"""UL2's objective ablation (Tay et al. 2022, "UL2: Unifying Language Learning Paradigms",
arXiv 2205.05131, sections 3 and 4): does the mixture of denoisers beat single objectives,
on both an encoder-decoder and a decoder-only model?

The grid is two architectures x seven objectives, every architecture's rows in one block:
- architectures: `encoder_decoder` (T5's baseline) and `prefix_lm` (decoder-only, its inputs
  attended to bidirectionally; with no inputs, the causal LM row, it is a causal decoder);
- objectives: span corruption (T5's, `span_corruption`: 15% of the tokens in spans of mean
  length 3), prefix LM (`prefix_lm`: a uniform split, the prefix as inputs), causal LM (`lm`:
  no inputs; on the prefix_lm architecture that is a plain causal decoder, GPT-like), and the
  `ul2` objective with `objective.ul2_denoisers` set to the R-denoisers only, the S-denoiser
  only, the X-denoisers only, or all seven (`config.UL2_DENOISERS`, the default mixture).
  "R only" etc. keep that kind's denoisers from `config.UL2_DENOISERS` with their shares
  renormalised to sum to 1 (`only`); each example still starts with its kind's mode token.
  Fine-tuning puts no mode token before the task inputs (`finetune.mode_token` None, T5's
  protocol for every row): the paper's mode switching adds one chosen for the downstream
  task, which its reachable text does not name per task. To fine-tune the ul2 rows with one,
  set it in their rows' overrides (a row pre-trained without the mixture never saw one).
All rows of one architecture train on rows of one size (the longest objective's lengths); the
three single objectives share one compiled pre-training step per architecture, and each ul2
mixture compiles its own (the mixture is part of the layout): 10 programs in all.

What the paper finds, in its abstract's words: "We conduct extensive ablative experiments to
compare multiple pre-training objectives and find that our method pushes the Pareto-frontier
by outperforming T5 and/or GPT-like models across multiple diverse setups", T5-like being the
encoder-decoder with span corruption and GPT-like the decoder-only causal LM; the abstract
also sets out to disentangle "architectural archetypes" from pre-training objectives, hence
every objective on both architectures here.

Published numbers and findings: the copies of the paper this project could reach (the ICLR
2023 text and web copies, searched 2026-12-02) showed their opening only, not section 4 or its
tables, so the published scores are not transcribed (the report shows our scores alone) and
no finding is stated beyond the abstract's; none is judged by `t5x_lite.findings`. Our rows
differ from the paper's anyway: R, S and X only are rows of our own, the one-kind mixtures
the question "does the mixture beat its parts" needs.

    t5x-lite sweep ul2 --preset demo --workdir runs/ul2
"""
from __future__ import annotations

import math

from t5x_lite import objectives, presets
from t5x_lite.config import UL2_DENOISERS


def only(kind: str) -> tuple[tuple[str, float, float, float], ...]:
    """The denoisers of `config.UL2_DENOISERS` of one kind ("R", "S" or "X"), their shares
    renormalised to sum to 1 (e.g. R only: R (0.15, 3) and R (0.15, 8) at 1/2 each)."""
    kept = [denoiser for denoiser in UL2_DENOISERS if denoiser[0] == kind]
    total = math.fsum(share for *_, share in kept)
    return tuple((k, rate, span, share / total) for k, rate, span, share in kept)


UL2 = {"objective.name": "ul2"}
# (point id, the objective label, its overrides)
OBJECTIVES = (
    ("span_corruption", "Span corruption",
     {"objective.name": "span_corruption", "objective.noise_density": 0.15,
      "objective.mean_noise_span_length": 3.0}),
    ("prefix_lm", "Prefix LM", {"objective.name": "prefix_lm"}),
    ("lm", "Causal LM", {"objective.name": "lm"}),
    ("r_only", "R only", {**UL2, "objective.ul2_denoisers": only("R")}),
    ("s_only", "S only", {**UL2, "objective.ul2_denoisers": only("S")}),
    ("x_only", "X only", {**UL2, "objective.ul2_denoisers": only("X")}),
    ("ul2", "UL2 mixture", {**UL2, "objective.ul2_denoisers": UL2_DENOISERS}),
)
# (model.arch, the row label)
ARCHITECTURES = (("encoder_decoder", "Encoder-decoder"), ("prefix_lm", "Decoder-only (prefix LM)"))
GRID = tuple(
    dict(point=f"{arch}/{point}", row=row, objective=objective,
         overrides={"model.arch": arch, **overrides})
    for arch, row in ARCHITECTURES
    for point, objective, overrides in OBJECTIVES
)


def sentinels_needed(inputs_length: int) -> int:
    """The sentinel ids the mixture needs at `inputs_length`: the most spans one of its R- or
    X-denoisers makes, plus the mode tokens (the vocabulary's last sentinels), as ul2's record
    counts them (`objective_layout.ul2_sentinels`)."""
    point, record = dict(name="ul2", inputs_length=inputs_length,
                         ul2_denoisers=UL2_DENOISERS), objectives.get("ul2")
    return record.sentinels_needed(point, record.lengths(point)[0])[0]


def get_config(preset: str = "tiny"):
    """The base config every grid point starts from (`--config=experiments/ul2.py:tiny`):
    the preset, with as many sentinels as the X-denoisers need where it has fewer (130 at the
    paper's 512 inputs, where T5's vocabulary has 100), so every row has one vocabulary."""
    config = presets.sweep_preset(preset)
    config.model.num_sentinels = max(config.model.num_sentinels,
                                     sentinels_needed(config.objective.inputs_length))
    return config
