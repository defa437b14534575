"""The objectives' host side: what a train step is fed and how a grid's batches are shaped.

`ObjectiveSpec` is one grid point's objective settings as arrays (a traced argument of the
train step); `BatchLayout` the static shapes one compiled program serves; then T5's length
arithmetic (`lengths_for`, `expected_loss_tokens`), UL2's denoisers' lengths, and the checks
and constructors from a config (`spec_from_config`, `layout_for`, `layout_from_config`).
The objectives' definitions and the device code that runs them are `t5x_lite.objectives`,
which re-exports these names: callers write `objectives.layout_for`.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterable, Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from t5x_lite import (architectures, bart_noising, batch_format, glm, noise_lengths,
                      objective_registry, ul2)
from t5x_lite.config import MIN_INPUTS_LENGTH, UL2_DENOISERS, ConfigError, default_config
from t5x_lite.errors import require_choice, require_number
from t5x_lite.settings import check_objective, require_vocab_room


# ---------------------------------------------------------------------------------------------
# Spec and layout
# ---------------------------------------------------------------------------------------------


@flax.struct.dataclass
class ObjectiveSpec:
    """One grid point's objective settings as arrays, a traced argument of the train step.

    Every field is a scalar, or an array of shape [batch] to give each example its own
    setting (a vectorised sweep).
    """

    objective: jax.Array  # int32, the objective's id (`objective_registry.objective_id`)
    noise_density: jax.Array  # float32, share of corrupted tokens
    # float32: span corruption's mean span length; text and blank infilling's Poisson lambda
    mean_noise_span_length: jax.Array
    random_token_fraction: jax.Array  # float32, bert_style: share of noise made random tokens
    raw_length: jax.Array  # int32, leading raw tokens used (<= BatchLayout.raw_length)


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """Static shapes of a corrupted batch; one layout (and one compiled program) serves a grid.

    The batch holds rows of `family`'s format (`t5x_lite.batch_format`) with room for
    `inputs_length` input and `targets_length` target tokens: encoder-decoder batches have
    encoder inputs [B, inputs_length] and decoder rows [B, targets_length]; decoder-only
    batches have rows [B, inputs_length + targets_length]; encoder-only batches (targets_length
    0: predicted in place) have rows [B, inputs_length].

    `objectives`: the names (in registry order) the program can run, the branches of its
    objective switch (by default every registered one): a grid's own, so a step compiles only
    the corruption its points use (`layout_for`); every spec fed with the layout must name one
    of them (`require_objective`).
    `denoisers`: the ul2 objective's mixture, each with its raw length (empty without ul2).
    """

    family: str
    raw_length: int
    inputs_length: int
    targets_length: int
    vocab_size: int
    num_sentinels: int
    objectives: tuple[str, ...] = dataclasses.field(default_factory=objective_registry.names)
    denoisers: tuple[ul2.Denoiser, ...] = ()
    # Per vocabulary id, its sentence class (`bart_noising.sentence_classes`), which the
    # sentence objectives read sentences from; None until `with_sentences` binds the run's
    # vocabulary (then only EOS ends a sentence, and no train step accepts the layout).
    sentence_classes: bytes | None = dataclasses.field(default=None, repr=False)

    def runs(self) -> tuple[str, ...]:
        """The objectives the program compiles: `objectives`, but ul2 only with its mixture
        (a layout built without a ul2 point, e.g. with every objective, has none)."""
        return tuple(name for name in self.objectives if name != "ul2" or self.denoisers)

    @property
    def reads_sentences(self) -> bool:
        """Whether the layout runs an objective that reads sentences (`reads_sentences`)."""
        return any(objective_registry.get(name).reads_sentences for name in self.objectives)

    def with_sentences(self, vocab: Any) -> BatchLayout:
        """This layout, reading sentences off `vocab`'s pieces (a `Vocabulary`, the one the raw
        tokens come from) if it runs a sentence objective; unchanged otherwise, so that the
        other objectives' programs stay as they are."""
        if not self.reads_sentences:
            return self
        if vocab.vocab_size != self.vocab_size:
            raise ValueError(f"the vocabulary has {vocab.vocab_size} ids; the layout needs "
                             f"vocab_size={self.vocab_size}")
        return dataclasses.replace(
            self, sentence_classes=bart_noising.sentence_classes(vocab.pieces()))

    def require_sentences(self) -> None:
        """Raise unless a layout that runs a sentence objective knows the vocabulary's
        sentence ends (`with_sentences`): without them every chunk would be one sentence."""
        if self.reads_sentences and self.sentence_classes is None:
            raise ValueError("the layout runs a sentence objective but has no sentence classes: "
                             "bind the run's vocabulary with BatchLayout.with_sentences")

    def require_objective(self, name: str) -> None:
        """Raise a one-line `ConfigError` unless this layout's program runs `name`."""
        if name not in self.runs():
            raise ConfigError(f"objective.name={name!r} is not in the batch layout of this run, "
                              f"which serves {', '.join(map(repr, self.runs()))}")


