"""Table 4 of the T5 paper (arXiv 1910.10683): three high-level pre-training objectives.

All with the baseline encoder-decoder. Prefix language modeling: a random split, the prefix
to the encoder. BERT-style: 15% of tokens corrupted i.i.d. (90% of them become the mask token,
10% a random token); the target is the original text. Deshuffling: the tokens shuffled; the
target is the original text.

    t5x-lite sweep table4 --preset tiny --workdir runs/table4
"""
from t5x_lite import presets

GRID = (
    dict(point="prefix_lm", row="Prefix language modeling",
         overrides={"objective.name": "prefix_lm"}),
    dict(point="bert_style", row="BERT-style",
         overrides={"objective.name": "bert_style", "objective.noise_density": 0.15}),
    dict(point="deshuffling", row="Deshuffling", overrides={"objective.name": "deshuffling"}),
)


def get_config(preset: str = "tiny"):
    """The base config every grid point starts from (`--config=experiments/table4.py:tiny`)."""
    return presets.sweep_preset(preset)
