"""Table 7 of the T5 paper (arXiv 1910.10683): mean length of the corrupted spans.

15% corruption with the baseline encoder-decoder. "i.i.d." is the baseline (`iid_denoising`:
tokens corrupted independently, each run replaced by one sentinel); the other rows draw spans
of mean length 2, 3, 5 and 10 (`span_corruption`, T5's `random_spans_noise_mask`).

    t5x-lite sweep table7 --preset tiny --workdir runs/table7
"""
from t5x_lite import presets

GRID = (
    dict(point="span_1", row="i.i.d.",
         overrides={"objective.name": "iid_denoising", "objective.noise_density": 0.15}),
    *(dict(point=f"span_{length}", row=str(length),
           overrides={"objective.name": "span_corruption", "objective.noise_density": 0.15,
                      "objective.mean_noise_span_length": float(length)})
      for length in (2, 3, 5, 10)),
)


def get_config(preset: str = "tiny"):
    """The base config every grid point starts from (`--config=experiments/table7.py:tiny`)."""
    return presets.sweep_preset(preset)