# ---------------------------------------------------------------------------------------------
# Length arithmetic (host)
# ---------------------------------------------------------------------------------------------


def noise_counts(length: Any, noise_density: Any, mean_noise_span_length: Any,
                 xp: Any = jnp) -> tuple[Any, Any]:
    """(num_noise, num_spans) for `length` tokens, as T5's `random_spans_noise_mask` counts them:
    int32 scalars or arrays of the inputs' broadcast shape (numpy for xp=np, jax for xp=jnp).

    Shared by the host length arithmetic (xp=np) and the device masks (xp=jnp) so both round
    identically: float32 products, round half to even, as T5's TensorFlow code does.
    """
    f32 = xp.float32
    num_noise = xp.round(xp.asarray(length, f32) * xp.asarray(noise_density, f32)).astype(xp.int32)
    num_noise = xp.minimum(xp.maximum(num_noise, 1), length - 1)
    num_spans = xp.round(num_noise.astype(f32) / xp.asarray(mean_noise_span_length, f32))
    return num_noise, xp.maximum(num_spans.astype(xp.int32), 1)


def span_counts(length: int, noise_density: float, mean_span: float) -> tuple[int, int]:
    """(noise tokens, noise spans) that `random_spans_noise_mask` makes in `length` tokens:
    `noise_counts`, with at most one span per clean token. Past that (e.g. density 0.8 with mean
    span 1) the mask's clean segments run out: each clean token is a segment of its own and the
    noise spans after the last one merge, leaving exactly length - noise spans."""
    num_noise, num_spans = (int(c) for c in noise_counts(length, noise_density, mean_span, np))
    return num_noise, min(num_spans, length - num_noise)


def _span_corruption_lengths(raw_length: int, noise_density: float, mean_span: float,
                             as_t5_helper: bool = False) -> tuple[int, int]:
    """(inputs, targets) incl. EOS that span corruption makes of raw_length tokens: non-noise +
    spans + 1 and noise + spans + 1 (one sentinel per span, no final sentinel; `span_counts`).
    as_t5_helper: count the spans as T5's `random_spans_helper` does, one per drawn span whether
    or not the mask merges it (`noise_counts`)."""
    if as_t5_helper:
        num_noise, num_spans = (int(c) for c in noise_counts(raw_length, noise_density,
                                                             mean_span, np))
    else:
        num_noise, num_spans = span_counts(raw_length, noise_density, mean_span)
    return raw_length - num_noise + num_spans + 1, num_noise + num_spans + 1


def _largest_raw_length(inputs_length: int, lengths_of_raw) -> int:
    """The largest raw length whose inputs (`lengths_of_raw(raw)[0]`) fit in inputs_length.
    Inputs grow with the raw length and raw = inputs_length - 1 always fits (spans <= noise)."""
    raw = inputs_length - 1
    while lengths_of_raw(raw + 1)[0] <= inputs_length:
        raw += 1
    return raw


