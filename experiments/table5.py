"""Table 5 of the T5 paper (arXiv 1910.10683): variants of the BERT-style objective.

All at 15% i.i.d. corruption (each token independently) with the baseline encoder-decoder.
BERT-style: corrupted tokens become the mask token (90%) or a random token (10%), the target is
the original text. MASS-style: every corrupted token becomes the mask token. Replace corrupted
spans (the baseline, `iid_denoising`): each run of corrupted tokens becomes one sentinel, the
targets are the runs led by their sentinels. Drop corrupted tokens: corrupted tokens are removed
from the inputs and are the targets.

    t5x-lite sweep table5 --preset tiny --workdir runs/table5
"""
from t5x_lite import presets

IID_15 = {"objective.noise_density": 0.15}
GRID = (
    dict(point="bert_style", row="BERT-style",
         overrides={"objective.name": "bert_style", **IID_15}),
    dict(point="mass_style", row="MASS-style",
         overrides={"objective.name": "mass_style", **IID_15}),
    dict(point="replace_spans", row="Replace corrupted spans",
         overrides={"objective.name": "iid_denoising", **IID_15}),
    dict(point="drop_tokens", row="Drop corrupted tokens",
         overrides={"objective.name": "drop_corrupted_tokens", **IID_15}),
)


def get_config(preset: str = "tiny"):
    """The base config every grid point starts from (`--config=experiments/table5.py:tiny`)."""
    return presets.sweep_preset(preset)
