"""Architecture families at equal FLOPs, scored zero-shot and after fine-tuning (Wang et al.
2022, arXiv 2204.05832, "What Language Model Architecture and Pretraining Objective Work Best
for Zero-Shot Generalization?").

What it asks: which architecture and pre-training objective gives the better model in each of
Wang et al.'s two regimes, scored zero-shot right after self-supervised pre-training
(`sweep.zero_shot=True`: the label options ranked by their log-likelihood, `t5x_lite.zero_shot`)
and after fine-tuning. Four architectures, each with its natural objective, and the three that
can take it also with span corruption (seven points), every point pre-trained on the same FLOP budget (`sweep.budget="flops"`): what the
T5 encoder-decoder with span corruption spends in the preset's `train.steps`
(`sweep.budget_reference`); a cheaper step runs more steps (`grid.match_budget`).

Wang et al.'s finding as their abstract states it: causal decoder-only models trained on an
autoregressive language modeling objective show the strongest zero-shot generalization after
purely unsupervised pre-training, while models with non-causal visibility on their input
trained with a masked language modeling objective followed by multitask fine-tuning perform
best. Their fine-tuning is multitask prompted fine-tuning and their models have 5B parameters
trained on 170B tokens; here each task is fine-tuned on its own (GLUE's as one task at the
`small` and `paper` presets), at the preset's size, so the grid asks the same question on a
much smaller scale.

The natural objective of each architecture is Wang et al.'s autoregressive objective in the
form the architecture takes (their CD:FLM, ND:PLM, ED:PLM):
- `language_model` (causal decoder): plain language modelling over the whole span (`lm`);
- `prefix_lm` (non-causal decoder): prefix language modelling, the prefix attended
  bidirectionally (`prefix_lm`);
- `encoder_decoder`: prefix language modelling, the prefix to the encoder (`prefix_lm`). T5
  itself pre-trained it with span corruption, but that is this grid's second column; Wang et
  al. give the encoder-decoder the prefix LM as its autoregressive objective, and so do we;
- `encoder_only` (BERT-style, not in Wang et al.): its masked LM, `bert_style`.
Span corruption is their masked language modelling, T5's: 15% of the tokens in spans of mean
length 3, each span replaced by a sentinel (`span_corruption`). `encoder_only` has no span
corruption point: it predicts the corrupted tokens in place, and span corruption's targets
(the spans led by their sentinels) are a sequence of their own
(`architectures.get("encoder_only").objectives` allows only bert_style and mass_style).

    t5x-lite sweep families --preset demo --workdir runs/families
"""
from t5x_lite import architectures, presets

SPAN_CORRUPTION = {"objective.name": "span_corruption", "objective.noise_density": 0.15,
                   "objective.mean_noise_span_length": 3.0}
# (model.arch, row label, its natural objective)
ARCHITECTURES = (
    ("encoder_decoder", "Encoder-decoder", "prefix_lm"),
    ("language_model", "Causal decoder", "lm"),
    ("prefix_lm", "Non-causal decoder", "prefix_lm"),
    ("encoder_only", "Encoder-only", "bert_style"),
)
# Each architecture's points, its natural objective first, then span corruption where the
# architecture trains on it (not encoder_only, which predicts in place).
GRID = tuple(
    point
    for arch, row, natural in ARCHITECTURES
    for point in (
        dict(point=f"{arch}/natural", row=row, objective=f"Natural ({natural})",
             overrides={"model.arch": arch, "objective.name": natural}),
        *([dict(point=f"{arch}/span_corruption", row=row, objective="Span corruption",
                overrides={"model.arch": arch, **SPAN_CORRUPTION})]
          if "span_corruption" in architectures.get(arch).objectives else []),
    )
)
# The budget every point spends: T5's encoder-decoder with span corruption in train.steps.
BUDGET_REFERENCE = "encoder_decoder/span_corruption"


def get_config(preset: str = "tiny"):
    """The base config every grid point starts from (`--config=experiments/families.py:tiny`):
    the sweep preset, compute-matched in FLOPs to `BUDGET_REFERENCE`, with the zero-shot stage."""
    config = presets.sweep_preset(preset)
    config.sweep.update(budget="flops", budget_reference=BUDGET_REFERENCE, zero_shot=True)
    return config