def raw_length_for(inputs_length: int, noise_density: float,
                   mean_noise_span_length: float) -> tuple[int, int]:
    """(raw_tokens_length, targets_length) for span corruption, T5's `random_spans_helper` rule.

    The raw length is the largest whose corrupted inputs (incl. EOS) fit in `inputs_length`.
    At density 0.5 T5 shortens the raw length by one when the targets would be longer than the
    inputs (so that targets_length equals the round inputs_length).
    E.g. (512, 0.15, 3) -> (568, 114) and (128, 0.15, 3) -> (141, 29).

    Four deliberate differences from T5's helper, all making the lengths equal what the mask
    really produces: counts are clamped as the mask clamps them (>= 1 noise token and span),
    products are rounded in float32 as the mask computes them (T5's helper uses float64 and
    disagrees with its own mask at ties such as 95 * 0.3), at density 0.5 the targets length is
    recomputed for the shortened raw length instead of decremented, and the targets length
    counts the spans the mask makes (`span_counts`: fewer where spans outnumber the clean
    tokens and merge) while the raw length is chosen by T5's count of one sentinel per drawn
    span, as T5 chooses it.
    """
    t5_lengths_of_raw = functools.partial(_span_corruption_lengths, noise_density=noise_density,
                                          mean_span=mean_noise_span_length, as_t5_helper=True)
    raw = _largest_raw_length(inputs_length, t5_lengths_of_raw)
    inputs, targets = t5_lengths_of_raw(raw)
    if noise_density == 0.5 and targets > inputs:
        raw -= 1
    return raw, _span_corruption_lengths(raw, noise_density, mean_noise_span_length)[1]


def lengths_for(objective: str, inputs_length: int, noise_density: float,
                mean_noise_span_length: float,
                denoisers: Iterable[Iterable[Any]] = UL2_DENOISERS) -> tuple[int, int, int]:
    """`objective_lengths` of the objective config these settings make (with the other
    fields' defaults). `denoisers`: the ul2 mixture, read by ul2 only."""
    return objective_lengths(_point(objective, inputs_length, noise_density,
                                    mean_noise_span_length, denoisers))


def objective_lengths(point: Mapping[str, Any]) -> tuple[int, int, int]:
    """(raw, inputs, targets): the raw tokens an objective config `point` (`config.objective`,
    a grid point's objective) consumes and the longest inputs and targets (incl. EOS) it
    produces from them: its record's `lengths` (the functions below for the built-in
    objectives; `objective_registry.whole_text_lengths` by default: bert_style, mass_style,
    deshuffling, prefix_lm, token_masking, document_rotation, sentence_permutation,
    blank_infilling, whose inputs and targets are each at most the raw tokens + EOS)."""
    return objective_registry.get(point["name"]).lengths(point)


def _point(objective: str, inputs_length: int, noise_density: float,
           mean_noise_span_length: float, denoisers: Iterable[Iterable[Any]]) -> dict[str, Any]:
    """The objective config these settings make, its other fields at their defaults."""
    defaults = default_config().objective.to_dict()
    return dict(defaults, name=objective, inputs_length=inputs_length,
                noise_density=noise_density, mean_noise_span_length=mean_noise_span_length,
                ul2_denoisers=denoisers)


def span_corruption_lengths(point: Mapping[str, Any]) -> tuple[int, int, int]:
    """span_corruption: raw = `raw_length_for`; inputs = non-noise + spans + 1, targets =
    noise + spans + 1."""
    density, span = point["noise_density"], point["mean_noise_span_length"]
    raw, _ = raw_length_for(point["inputs_length"], density, span)
    return (raw, *_span_corruption_lengths(raw, density, span))


def span_corruption_effective_settings(point: Mapping[str, Any]) -> dict[str, int]:
    """span_corruption's rate and span length as its mask sees them: the whole numbers of noise
    tokens and spans (`span_counts`) in a chunk of its raw length. Every pre-training chunk is
    that long (`PretrainData` cuts an unpadded stream), so points with equal counts corrupt
    every chunk alike; at 32 inputs, spans 2 and 3 both make 5 noise tokens in 2 spans of a
    34-token chunk."""
    raw = span_corruption_lengths(point)[0]
    noise, spans = span_counts(raw, point["noise_density"], point["mean_noise_span_length"])
    return {"raw_length": raw, "noise_tokens": noise, "noise_spans": spans}


def iid_corruption_lengths(point: Mapping[str, Any]) -> tuple[int, int, int]:
    """iid_denoising, drop_corrupted_tokens (`noise_lengths.iid_lengths`): raw = inputs_length
    - 1, as T5 cuts them; inputs = inputs_length; targets (random) the smallest that an
    example exceeds with probability <= noise_lengths.OVERFLOW_PROBABILITY
    (mean_noise_span_length is ignored)."""
    lengths = noise_lengths.iid_lengths(point["name"], point["inputs_length"],
                                        point["noise_density"])
    return lengths.raw_length, lengths.inputs_length, lengths.targets_length


