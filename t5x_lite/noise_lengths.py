"""Exact length distributions of the i.i.d. objectives, and the fixed lengths chosen from them.

With i.i.d. noise (each raw token corrupted independently with probability p) the number of
corrupted tokens and of their runs is random, so the corrupted targets have random lengths,
while the jitted train step needs fixed shapes. This module computes, on the host, the exact
distribution of those lengths (float64 dynamic programming over the tokens) and chooses fixed
lengths that an example exceeds with probability at most OVERFLOW_PROBABILITY each. An example
that exceeds one anyway is left out of the loss and counted (`objectives.corrupt_with_details`,
the train step's `objective_overflow`).

The raw tokens per example are T5's, whatever the rate: its i.i.d. objectives
(`preprocessors.iid_denoising`, "Baseline pretraining objective used in Raffel et al., 2019")
cut the text with `split_tokens_to_inputs_length`, into pieces of inputs_length - 1 tokens
(room for EOS). The inputs then always fit: a run of noise becomes one sentinel or nothing.

For n raw tokens of which `noise` are corrupted, in `runs` maximal runs:
- iid_denoising: inputs = (n - noise) + runs + EOS, targets = noise + runs + final sentinel +
  EOS, sentinels used = runs + 1;
- drop_corrupted_tokens: inputs = (n - noise) + EOS, targets = noise + EOS, no sentinels.

    lengths = iid_lengths("iid_denoising", 512, 0.15)  # raw, inputs, targets, num_sentinels
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Iterator

import numpy as np

# Per example and per bound (inputs, targets, sentinels). At the paper's scale, 2^19 steps x
# 128 examples = 2^26 (6.7e7) examples, that is at most 67 expected examples over each bound
# and 201 over any of the three: 3 in a million examples left out of the loss. A smaller
# probability costs padding: at 512 inputs and 15% noise the targets average 144 tokens and the
# bound is 188, 212 or 231 tokens for 1e-3, 1e-6 or 1e-9.
OVERFLOW_PROBABILITY = 1e-6


@dataclasses.dataclass(frozen=True)
class TokenCount:
    """A length that grows token by token: `base` (EOS, the final sentinel) plus, per raw token,
    `clean` for a clean token, `run_start` for a noise token that starts a run (the first token
    or one after a clean token), `in_run` for a noise token after a noise token."""

    base: int
    clean: int
    run_start: int
    in_run: int


# Per objective: how its inputs, targets and sentinels grow with each raw token.
COUNTS: dict[str, dict[str, TokenCount]] = {
    "iid_denoising": {
        "inputs": TokenCount(base=1, clean=1, run_start=1, in_run=0),  # a sentinel per run
        "targets": TokenCount(base=2, clean=0, run_start=2, in_run=1),  # sentinel + token
        "sentinels": TokenCount(base=1, clean=0, run_start=1, in_run=0),
    },
    "drop_corrupted_tokens": {
        "inputs": TokenCount(base=1, clean=1, run_start=0, in_run=0),
        "targets": TokenCount(base=1, clean=0, run_start=1, in_run=1),
        "sentinels": TokenCount(base=0, clean=0, run_start=0, in_run=0),
    },
}


@dataclasses.dataclass(frozen=True)
class IidLengths:
    """The fixed lengths of one i.i.d. objective at one (inputs_length, noise_density)."""

    raw_length: int  # raw tokens per example: inputs_length - 1, as T5 cuts them
    inputs_length: int  # inputs incl. EOS (the inputs_length asked for)
    targets_length: int  # targets incl. EOS, exceeded with probability <= OVERFLOW_PROBABILITY
    num_sentinels: int  # sentinels used, exceeded with probability <= OVERFLOW_PROBABILITY


def _distributions(count: TokenCount, noise_density: float) -> Iterator[np.ndarray]:
    """The distribution of `count` after n = 0, 1, 2, ... i.i.d. Bernoulli(noise_density) tokens:
    float64[max + 1], entry v = P(count == v)."""
    p = float(noise_density)
    # state[previous, v] = P(count == v and the last token is clean (0; also before the first
    # token, whose noise then starts a run) or noise (1)).
    state = np.zeros((2, count.base + 1))
    state[0, count.base] = 1.0
    while True:
        yield state.sum(axis=0)
        width = state.shape[1]
        new = np.zeros((2, width + max(count.clean, count.run_start, count.in_run)))
        new[0, count.clean:count.clean + width] += (1 - p) * state.sum(axis=0)
        new[1, count.run_start:count.run_start + width] += p * state[0]
        new[1, count.in_run:count.in_run + width] += p * state[1]
        state = new


def _distribution(count: TokenCount, noise_density: float, num_tokens: int) -> np.ndarray:
    return next(itertools.islice(_distributions(count, noise_density), num_tokens, None))


def length_distributions(objective: str, num_tokens: int,
                         noise_density: float) -> dict[str, np.ndarray]:
    """{'inputs', 'targets', 'sentinels'} -> float64[max + 1], entry v = P(length == v), for
    `objective` (a key of COUNTS) corrupting num_tokens raw tokens i.i.d. at noise_density."""
    return {name: _distribution(count, noise_density, num_tokens)
            for name, count in COUNTS[objective].items()}


def smallest_bound(pmf: np.ndarray, probability: float = OVERFLOW_PROBABILITY) -> int:
    """The smallest t with P(length > t) <= probability."""
    # exceeds[t] = P(length > t), accumulated from the top so that small tails stay exact.
    exceeds = np.append(np.cumsum(pmf[::-1])[::-1][1:], 0.0)
    return int(np.argmax(exceeds <= probability))


@functools.lru_cache(maxsize=None)
def iid_lengths(objective: str, inputs_length: int, noise_density: float) -> IidLengths:
    """The fixed lengths of `objective` (a key of COUNTS) for inputs of inputs_length tokens
    incl. EOS, at noise_density in (0, 1):

    - raw_length: inputs_length - 1 (T5's `split_tokens_to_inputs_length`), whose inputs are
      never longer than inputs_length;
    - targets_length, num_sentinels: the smallest bounds that an example of raw_length tokens
      exceeds with probability <= OVERFLOW_PROBABILITY.
    """
    counts = COUNTS[objective]
    raw_length = inputs_length - 1
    return IidLengths(
        raw_length=raw_length, inputs_length=inputs_length,
        targets_length=smallest_bound(_distribution(counts["targets"], noise_density, raw_length)),
        num_sentinels=smallest_bound(_distribution(counts["sentinels"], noise_density,
                                                   raw_length)))
