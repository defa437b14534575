"""The architectures `config.model.arch` names: one record each, and the registry of them.

An `Architecture` holds every fact about an architecture that the rest of the library reads,
so that each is written once, here:
- `family`: the batch format it consumes (`t5x_lite.batch_format`): `encoder_decoder` rows
  (inputs to the encoder, targets to the decoder), `decoder_only` rows (inputs then targets
  as one sequence) or `encoder_only` rows (one sequence, its targets predicted in place);
- `stacks`: the transformer stacks `t5x_lite.models` builds, in the order their parameters
  are drawn: each one's depth as a share of `model.num_layers` (a decoder of its own:
  `model.num_decoder_layers` when set), whether it cross-attends to the encoder, and whose
  layers it reuses;
- `prefix_attention`: whether a decoder-only row's inputs (its `inputs_mask`) are attended
  bidirectionally, rather than causally like the targets;
- `program`: the architecture whose network and compiled train step it runs. An architecture
  with the same parameters as another, differing only in prefix attention, runs the other's
  program, the step switching prefix attention off with a traced flag (`t5x_lite.train_step`;
  with it the relative-position buckets of a stack whose rule follows prefix attention,
  `models.make_masks`);
- `params_label`, `cost_label`: the paper's Params and Cost columns of Table 2 (P: the
  parameters of one L-layer stack; M: what the L + L encoder-decoder costs on an input-target
  pair; `t5x_lite.accounting` measures the ratios behind them);
- `objectives` (derived from the family and prefix attention, so that a newly registered
  architecture gets the same rule as the built-in ones, and from each objective's record, so
  that a newly registered objective does): the pre-training objectives
  (`t5x_lite.objective_registry`) it can train on; `require_objective` checks a config
  against them.

The five architectures of the paper's Table 2 are registered below, in its row order, then
`encoder_only`, the BERT-style family the paper's section 3.2 starts from (not a Table 2 row).
`get(name)` raises a one-line `ConfigError` naming `model.arch` and the registered names.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from t5x_lite import batch_format, objective_registry
from t5x_lite.errors import OWN_RECORD_HINT, ConfigError, require_choice

# The stacks a model can have: the model attribute each is built as, and the prefix of the
# batch keys it reads (encoder_input_tokens; decoder_input_tokens, decoder_target_tokens, ...).
ROLES = ("encoder", "decoder")


@dataclasses.dataclass(frozen=True)
class Stack:
    """One stack of transformer layers (`models.TransformerStack`)."""

    role: str  # one of ROLES
    # Relative-position buckets that tell earlier from later keys (True), or keys after the
    # query all in one (False); None: as the architecture's prefix attention (Mesh
    # TensorFlow's rule, bidirectional = not fully autoregressive: a prefix LM's decoder reads
    # both directions, a language model's only the past; `Architecture.bidirectional_positions`).
    # What a position may see is the mask's business, not this.
    bidirectional: bool | None
    # The stack has depth // depth_divisor layers, depth being model.num_layers, or for the
    # decoder of a model with both stacks model.num_decoder_layers when that is set.
    depth_divisor: int = 1
    cross_attention: bool = False  # its layers also attend to the encoder's output
    # The role of an earlier stack whose self-attention and MLP parameters its layers reuse.
    shares_layers_of: str | None = None

    def depth_field(self, num_decoder_layers: int | None) -> str:
        """The model field that sets this stack's depth: `num_decoder_layers` for a
        cross-attending decoder when it is set (not None), else `num_layers`."""
        own = self.cross_attention and num_decoder_layers is not None
        return "num_decoder_layers" if own else "num_layers"

    def num_layers(self, model: Any) -> int:
        """The stack's depth for the model settings `model` (a `settings.Model` or a
        `config.model` section: anything with `num_layers` and `num_decoder_layers`)."""
        return getattr(model, self.depth_field(model.num_decoder_layers)) // self.depth_divisor


@dataclasses.dataclass(frozen=True)
class Architecture:
    """What `model.arch` names; see the module docstring for each field."""

    name: str
    family: str  # one of batch_format.FAMILIES
    stacks: tuple[Stack, ...]
    params_label: str  # Table 2's Params: "P" or "2P"
    cost_label: str  # Table 2's Cost: "M" or "M/2"
    prefix_attention: bool = False
    shares_program_of: str | None = None  # None: its own

    @property
    def definition(self) -> str:
        """Its network and masks in one line: family, stacks, prefix attention and the program
        it shares, if any (not its name or its Table 2 labels). Saved with a pre-training's
        checkpoints (`objective_layout.layout_record`) and in a sweep's records
        (`DEFINITION_FIELD`), which name a record only by `model.arch`: work made under
        another definition of that name (a researcher's record edited in its file) is refused,
        not resumed (whose restore failed as "unreadable" checkpoints) or counted as done."""
        stacks = "; ".join(
            f"{s.role} (depth 1/{s.depth_divisor}, bidirectional={s.bidirectional}, "
            f"cross_attention={s.cross_attention}, shares_layers_of={s.shares_layers_of})"
            for s in self.stacks)
        shared = (f"; runs the program of {self.shares_program_of}" if self.shares_program_of
                  else "")  # not its own name: the same network under two names is one
        return f"{self.family}: {stacks}; prefix_attention={self.prefix_attention}{shared}"

    def bidirectional_positions(self, stack: Stack, prefix_attention: Any = None) -> Any:
        """Whether `stack` of this architecture reads relative positions with bidirectional
        buckets: its own rule, or where it has none (None), prefix attention: the
        architecture's, or `prefix_attention` when given (a traced flag, `models.make_masks`)."""
        if stack.bidirectional is not None:
            return stack.bidirectional
        return self.prefix_attention if prefix_attention is None else prefix_attention

    @property
    def objectives(self) -> tuple[str, ...]:
        """The pre-training objectives it can train on, in registry order: a family that
        predicts in place only those whose targets are the inputs' own tokens at the corrupted
        positions (`Objective.in_place`: BERT's and MASS's); a decoder-only family with prefix
        attention every one; the others every one but those that need a decoder-only row
        whose inputs are attended bidirectionally (`Objective.needs_prefix_attention`: GLM's
        blank infilling, whose Part A is, and whose explicit positions only the decoder-only
        row carries)."""
        records = [objective_registry.get(name) for name in objective_registry.names()]
        if batch_format.in_place(self.family):
            return tuple(record.name for record in records if record.in_place)
        prefix = self.family == "decoder_only" and self.prefix_attention
        return tuple(record.name for record in records
                     if prefix or not record.needs_prefix_attention)

    @property
    def program(self) -> str:
        """The name of the architecture whose network and compiled step this one runs."""
        return self.shares_program_of or self.name

    def stack(self, role: str) -> Stack | None:
        """The stack with `role`, or None if the architecture has none."""
        return next((stack for stack in self.stacks if stack.role == role), None)

    def require_objective(self, objective: str) -> None:
        """Raise a one-line `ConfigError` unless the architecture can pre-train on
        `objective.name=objective`; for one that needs prefix attention, which few
        architectures train, it names those too."""
        if objective not in self.objectives:
            trains_it = names(objective=objective)
            others = (f", or a model.arch that trains it: {', '.join(map(repr, trains_it))}"
                      if objective_registry.get(objective).needs_prefix_attention else "")
            raise ConfigError(
                f"objective.name={objective!r} is not allowed for model.arch={self.name!r}; "
                f"choose one of {', '.join(map(repr, self.objectives))}{others}")

    def require_num_layers(self, num_layers: int, num_decoder_layers: int | None = None) -> None:
        """Raise `ConfigError` unless every stack's share of its depth field is whole, and
        `model.num_decoder_layers` is None or sets the depth of a decoder of its own."""
        decoder = self.stack("decoder")
        if num_decoder_layers is not None and (
                decoder is None or not decoder.cross_attention
                or decoder.shares_layers_of is not None):
            raise ConfigError(
                f"model.num_decoder_layers={num_decoder_layers} must be None for model.arch="
                f"{self.name!r}: only an encoder-decoder whose decoder has layers of its own "
                "(encoder_decoder, encoder_decoder_half) can be deeper or shallower")
        depths = {"num_layers": num_layers, "num_decoder_layers": num_decoder_layers}
        for stack in self.stacks:
            field = stack.depth_field(num_decoder_layers)
            if depths[field] % stack.depth_divisor:
                raise ConfigError(
                    f"model.{field}={depths[field]} must be a multiple of {stack.depth_divisor} "
                    f"for model.arch={self.name!r} (its {stack.role} has {field}/"
                    f"{stack.depth_divisor} layers)")


_REGISTRY: dict[str, Architecture] = {}
# The field of a sweep record and of a pre-training's batch layout file holding the
# `Architecture.definition` of the architecture that made it (absent: made before 2026-12-06).
DEFINITION_FIELD = "architecture_definition"


def _check_family(architecture: Architecture) -> None:
    """The family is one of `batch_format.FAMILIES` and the stacks are those its rows feed,
    in that order (`batch_format.row_lengths`), a decoder beside an encoder attending to it:
    else a record registers and its first step fails in a shape error or a KeyError."""
    where = f"architecture {architecture.name!r}"
    if architecture.family not in batch_format.FAMILIES:
        raise ValueError(f"{where}: family={architecture.family!r} must be one of "
                         f"{', '.join(batch_format.FAMILIES)}")
    fed = tuple(batch_format.row_lengths(architecture.family, 1, 1))
    roles = tuple(stack.role for stack in architecture.stacks)
    if roles != fed:
        raise ValueError(f"{where}: rows of family {architecture.family!r} feed the stacks "
                         f"{', '.join(fed)} (in that order), and it has "
                         f"{', '.join(roles) or 'none'}")
    if len(fed) > 1 and not architecture.stacks[-1].cross_attention:
        raise ValueError(f"{where}: its decoder must cross-attend to its encoder "
                         "(cross_attention=True), or nothing reads the encoder's output")


def _check_stacks(architecture: Architecture) -> None:
    earlier: dict[str, Stack] = {}
    for stack in architecture.stacks:
        where = f"architecture {architecture.name!r}, {stack.role} stack"
        if stack.role not in ROLES or stack.role in earlier:
            raise ValueError(f"{where}: the role must be one of {', '.join(ROLES)}, once each")
        if stack.depth_divisor < 1:
            raise ValueError(f"{where}: depth_divisor={stack.depth_divisor} must be >= 1")
        if stack.cross_attention and "encoder" not in earlier:
            raise ValueError(f"{where}: cross_attention needs an encoder stack before it")
        shared = earlier.get(stack.shares_layers_of)
        if stack.shares_layers_of is not None and (
                shared is None or shared.depth_divisor != stack.depth_divisor):
            raise ValueError(f"{where}: shares_layers_of={stack.shares_layers_of!r} must name an "
                             "earlier stack of the same depth")
        earlier[stack.role] = stack


def _check_shared_program(architecture: Architecture, program: Architecture) -> None:
    """`architecture` can run `program`'s network and step: the same parameters, and prefix
    attention that the step's traced flag can switch off (it can never switch it on)."""
    if (architecture.family, architecture.stacks) != (program.family, program.stacks) or (
            architecture.prefix_attention and not program.prefix_attention):
        raise ValueError(f"architecture {architecture.name!r} cannot share the program of "
                         f"{program.name!r}: it needs the same family and stacks, and prefix "
                         "attention wherever it has it")


def register(architecture: Architecture) -> Architecture:
    """Add `architecture` to the registry (checking its stacks and the program it shares, as
    far as that is registered) and return it. The same record again is the registered one (a
    notebook or script that loads a researcher's file twice); another record of a registered
    name is refused: a record changes in a new process (a notebook: restart its kernel), where
    the runs made with the earlier one are refused (`Architecture.definition`)."""
    if _REGISTRY.get(architecture.name) == architecture:
        return _REGISTRY[architecture.name]
    if architecture.name in _REGISTRY:
        raise ValueError(f"architecture {architecture.name!r} is already registered, as another "
                         "record; a record changes in a new Python process (a notebook: restart "
                         "its kernel)")
    _check_stacks(architecture)
    _check_family(architecture)
    if architecture.shares_program_of in _REGISTRY:
        _check_shared_program(architecture, _REGISTRY[architecture.shares_program_of])
    for other in _REGISTRY.values():
        if other.shares_program_of == architecture.name:
            _check_shared_program(other, architecture)
    _REGISTRY[architecture.name] = architecture
    return architecture


def get(name: str) -> Architecture:
    """The architecture `model.arch=name`; a `ConfigError` listing the registered names if
    there is none."""
    require_choice("model.arch", name, _REGISTRY, OWN_RECORD_HINT)
    architecture = _REGISTRY[name]
    if architecture.program not in _REGISTRY:  # its record may register before the one it names
        raise ConfigError(f"architecture {name!r}: shares_program_of="
                          f"{architecture.shares_program_of!r} is not a registered architecture; "
                          f"registered: {', '.join(_REGISTRY)}")
    return architecture


def names(*, family: str | None = None, program: str | None = None,
          objective: str | None = None) -> tuple[str, ...]:
    """The registered names in registration order; only those of `family`, of those that run
    `program`, or of those that can train on `objective`, when given."""
    return tuple(name for name, architecture in _REGISTRY.items()
                 if family in (None, architecture.family)
                 and program in (None, architecture.program)
                 and (objective is None or objective in architecture.objectives))


# ---------------------------------------------------------------------------------------------
# The T5 paper's Table 2 (Raffel et al. 2020, section 3.2)

_ENCODER = Stack("encoder", bidirectional=True)
_DECODER = Stack("decoder", bidirectional=False, cross_attention=True)
# A decoder-only stack's buckets follow prefix attention, as in Mesh TensorFlow: causal for
# language_model, bidirectional for prefix_lm (which share parameters and program: the step's
# traced prefix flag switches both the mask and the bucket rule, `models.make_masks`).
_DECODER_ONLY = (Stack("decoder", bidirectional=None),)

register(Architecture("encoder_decoder", "encoder_decoder", (_ENCODER, _DECODER), "2P", "M"))
register(Architecture(
    "encoder_decoder_shared", "encoder_decoder",
    (_ENCODER, dataclasses.replace(_DECODER, shares_layers_of="encoder")), "P", "M"))
register(Architecture(
    "encoder_decoder_half", "encoder_decoder",
    tuple(dataclasses.replace(stack, depth_divisor=2) for stack in (_ENCODER, _DECODER)),
    "P", "M/2"))
register(Architecture("language_model", "decoder_only", _DECODER_ONLY, "P", "M",
                      shares_program_of="prefix_lm"))
register(Architecture("prefix_lm", "decoder_only", _DECODER_ONLY, "P", "M",
                      prefix_attention=True))

# ---------------------------------------------------------------------------------------------
# BERT-style (Devlin et al. 2018; the paper's section 3.2.1): one bidirectional stack whose
# output predicts, at positions of its own input, the corrupted tokens (pre-training) or a
# task's target tokens at mask slots (fine-tuning). Its Params are one L-layer stack's (P);
# its Cost, pre-training on an input-target pair whose targets sit at the inputs' own
# positions, is one L-layer stack over the inputs alone: about half the decoder-only models'
# over inputs + targets (M/2). Only the objectives that predict in place
# (`Objective.in_place`) can train it.
register(Architecture("encoder_only", "encoder_only", (_ENCODER,), "P", "M/2"))