def infilling_lengths(point: Mapping[str, Any]) -> tuple[int, int, int]:
    """text_infilling, text_infilling_permutation: raw = `bart_noising.infilling_raw_length`
    (<= inputs_length - 1: the largest whose inputs overflow with probability <=
    noise_lengths.OVERFLOW_PROBABILITY), inputs = inputs_length, targets = raw + EOS."""
    raw = bart_noising.infilling_raw_length(point["inputs_length"],
                                            float(point["noise_density"]),
                                            float(point["mean_noise_span_length"]))
    return raw, point["inputs_length"], raw + 1


def token_deletion_lengths(point: Mapping[str, Any]) -> tuple[int, int, int]:
    """token_deletion: raw = inputs_length - 1, targets = raw + EOS, inputs = the longest
    n - ceil(n * noise_density) + EOS (`bart_noising.token_deletion_inputs_length`)."""
    raw = point["inputs_length"] - 1
    return (raw, bart_noising.token_deletion_inputs_length(raw, point["noise_density"]),
            raw + 1)


def lm_lengths(point: Mapping[str, Any]) -> tuple[int, int, int]:
    """lm: raw = inputs_length - 1, no inputs, targets = raw + EOS."""
    raw = point["inputs_length"] - 1
    return raw, 0, raw + 1


def ul2_lengths(point: Mapping[str, Any]) -> tuple[int, int, int]:
    """ul2: the maximum over its denoisers (the point's (kind, rate, mean span, share)
    tuples) of `ul2_denoiser_lengths`."""
    lengths = [ul2_denoiser_lengths(d, point["inputs_length"]) for d in _point_denoisers(point)]
    return tuple(max(column) for column in zip(*lengths))


def expected_loss_tokens(objective: str, inputs_length: int, noise_density: float,
                         mean_noise_span_length: float,
                         denoisers: Iterable[Iterable[Any]] = UL2_DENOISERS,
                         family: str = "encoder_decoder") -> float:
    """`objective_loss_tokens` of the objective config these settings make (`lengths_for`)."""
    return objective_loss_tokens(_point(objective, inputs_length, noise_density,
                                        mean_noise_span_length, denoisers), family)


def objective_loss_tokens(point: Mapping[str, Any], family: str = "encoder_decoder") -> float:
    """The expected number of target tokens with a loss weight in one `family` example of the
    objective config `point` that fills its raw length R (`objective_lengths`; a shorter
    document has fewer).

    The encoder-decoder and decoder-only families weight the targets' non-padding positions
    (EOS and sentinels included, `batch_format`): the record's `expected_loss_tokens` (the
    functions below; R + 1 by default, every token being a target: bert_style, mass_style,
    deshuffling, lm and BART's token_masking, token_deletion, text_infilling,
    document_rotation, sentence_permutation, text_infilling_permutation). A family that
    predicts in place (`encoder_only`) weights only the noise positions: noise_density x R,
    the in-place objectives' (bert_style's, mass_style's) i.i.d. noise.
    The rare examples of the i.i.d. objectives and text infilling that overflow the layout
    (share <= `noise_lengths.OVERFLOW_PROBABILITY`) get no loss weights; that is left out.
    """
    record = objective_registry.get(point["name"])
    raw, _, targets = record.lengths(point)
    if batch_format.in_place(family):
        return point["noise_density"] * raw
    return record.expected_loss_tokens(point, raw, targets)


def span_corruption_loss_tokens(point: Mapping[str, Any], raw: int, targets: int) -> float:
    """span_corruption: noise + spans + 1, its targets length (exact: `span_counts`)."""
    return float(targets)


def iid_denoising_loss_tokens(point: Mapping[str, Any], raw: int, targets: int) -> float:
    """iid_denoising: R p noise tokens, E[runs] = p + (R - 1) p (1 - p) sentinels leading them,
    the final sentinel and EOS."""
    p = float(point["noise_density"])
    return raw * p + p + (raw - 1) * p * (1 - p) + 2


def drop_corrupted_loss_tokens(point: Mapping[str, Any], raw: int, targets: int) -> float:
    """drop_corrupted_tokens: R p + 1."""
    return raw * float(point["noise_density"]) + 1


def prefix_lm_loss_tokens(point: Mapping[str, Any], raw: int, targets: int) -> float:
    """prefix_lm: the split is uniform over [1, R - 1] (`random_prefix_split`), so R / 2 + 1."""
    return (raw / 2 if raw >= 2 else max(raw - 1, 0)) + 1


