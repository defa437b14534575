"""UL2's mixture of denoisers (Tay et al. 2022, arXiv 2205.05131): the denoisers, their draw
per example and the S-denoiser's split, on the device; their validation, on the host.

`t5x_lite.objectives` builds the `ul2` objective's inputs and targets from these (its encoder
`_ul2`, which reuses span corruption); here is only what is particular to UL2.

The paper's definitions (section 3.1.1, "Denoising Task"): a denoiser is span corruption
with three values (mu, r, n), the mean span length, the corruption rate and the number of
corrupted spans. Section 3.1.2, "Mixture of Denoisers":
- R-Denoiser, (mu = 3, r = 0.15, n) and (mu = 8, r = 0.15, n): "the standard span corruption
  introduced in Raffel et al. (2019) that uses a range of 2 to 5 tokens as the span length,
  which masks about 15% of input tokens";
- S-Denoiser, (mu = L/4, r = 0.25, 1): "a specific case of denoising where we observe a strict
  sequential order when framing the inputs-to-targets task, i.e., prefix language modeling";
  section 3.1.1: "for S-Denoisers, we use a uniform distribution, fix the number of corrupted
  spans to 1 and have an additional constraint that the corrupted span should end at the end
  of the original input text";
- X-Denoiser, (mu = 3, r = 0.5, n), (mu = 8, r = 0.5, n), (mu = 64, r = 0.15, n) and
  (mu = 64, r = 0.5, n): "an extreme version of denoising where the model must recover a
  large part of the input, given a small to moderate part of it".
The final objective mixes these seven. The default shares (`config.UL2_DENOISERS`) give S 20%
and the R- and X-denoisers 40% each, split equally among each kind's denoisers: what public
ports of the paper's appendix code (its `ul2_objective` snippet, whose `rates` default to
uniform) cite from its section 4.5; they were not checked against the paper's own text here.
Section 3.2, "Mode Switching": each example's input starts with its denoiser's paradigm
token, [NLU] for the R-denoisers, [NLG] for the X-denoisers, [S2S] for the S-denoiser
(`batch_format.mode_token`). For downstream tasks the paper adds "a paradigm token with
respect to the setups and requirements of the downstream task": `finetune.mode_token` puts
one before every task input (fine-tuning, validation, evaluation, zero-shot scoring; None by
default, as T5's; which token suits which task is the researcher's choice, not checked here
against the paper's own runs).

What runs here, for an n-token example:
- R and X: span corruption (`objectives` span_corruption, T5's `random_spans_noise_mask`: its
  round(n r) noise tokens in round(noise / mu) spans) at the denoiser's r and mu. That mask
  starts with clean tokens and ends with noise, so a denoiser left with one span always
  corrupts the last tokens: X (mu = 64, r = 0.15) at 512 inputs has 90 noise tokens in one
  span, the text's last 90 (T5's mask at its default, without `random_roll`), an S-like task
  under the [NLG] token;
- S: the target is the one span that ends the text, split off as T5's
  `random_prefix_noise_mask` at noise density r splits: the prefix keeps k tokens, k uniform
  over [k_min, n - 1], k_min = min(n - 1, max(1, round((1 - 2 r)(n - 1)))) (`s_fewest_inputs`),
  so the target's length is uniform over [1, n - k_min], its mean about r n = L/4 at the
  paper's r = 0.25. At r = 0.5, k_min = 1: exactly the `prefix_lm` objective's uniform split
  (and the same split for the same draw), which is also what the paper's appendix code (T5's
  `prefix_lm`, noise density 0.5) runs; the paper's text asks for r = 0.25, the default here;
- the denoiser's mode token is prepended to its inputs. Each denoiser's lengths are computed
  for inputs_length - 1, so that the mode token fits.
The denoiser is drawn per example on the device (`choose`, from one of the example's uniform
draws that no denoiser reads), so one compiled program serves a batch mixing all of them.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from t5x_lite import batch_format
from t5x_lite.errors import ConfigError, require_choice, require_number

KINDS = ("R", "S", "X")
# Section 3.2's paradigm tokens, per kind of denoiser.
MODE_OF_KIND = {"R": "[NLU]", "S": "[S2S]", "X": "[NLG]"}
FIELD = "objective.ul2_denoisers"


class Denoiser(NamedTuple):
    """One denoiser of a layout's mixture, with the raw tokens it reads (`objectives`)."""

    kind: str  # one of KINDS
    noise_density: float  # r
    mean_noise_span_length: float  # mu (R and X; the S-denoiser ignores it)
    share: float  # its probability in the mixture
    # Raw tokens it corrupts (`objective_layout.ul2_denoiser_lengths`): span corruption's at
    # inputs_length - 1 for R and X, inputs_length - 1 itself for S.
    raw_length: int


