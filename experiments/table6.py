"""Table 6 of the T5 paper (arXiv 1910.10683): corruption rate of the i.i.d. denoising objective.

The baseline objective (each run of corrupted tokens replaced by one sentinel, tokens chosen
i.i.d.) at 10%, 15%, 25% and 50% corruption, with the baseline encoder-decoder.
With mean span length 1 every corrupted token gets its own sentinel, so the 50% row needs up
to inputs_length / 2 sentinels (256 at the paper's 512, more than T5's 100); every row uses
that many, so all rows share one vocabulary.

    t5x-lite sweep table6 --preset tiny --workdir runs/table6
"""
from t5x_lite import presets

RATES = (("10%", 0.10), ("15%", 0.15), ("25%", 0.25), ("50%", 0.50))
GRID = tuple(
    dict(point=f"rate_{round(rate * 100)}", row=row,
         overrides={"objective.name": "span_corruption", "objective.noise_density": rate,
                    "objective.mean_noise_span_length": 1.0})
    for row, rate in RATES
)


def get_config(preset: str = "tiny"):
    """The base config every grid point starts from (`--config=experiments/table6.py:tiny`)."""
    config = presets.sweep_preset(preset)
    config.model.num_sentinels = max(config.model.num_sentinels,
                                     config.objective.inputs_length // 2)
    return config