def blank_infilling_loss_tokens(point: Mapping[str, Any], raw: int, targets: int) -> float:
    """blank_infilling: its spans' tokens and one [END] each, `glm.expected_targets`."""
    return glm.expected_targets(raw, point["noise_density"], point["mean_noise_span_length"])


def ul2_loss_tokens(point: Mapping[str, Any], raw: int, targets: int) -> float:
    """ul2: the share-weighted mean over its denoisers: span corruption's targets for R and X,
    and (m + 1) / 2 + 1 for S (its target length is uniform over [1, m], `ul2.s_split`:
    m = n - `ul2.s_fewest_inputs`)."""
    return sum(float(share) * _denoiser_loss_tokens(kind, point["inputs_length"], density, span)
               for kind, density, span, share in _point_denoisers(point))


# ---------------------------------------------------------------------------------------------
# UL2's denoisers (host): each one's lengths, sentinels and loss tokens (`t5x_lite.ul2`)
# ---------------------------------------------------------------------------------------------


def ul2_denoiser_lengths(denoiser: Iterable[Any], inputs_length: int) -> tuple[int, int, int]:
    """(raw, inputs, targets) of one ul2 denoiser (kind, noise_density, mean span, share) at
    inputs_length, inputs counting its mode token and EOS.

    R, X: span_corruption's `lengths_for` at inputs_length - 1, plus the mode token. S: raw =
    inputs_length - 1 (the target keeps >= 1 of n >= 2 tokens, so prefix + EOS + mode token
    <= raw + 1), targets = raw - k_min + EOS, k_min = `ul2.s_fewest_inputs(r, raw)` >= 1.
    """
    kind, density, span = tuple(denoiser)[:3]
    if inputs_length - 1 < MIN_INPUTS_LENGTH:
        raise ConfigError(f"objective.inputs_length={inputs_length} is too small for "
                          f"objective.name='ul2': it must be >= {MIN_INPUTS_LENGTH + 1} (the "
                          "mode token and a denoiser's inputs)")
    if kind == "S":
        raw = inputs_length - 1
        return raw, inputs_length, raw - int(ul2.s_fewest_inputs(density, raw, np)) + 1
    raw, inputs, targets = span_corruption_lengths(dict(
        inputs_length=inputs_length - 1, noise_density=density, mean_noise_span_length=span))
    return raw, inputs + 1, targets


def _point_denoisers(point: Mapping[str, Any]) -> Any:
    """A point's ul2 mixture as configured (a grid point's dict may leave it out)."""
    return point.get("ul2_denoisers", UL2_DENOISERS)


def _denoisers_of(point: Mapping[str, Any]) -> tuple[ul2.Denoiser, ...]:
    """A validated ul2 point's denoisers, each with its raw length."""
    return tuple(
        ul2.Denoiser(kind, float(density), float(span), float(share),
                     ul2_denoiser_lengths((kind, density, span), point["inputs_length"])[0])
        for kind, density, span, share in _point_denoisers(point))


def _ul2_sentinels(denoiser: ul2.Denoiser) -> int:
    """The sentinel ids a denoiser needs: its spans' (R, X), and the mode tokens after them."""
    spans = 0 if denoiser.kind == "S" else span_counts(
        denoiser.raw_length, denoiser.noise_density, denoiser.mean_noise_span_length)[1]
    return spans + len(batch_format.MODE_TOKENS)


def _denoiser_loss_tokens(kind: str, inputs_length: int, density: float, span: float) -> float:
    """One denoiser's expected target tokens with a loss weight (`expected_loss_tokens`)."""
    raw, _, targets = ul2_denoiser_lengths((kind, density, span), inputs_length)
    if kind != "S":
        return float(targets)
    # The target length is uniform over [1, targets - 1] (n = raw >= 2), then EOS.
    return targets / 2 + 1 if raw >= 2 else 1.0


# ---------------------------------------------------------------------------------------------
# Validation and construction from the config (host)
# ---------------------------------------------------------------------------------------------


def _describe(point: Mapping[str, Any]) -> str:
    """The settings that decide a point's lengths, for error messages: inputs_length and the
    rate and span length where its objective reads them (ul2's denoisers carry their own)."""
    reads = objective_registry.get(point["name"]).reads
    settings = [f"{field}={point[field]}"
                for field in ("noise_density", "mean_noise_span_length") if field in reads]
    return ", ".join([f"objective.name={point['name']!r} with inputs_length="
                      f"{point['inputs_length']}", *settings])