def check_denoisers(denoisers: Any) -> None:
    """Raise a one-line `ConfigError` naming `objective.ul2_denoisers` unless `denoisers` is a
    non-empty sequence of (kind in KINDS, noise_density in (0, 1), mean_noise_span_length >= 1,
    share > 0) whose shares sum to 1. An S-denoiser's noise_density is at most 0.5, as T5's
    `random_prefix_noise_mask` requires: above it, its fewest prefix tokens (`s_fewest_inputs`)
    would be 1 for every r, each acting as 0.5."""
    if isinstance(denoisers, str) or not isinstance(denoisers, Sequence) or not denoisers:
        raise ConfigError(f"{FIELD}={denoisers!r} must be a non-empty tuple of (kind, "
                          "noise_density, mean_noise_span_length, share) tuples")
    for i, entry in enumerate(denoisers):
        field = f"{FIELD}[{i}]"
        if isinstance(entry, str) or not isinstance(entry, Sequence) or len(entry) != 4:
            raise ConfigError(f"{field}={entry!r} must be a (kind, noise_density, "
                              "mean_noise_span_length, share) tuple")
        kind, density, span, share = entry
        require_choice(f"{field} kind", kind, KINDS)
        for name, value, ok, allowed in (
                ("noise_density", density, lambda v: 0 < v < 1, "a number in (0, 1)"),
                ("mean_noise_span_length", span, lambda v: v >= 1, "a number >= 1"),
                ("share", share, lambda v: v > 0, "a number > 0")):
            require_number(f"{field} {name}", value, ok, allowed)
        if kind == "S" and density > 0.5:
            raise ConfigError(f"{field} noise_density={density!r} must be a number in (0, 0.5] "
                              "for the S-denoiser (as T5's random_prefix_noise_mask requires: "
                              "above 0.5 it would act as 0.5)")
    total = math.fsum(entry[3] for entry in denoisers)
    if abs(total - 1.0) > 1e-6:
        raise ConfigError(f"{FIELD} shares sum to {total:g}; they must sum to 1")


def mode_tokens(denoisers: Sequence[Denoiser], vocab_size: int, num_sentinels: int) -> list[int]:
    """Each denoiser's mode token id (`batch_format.mode_token`)."""
    return [batch_format.mode_token(MODE_OF_KIND[d.kind], vocab_size, num_sentinels)
            for d in denoisers]


def _cumulative_shares(denoisers: Sequence[Denoiser]) -> np.ndarray:
    """float32[D - 1]: the upper ends of the first D - 1 denoisers' intervals in [0, 1)."""
    return np.cumsum([d.share for d in denoisers])[:-1].astype(np.float32)


def choose(uniform: jax.Array, denoisers: Sequence[Denoiser]) -> jax.Array:
    """int32 index of the denoiser an example draws, from a uniform draw in [0, 1) (any shape):
    denoiser i with probability denoisers[i].share (the last one takes any rounding rest)."""
    return jnp.searchsorted(jnp.asarray(_cumulative_shares(denoisers)), uniform,
                            side="right").astype(jnp.int32)


def s_fewest_inputs(noise_density: Any, valid_length: Any, xp: Any = jnp) -> Any:
    """k_min = min(n - 1, max(1, round((1 - 2 r)(n - 1)))), the fewest prefix tokens the
    S-denoiser keeps of an n-token example: T5's `random_prefix_noise_mask`'s fewest input
    tokens (float32 product, round half to even), alike on host (xp=np) and device."""
    f32 = xp.float32
    most = xp.asarray(valid_length, xp.int32) - 1
    scaled = xp.round((1 - 2 * xp.asarray(noise_density, f32)) * most.astype(f32))
    return xp.minimum(most, xp.maximum(scaled.astype(xp.int32), 1))


def s_split(uniform: jax.Array, noise_density: Any, valid_length: Any) -> jax.Array:
    """int32 split point of the S-denoiser: inputs = tokens [0, split), target = [split, n),
    uniform over [k_min, n - 1] (`s_fewest_inputs`; 1 when n < 2). At r = 0.5 this is
    `objectives.random_prefix_split`'s rule and value for the same draw."""
    n = jnp.asarray(valid_length, jnp.int32)
    low = jnp.maximum(s_fewest_inputs(noise_density, n), 1)
    high = jnp.maximum(n, 2)
    return jnp.minimum(low + jnp.floor(uniform * (high - low)).astype(jnp.int32), high - 1)


def describe(denoiser: Denoiser) -> dict[str, Any]:
    """A denoiser as preview's `--json` names it."""
    return {"kind": denoiser.kind, "mode": MODE_OF_KIND[denoiser.kind],
            "noise_density": denoiser.noise_density,
            "mean_noise_span_length": denoiser.mean_noise_span_length, "share": denoiser.share}
