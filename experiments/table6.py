"""Table 6 of the T5 paper (arXiv 1910.10683): corruption rate of the i.i.d. denoising objective.

The baseline objective (`iid_denoising`: tokens corrupted i.i.d., each run of corrupted tokens
replaced by one sentinel) at 10%, 15%, 25% and 50% corruption, with the baseline
encoder-decoder. Every run of corrupted tokens takes a sentinel, and the 50% row makes the most
runs: every row gets the sentinels the 50% row needs (`noise_lengths.iid_lengths`: 156 at the
paper's 512 inputs, more than T5's 100; the preset's count where that is more), so all rows
share one vocabulary.

    t5x-lite sweep table6 --preset tiny --workdir runs/table6
"""
from t5x_lite import noise_lengths, presets

RATES = (("10%", 0.10), ("15%", 0.15), ("25%", 0.25), ("50%", 0.50))
GRID = tuple(
    dict(point=f"rate_{round(rate * 100)}", row=row,
         overrides={"objective.name": "iid_denoising", "objective.noise_density": rate})
    for row, rate in RATES
)


def get_config(preset: str = "tiny"):
    """The base config every grid point starts from (`--config=experiments/table6.py:tiny`)."""
    config = presets.sweep_preset(preset)
    needed = noise_lengths.iid_lengths("iid_denoising", config.objective.inputs_length,
                                       max(rate for _, rate in RATES)).num_sentinels
    config.model.num_sentinels = max(config.model.num_sentinels, needed)
    return config