def _validated_lengths(point: Mapping[str, Any]) -> tuple[int, int, int]:
    """Check one objective config (a ConfigDict or dict: `settings.check_objective`) and
    return its `lengths_for`."""
    check_objective(point)
    lengths = objective_registry.get(point["name"]).lengths(point)
    if lengths[0] < 1:  # only text infilling's raw length shrinks with its overflow risk
        raise ConfigError(f"objective.inputs_length={point['inputs_length']} is too small for "
                          f"{_describe(point)}: even a one-token document's inputs would "
                          f"overflow it with probability > {noise_lengths.OVERFLOW_PROBABILITY}")
    return lengths


def _require_targets_length(point: Mapping[str, Any], lengths: tuple[int, int, int]) -> None:
    """A point's targets_length (None, or what its targets are padded to) holds its targets."""
    targets_length = point.get("targets_length")
    if targets_length is not None:
        require_number("objective.targets_length", targets_length,
                       lambda v: isinstance(v, int) and v >= lengths[2],
                       f"None or an integer >= {lengths[2]}, the targets length of "
                       f"{_describe(point)}")


def span_corruption_sentinels(point: Mapping[str, Any], raw_length: int) -> tuple[int, str]:
    """span_corruption's sentinels (`Objective.sentinels_needed`): one per noise span."""
    num_spans = span_counts(raw_length, point["noise_density"],
                            point["mean_noise_span_length"])[1]
    return num_spans, f"it makes up to {num_spans} spans"


def iid_denoising_sentinels(point: Mapping[str, Any], raw_length: int) -> tuple[int, str]:
    """iid_denoising's sentinels: one per run of noise, and the final one, enough for all but
    a share <= noise_lengths.OVERFLOW_PROBABILITY of its examples."""
    needed = noise_lengths.iid_lengths(point["name"], point["inputs_length"],
                                       point["noise_density"]).num_sentinels
    return needed, (f"it uses one per run of noise and a final one, and {needed} cover all "
                    f"but a share <= {noise_lengths.OVERFLOW_PROBABILITY} of its examples")


def ul2_sentinels(point: Mapping[str, Any], raw_length: int) -> tuple[int, str]:
    """ul2's sentinels: its denoisers' spans, and the mode tokens (the last sentinels)."""
    needed = max(_ul2_sentinels(d) for d in _denoisers_of(point))
    return needed, (f"its denoisers make up to {needed - len(batch_format.MODE_TOKENS)} "
                    f"spans and its {len(batch_format.MODE_TOKENS)} mode tokens are the "
                    "last sentinels")


def blank_infilling_sentinels(point: Mapping[str, Any], raw_length: int) -> tuple[int, str]:
    """blank_infilling's sentinels: its [MASK] and its [END] (`glm.end_token`)."""
    return 2, "its [MASK] is <extra_id_0> and its [END] <extra_id_1>"


def validate_vocab(vocab_size: int, num_sentinels: int) -> None:
    """Raise `ConfigError` if the vocabulary lacks the mask token or room for real tokens."""
    if num_sentinels < 1:
        raise ConfigError(
            f"model.num_sentinels={num_sentinels} is too small: the objectives need at least 1 "
            "(<extra_id_0> is the mask token and the first sentinel)")
    require_vocab_room(vocab_size, num_sentinels)


def spec_from_config(objective_cfg: Mapping[str, Any]) -> ObjectiveSpec:
    """Validate an objective config (`config.objective` or a dict) and build its spec.

    Raises `ConfigError` naming the field for an unknown name, noise_density outside (0, 1),
    mean_noise_span_length < 1, random_token_fraction outside [0, 1] or inputs_length < 3.
    targets_length, which pads the targets of a layout, is checked by `layout_for`, which
    knows the family (one predicting in place has no target positions to pad).
    """
    raw, _, _ = _validated_lengths(objective_cfg)
    return ObjectiveSpec(
        objective=jnp.asarray(objective_registry.objective_id(objective_cfg["name"]), jnp.int32),
        noise_density=jnp.asarray(objective_cfg["noise_density"], jnp.float32),
        mean_noise_span_length=jnp.asarray(objective_cfg["mean_noise_span_length"], jnp.float32),
        random_token_fraction=jnp.asarray(objective_cfg.get("random_token_fraction", 0.1),
                                          jnp.float32),
        raw_length=jnp.asarray(raw, jnp.int32),
    )


