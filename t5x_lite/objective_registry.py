"""The pre-training objectives `objective.name` names: one record each, and the registry of them.

An `Objective` holds every fact about an objective that the rest of the library reads, so that
each is written once, in its record:
- `encode`: what it does to one example, on the device (below);
- `has_noise_mask`: whether it corrupts chosen tokens, so that its noise mask means something
  (`t5x-lite preview` shows it; a family that predicts in place takes its loss there);
- `reads`: the objective fields, besides `name` and `inputs_length`, its corruption reads
  (what `preview` and the length errors name);
- `poisson_spans`: its span lengths are Poisson(lambda = mean_noise_span_length) (BART's, GLM's);
- `in_place`: its targets are the inputs' own tokens at the corrupted positions, the only
  kind a family that predicts in place (`encoder_only`) can train on;
- `needs_prefix_attention`: it needs a decoder-only row whose inputs are attended
  bidirectionally (GLM's Part A), so only such architectures train on it;
- `reads_sentences`: it reads sentence ends off the vocabulary (`BatchLayout.with_sentences`);
- `within_document`: each example is one document's segment, as T5 makes its prefix LM and
  deshuffling examples, not a window of the documents' stream (`data.pipeline.PretrainData`);
- `explicit_positions`: its encoder gives a fifth output, the position of each target token
  (`batch_format.POSITIONS_KEY`);
- `uniform_rows`: how many rows of uniform draws per example it reads, given the layout;
- `lengths`, `expected_loss_tokens`, `sentinels_needed`: its host arithmetic (below);
- `effective_settings`: what its corruption makes of the `reads` fields (below);
- `changes`: how its definition changed since it was first registered (below).

`encode(tokens, n, spec, uniform, layout)` corrupts one example: tokens int32[R] (R =
layout.raw_length), of which the first n (a traced int32) are the text; spec the example's
`ObjectiveSpec` (scalars); uniform float32[rows, R], the example's uniform draws (all of its
randomness); layout the static `BatchLayout`. It returns (inputs, targets, noise, sentinels):
inputs and targets int32[`objectives.packed_width(layout)`], the tokens at the front, EOS after
them, then zeros (`objectives.pack_with_eos` makes them); noise bool[R], the raw tokens it
corrupted; sentinels int32[], how many sentinel ids it used (an example needing more than the
layout holds is left out of the loss). Outputs of another type or shape are refused, naming the
objective, when the step is traced. Its `lengths` must bound what it makes: an example longer
than the layout's inputs or targets is cut to them and left out of the loss. It runs inside the
jitted train step, as one branch of a `lax.switch` over the grid's objectives.

`lengths(point)` -> (raw, inputs, targets): the raw tokens it reads and the longest inputs and
targets (EOS included) it makes from them, for an objective config `point` (the run's
`config.objective` or a grid point's, every field of it: `name`, `inputs_length`,
`noise_density`, `mean_noise_span_length`, `random_token_fraction`, ...); the default,
`whole_text_lengths`, reads inputs_length - 1 tokens and makes inputs and targets of at most
all of them + EOS. `expected_loss_tokens(point, raw, targets)`: the expected target tokens with
a loss weight in an example that fills `raw` (default every token + EOS). `sentinels_needed(
point, raw)` -> (count, why): the sentinel ids it may use, and why in words (default none).
`effective_settings(point)` -> {name: value}: the `reads` fields as its corruption sees them
(`Objective.effective`), so that two points whose values differ and whose effective settings
are equal are known to corrupt every pre-training chunk alike (`grid.identical_rows`); None
(the default) means as given. span_corruption's rate and span length reach its mask only as
whole counts of noise tokens and spans at its raw length, which T5's rounding can make equal.

`changes`: one line per change to the objective's definition since it was first registered
('date: what it does now, and did before'), oldest first, for a change that makes it corrupt
the same chunk otherwise under the same config and seed while the config, its hash and the raw
tokens read stay as they were (a change of those is caught by them already). Its `revision` is
1 + their count; a sweep's records and a pre-training's checkpoints (`batch_layout.json`) carry
it, and a sweep refuses to count as finished, or to train on, work made under another revision
(`sweep_workdir`), where it would put two definitions of one objective into one table. Records
from before revisions were recorded (2026-12-05, 70cd6ec) read as revision 1.

The built-in objectives (the T5 paper's, BART's, UL2's, GLM's) are registered by
`t5x_lite.objectives`, in the order of their ids (an objective's id is its position in the
registry, as an `ObjectiveSpec` carries it); `names()` and `get()` import that module, so they
always see them. A researcher's own objective is a record registered from a file of theirs
(README "Adding an architecture or an objective").
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping

from t5x_lite.errors import OWN_RECORD_HINT, require_choice

# The objective fields an objective's corruption may read besides name and inputs_length.
READABLE_FIELDS = ("noise_density", "mean_noise_span_length", "random_token_fraction")
# The field of a sweep's records and a pre-training's batch layout record that holds the
# revision of the objective it trained on (`Objective.revision`).
REVISION_FIELD = "objective_revision"


def whole_text_lengths(point: Mapping[str, Any]) -> tuple[int, int, int]:
    """(raw, inputs, targets) of an objective whose inputs and targets each hold at most the
    whole text + EOS: raw = inputs_length - 1."""
    raw = point["inputs_length"] - 1
    return raw, raw + 1, raw + 1


def every_target_token(point: Mapping[str, Any], raw: int, targets: int) -> float:
    """Expected loss tokens of an objective whose targets are the whole text + EOS."""
    return float(raw + 1)


def no_sentinels(point: Mapping[str, Any], raw: int) -> tuple[int, str]:
    """The sentinel ids of an objective that uses none, or only the mask token (which every
    vocabulary has: `objective_layout.validate_vocab`)."""
    return 0, ""


@dataclasses.dataclass(frozen=True)
class Objective:
    """What `objective.name` names; see the module docstring for each field."""

    name: str
    encode: Callable[..., tuple]
    has_noise_mask: bool
    reads: tuple[str, ...] = ()
    poisson_spans: bool = False
    in_place: bool = False
    needs_prefix_attention: bool = False
    reads_sentences: bool = False
    within_document: bool = False
    explicit_positions: bool = False
    uniform_rows: Callable[[Any], int] = lambda layout: 3
    lengths: Callable[[Mapping[str, Any]], tuple[int, int, int]] = whole_text_lengths
    expected_loss_tokens: Callable[[Mapping[str, Any], int, int], float] = every_target_token
    sentinels_needed: Callable[[Mapping[str, Any], int], tuple[int, str]] = no_sentinels
    effective_settings: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    changes: tuple[str, ...] = ()

    @property
    def revision(self) -> int:
        """Which definition of the objective this is: 1 + its `changes`."""
        return 1 + len(self.changes)

    def effective(self, point: Mapping[str, Any]) -> dict[str, Any]:
        """The fields of objective config `point` that this objective `reads`, as its
        corruption sees them (`effective_settings`, else as given)."""
        if self.effective_settings is not None:
            return dict(self.effective_settings(point))
        return {field: point[field] for field in self.reads}


_REGISTRY: dict[str, Objective] = {}


def register(objective: Objective) -> Objective:
    """Add `objective` to the registry (its id: the next position) and return it."""
    if objective.name in _REGISTRY:  # its encoder is code: no test tells a re-run file's
        # record from a changed one, so a file that registers one runs once per process
        raise ValueError(f"objective {objective.name!r} is already registered; a file that "
                         "registers an objective runs once per Python process (a notebook: "
                         "restart its kernel to load it again)")
    if not objective.name.isidentifier():
        raise ValueError(f"objective name {objective.name!r} must be an identifier: it is "
                         "written in overrides, records and file names")
    unknown = [field for field in objective.reads if field not in READABLE_FIELDS]
    if unknown:
        raise ValueError(f"objective {objective.name!r} reads {unknown}; its reads must be among "
                         f"{', '.join(READABLE_FIELDS)}")
    if objective.in_place and not objective.has_noise_mask:
        raise ValueError(f"objective {objective.name!r} predicts in place but has no noise mask: "
                         "the loss of a family that predicts in place is at the noise mask")
    _REGISTRY[objective.name] = objective
    return objective


def _registered() -> dict[str, Objective]:
    # The built-in objectives register when `t5x_lite.objectives` is imported. It imports the
    # modules that read this registry (settings, architectures), so they cannot import it at
    # their top; importing it here, where the registry is read, makes sure it has run.
    importlib.import_module("t5x_lite.objectives")
    return _REGISTRY


def names() -> tuple[str, ...]:
    """The registered objectives' names in registration order; an objective's id is its
    position here."""
    return tuple(_registered())


def get(name: str) -> Objective:
    """The objective `objective.name=name`; a `ConfigError` listing the registered names if
    there is none."""
    require_choice("objective.name", name, _registered(), OWN_RECORD_HINT)
    return _REGISTRY[name]


def objective_id(name: str) -> int:
    """`name`'s id: its position in the registry (an `ObjectiveSpec`'s `objective`)."""
    get(name)
    return names().index(name)

