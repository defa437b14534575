"""Table 7 of the T5 paper (arXiv 1910.10683): mean length of the corrupted spans.

Span corruption at 15% with the baseline encoder-decoder. "i.i.d." is the baseline (tokens
corrupted independently, runs merged into one sentinel: mean span length 1); the other rows
draw spans of mean length 2, 3, 5 and 10 (T5's `random_spans_noise_mask`).

    t5x-lite sweep table7 --preset tiny --workdir runs/table7
"""
from t5x_lite import presets

SPAN_LENGTHS = (("i.i.d.", 1), ("2", 2), ("3", 3), ("5", 5), ("10", 10))
GRID = tuple(
    dict(point=f"span_{length}", row=row,
         overrides={"objective.name": "span_corruption", "objective.noise_density": 0.15,
                    "objective.mean_noise_span_length": float(length)})
    for row, length in SPAN_LENGTHS
)


def get_config(preset: str = "tiny"):
    """The base config every grid point starts from (`--config=experiments/table7.py:tiny`)."""
    return presets.sweep_preset(preset)