def layout_for(points: Iterable[Mapping[str, Any]], family: str, vocab_size: int,
               num_sentinels: int) -> BatchLayout:
    """The one layout serving every objective config in `points`: the maximum raw, inputs and
    targets lengths over them (a point's targets_length, when set, pads its targets to it).
    A family that predicts in place (`batch_format.in_place`: `encoder_only`) gets
    targets_length 0, its targets sitting at the inputs' positions, and ignores the points'
    targets_length.

    Validates every point, the family and the vocabulary, including that the vocabulary has a
    sentinel for every span a span_corruption point makes, and for the runs of noise and the
    final sentinel of an iid_denoising point (but for a share of examples of at most
    `noise_lengths.OVERFLOW_PROBABILITY`, which `corrupt_with_details` counts as overflow).
    """
    require_choice("family", family, batch_format.FAMILIES)
    validate_vocab(vocab_size, num_sentinels)
    points = list(points)
    if not points:
        raise ConfigError("points is empty: give at least one objective config")
    raw = inputs = targets = 0
    denoisers = {_denoisers_of(point) for point in points if point["name"] == "ul2"}
    if len(denoisers) > 1:
        raise ConfigError("objective.ul2_denoisers and objective.inputs_length must be the same "
                          "for every ul2 point of a grid: its layout holds one mixture")
    for point in points:
        point_raw, point_inputs, point_targets = _validated_lengths(point)
        if not batch_format.in_place(family):
            _require_targets_length(point, (point_raw, point_inputs, point_targets))
        raw, inputs = max(raw, point_raw), max(inputs, point_inputs)
        targets = max(targets, point_targets, point.get("targets_length") or 0)
        needed, why = objective_registry.get(point["name"]).sentinels_needed(point, point_raw)
        if needed > num_sentinels:
            raise ConfigError(f"model.num_sentinels={num_sentinels} is too small for "
                              f"{_describe(point)}: {why}, so it needs at least {needed} "
                              "sentinels")
    # The lm objective has no inputs, but still feeds an encoder one EOS (`_lm`).
    inputs = max(inputs, batch_format.min_inputs_length(family))
    if batch_format.in_place(family):  # the targets sit at the inputs' own positions
        targets = 0
    names = {point["name"] for point in points}
    return BatchLayout(family, raw, inputs, targets, vocab_size, num_sentinels,
                       tuple(name for name in objective_registry.names() if name in names),
                       next(iter(denoisers), ()))


def layout_from_config(config: Mapping[str, Any]) -> BatchLayout:
    """The layout of a single-point run: `config.objective` for `config.model`'s family
    (which must be able to train on it: `Architecture.require_objective`)."""
    model = config["model"]
    architecture = architectures.get(model["arch"])
    architecture.require_objective(config["objective"]["name"])
    return layout_for([config["objective"]], architecture.family,
                      model["vocab_size"], model["num_sentinels"])


def layout_record(layout: BatchLayout, objective_cfg: Mapping[str, Any], arch: str
                  ) -> dict[str, Any]:
    """What the examples of a pre-training run with `layout` and `objective_cfg` read, as JSON
    data: the raw tokens each is cut from (the layout's: a grid's longest), its objective's own
    (raw, inputs, targets) (`objective_lengths`), the layout's ul2 denoisers with the raw
    tokens each reads, and the revision of its objective's definition
    (`objective_registry.Objective.revision`); and the definition of the architecture `arch`
    that reads them (`architectures.Architecture.definition`). The config fixes these only
    together with the code and the grid's other rows, so they are saved with the checkpoints
    (`saved_config.BATCH_LAYOUT_FILE`): a resume after either changed them is refused instead
    of continuing on other examples or another network."""
    return {"raw_length": layout.raw_length,
            "objective_lengths": list(objective_lengths(objective_cfg)),
            "denoisers": [list(denoiser) for denoiser in layout.denoisers],
            objective_registry.REVISION_FIELD:
                objective_registry.get(objective_cfg["name"]).revision,
            architectures.DEFINITION_FIELD: architectures.get(arch).definition}
