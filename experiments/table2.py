"""Table 2 of the T5 paper (arXiv 1910.10683): five architectures x {denoising, LM} objectives.

Denoising is the paper's baseline objective (section 3.1.4): each token corrupted i.i.d. with
probability 15%, each run of corrupted tokens replaced by one sentinel, the targets the runs
led by their sentinels (`iid_denoising`). LM (section 3.2.3) depends on the architecture:
- the encoder-decoders get the prefix LM objective: a random split point, the prefix to the
  encoder, the rest as targets (`prefix_lm`);
- "Language model" gets the plain language-modelling objective over the whole span (`lm`);
- "Prefix LM" gets the prefix LM objective with its prefix attended to bidirectionally.
Points of one parameter structure (the three encoder-decoders each, and the two decoder-only
architectures together) share one compiled pre-training step.

    t5x-lite sweep table2 --preset tiny --workdir runs/table2
"""
from t5x_lite import presets

DENOISING = {"objective.name": "iid_denoising", "objective.noise_density": 0.15}
# (model.arch, the paper's row label, the arch's LM objective)
ARCHITECTURES = (
    ("encoder_decoder", "Encoder-decoder", "prefix_lm"),
    ("encoder_decoder_shared", "Enc-dec, shared", "prefix_lm"),
    ("encoder_decoder_half", "Enc-dec, 6 layers", "prefix_lm"),
    ("language_model", "Language model", "lm"),
    ("prefix_lm", "Prefix LM", "prefix_lm"),
)
# The paper's order: every architecture with denoising, then every architecture with LM.
GRID = tuple(
    dict(
        point=f"{arch}/{objective.lower()}",
        row=row,
        objective=objective,
        overrides={"model.arch": arch,
                   **(DENOISING if objective == "Denoising" else {"objective.name": lm})},
    )
    for objective in ("Denoising", "LM")
    for arch, row, lm in ARCHITECTURES
)


def get_config(preset: str = "tiny"):
    """The base config every grid point starts from (`--config=experiments/table2.py:tiny`)."""
    return presets.sweep_preset(preset)
