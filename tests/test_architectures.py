"""architectures.py: the registry holds Table 2's five architectures and then encoder_only,
refuses records that could not be built or could not share their program, and names
model.arch (and objective.name) in its errors."""
import dataclasses
import types

import pytest

from conftest import readme_python_block
from t5x_lite import accounting, architectures, batch_format, models, objectives
from t5x_lite.architectures import Architecture, Stack
from t5x_lite.config import ConfigError

TABLE_2 = ("encoder_decoder", "encoder_decoder_shared", "encoder_decoder_half",
           "language_model", "prefix_lm")
REGISTERED = TABLE_2 + ("encoder_only",)


def test_the_registry_holds_table_2_in_its_row_order_then_encoder_only():
    assert architectures.names() == REGISTERED
    assert architectures.names(family="encoder_only") == ("encoder_only",)
    assert architectures.names(family="decoder_only") == ("language_model", "prefix_lm")
    assert architectures.names(program="prefix_lm") == ("language_model", "prefix_lm")
    assert architectures.names(program="encoder_decoder") == ("encoder_decoder",)


def test_every_architecture_has_a_batch_format_and_the_network_of_its_stacks():
    expected = {"encoder_decoder": models.EncoderDecoder, "decoder_only": models.OneStack,
                "encoder_only": models.OneStack}
    for name in architectures.names():
        architecture = architectures.get(name)
        assert architecture.family in batch_format.FAMILIES, name
        assert models.network_class(architecture) is expected[architecture.family], name
    two_encoders = dataclasses.replace(architectures.get("encoder_only"),
                                       stacks=(architectures.get("encoder_only").stacks[0],) * 2)
    with pytest.raises(ValueError, match="no network has the stacks"):
        models.network_class(two_encoders)


def test_the_records_say_what_table_2_says():
    half = architectures.get("encoder_decoder_half")
    depths = types.SimpleNamespace(num_layers=12, num_decoder_layers=None)
    assert [stack.num_layers(depths) for stack in half.stacks] == [6, 6]
    depths.num_decoder_layers = 4  # a decoder of its own depth, halved too
    assert [stack.num_layers(depths) for stack in half.stacks] == [6, 2]
    assert (half.params_label, half.cost_label) == ("P", "M/2")
    shared = architectures.get("encoder_decoder_shared").stack("decoder")
    assert (shared.shares_layers_of, shared.cross_attention) == ("encoder", True)
    assert architectures.get("encoder_decoder").stack("encoder").bidirectional
    assert architectures.get("language_model").stack("encoder") is None
    assert architectures.get("language_model").program == "prefix_lm"
    assert [architectures.get(n).prefix_attention for n in TABLE_2] == [False] * 4 + [True]
    encoder_only = architectures.get("encoder_only")
    assert [(s.role, s.bidirectional, s.cross_attention) for s in encoder_only.stacks] == [
        ("encoder", True, False)]
    assert encoder_only.program == "encoder_only" and not encoder_only.prefix_attention


def test_an_objective_the_architecture_cannot_train_on_is_one_line_naming_both():
    with pytest.raises(ConfigError) as error:
        architectures.get("encoder_only").require_objective("span_corruption")
    assert str(error.value) == ("objective.name='span_corruption' is not allowed for "
                                "model.arch='encoder_only'; choose one of 'bert_style', "
                                "'mass_style'")
    architectures.get("encoder_only").require_objective("mass_style")
    architectures.get("encoder_decoder").require_objective("span_corruption")  # any


def test_an_unknown_name_is_one_line_naming_model_arch_and_the_choices():
    with pytest.raises(ConfigError) as error:
        architectures.get("rnn")
    assert str(error.value) == ("model.arch='rnn' is not allowed; choose one of "
                                + ", ".join(REGISTERED) + " (one of your own is registered by "
                                "the file that defines it: pass --config=FILE, or the "
                                "experiment file to sweep and preview)")


def test_a_depth_that_does_not_divide_names_the_field():
    with pytest.raises(ConfigError, match=r"model.num_layers=3 must be a multiple of 2 for "
                                          r"model.arch='encoder_decoder_half'"):
        architectures.get("encoder_decoder_half").require_num_layers(3)
    architectures.get("encoder_decoder_half").require_num_layers(4)
    with pytest.raises(ConfigError, match=r"model.num_decoder_layers=3 must be a multiple of 2"):
        architectures.get("encoder_decoder_half").require_num_layers(4, 3)
    architectures.get("encoder_decoder_half").require_num_layers(4, 2)


@pytest.mark.parametrize("arch", ["encoder_decoder_shared", "language_model", "encoder_only"])
def test_a_decoder_depth_of_its_own_needs_an_unshared_decoder(arch):
    with pytest.raises(ConfigError, match=rf"model.num_decoder_layers=2 must be None for "
                                          rf"model.arch='{arch}'"):
        architectures.get(arch).require_num_layers(4, 2)


_ENCODER = Stack("encoder", bidirectional=True)
_DECODER = Stack("decoder", bidirectional=False, cross_attention=True)


@pytest.mark.parametrize("record, message", [
    (Architecture("prefix_lm", "decoder_only", (Stack("decoder", True),), "P", "M"),
     "'prefix_lm' is already registered"),
    (Architecture("x", "encoder_decoder", (_ENCODER, _ENCODER), "P", "M"), "role must be one of"),
    (Architecture("x", "encoder_decoder", (Stack("middle", True),), "P", "M"),
     "role must be one of encoder, decoder"),
    (Architecture("x", "decoder_only", (_DECODER,), "P", "M"),
     "cross_attention needs an encoder stack before it"),
    (Architecture("x", "encoder_decoder",
                  (_ENCODER, dataclasses.replace(_DECODER, shares_layers_of="decoder")), "P", "M"),
     "shares_layers_of='decoder' must name an earlier stack of the same depth"),
    (Architecture("x", "encoder_decoder",
                  (_ENCODER, dataclasses.replace(_DECODER, shares_layers_of="encoder",
                                                 depth_divisor=2)), "P", "M"),
     "must name an earlier stack of the same depth"),
    (Architecture("x", "encoder_decoder", (dataclasses.replace(_ENCODER, depth_divisor=0),),
                  "P", "M"), "depth_divisor=0 must be >= 1"),
    # Another network than the program's, or prefix attention the program's flag cannot give.
    (Architecture("x", "encoder_decoder", (_ENCODER, _DECODER), "P", "M",
                  shares_program_of="prefix_lm"), "'x' cannot share the program of 'prefix_lm'"),
    (Architecture("x", "decoder_only", (Stack("decoder", True),), "P", "M",
                  prefix_attention=True, shares_program_of="language_model"),
     "'x' cannot share the program of 'language_model'"),
    # Stacks its family's rows do not feed: its first step failed in a shape error or a
    # KeyError, and a misspelt family at run time without the record's name.
    (Architecture("x", "encoder-decoder", (_ENCODER, _DECODER), "P", "M"),
     "^architecture 'x': family='encoder-decoder' must be one of encoder_decoder, "
     "decoder_only, encoder_only$"),
    (Architecture("x", "encoder_decoder", (_ENCODER,), "P", "M"),
     "^architecture 'x': rows of family 'encoder_decoder' feed the stacks encoder, decoder "
     "\\(in that order\\), and it has encoder$"),
    (Architecture("x", "decoder_only", (_ENCODER,), "P", "M"),
     "family 'decoder_only' feed the stacks decoder .* it has encoder$"),
    (Architecture("x", "encoder_only", (Stack("decoder", True),), "P", "M"),
     "family 'encoder_only' feed the stacks encoder .* it has decoder$"),
    (Architecture("x", "encoder_decoder", (_ENCODER, Stack("decoder", False)), "P", "M"),
     "its decoder must cross-attend to its encoder"),
])
def test_register_refuses_a_record_that_cannot_work(record, message):
    with pytest.raises(ValueError, match=message):
        architectures.register(record)
    assert architectures.names() == REGISTERED  # nothing was added


def test_the_same_record_registers_again_as_itself_another_of_its_name_is_refused(monkeypatch):
    """A notebook that loads a researcher's file twice registers its record twice: the same
    record is the registered one; another record of the name is refused (D1's definition
    check refuses the runs of an earlier record once a new process registers another)."""
    monkeypatch.setattr(architectures, "_REGISTRY", dict(architectures._REGISTRY))
    mine = Architecture("mine", "encoder_decoder", (_ENCODER, _DECODER), "P", "M")
    first = architectures.register(mine)
    again = dataclasses.replace(mine)  # an equal record, made anew as a re-run file makes it
    assert architectures.register(again) is first
    with pytest.raises(ValueError, match="^architecture 'mine' is already registered, as another "
                                         "record; .*restart its kernel\\)$"):
        architectures.register(dataclasses.replace(mine, params_label="2P"))
    assert architectures.get("mine") is first


def test_a_misspelt_shared_program_is_named_when_the_architecture_is_read(monkeypatch):
    """`shares_program_of` may name a record registered later (language_model registers
    before prefix_lm), so a misspelt one registers; reading the architecture names the
    field, where a run said `model.arch='prefx_lm' is not allowed` of a config that set
    model.arch='mine'."""
    monkeypatch.setattr(architectures, "_REGISTRY", dict(architectures._REGISTRY))
    architectures.register(Architecture("mine", "decoder_only", (Stack("decoder", None),), "P",
                                         "M", shares_program_of="prefx_lm"))
    with pytest.raises(ConfigError, match=r"^architecture 'mine': shares_program_of='prefx_lm' "
                                          r"is not a registered architecture; registered: "
                                          r"encoder_decoder, .*, mine$"):
        architectures.get("mine")


def test_a_new_record_s_objectives_follow_its_family_and_prefix_attention():
    """A researcher's own record (not registered here) gets the built-in records' rule, not
    every objective: it was a field that defaulted to all, so an encoder-only record trained
    span corruption and an encoder-decoder GLM's blank infilling without a word."""
    in_place = Architecture("mine", "encoder_only", (_ENCODER,), "P", "M")
    with pytest.raises(ConfigError) as error:
        in_place.require_objective("span_corruption")
    assert str(error.value) == ("objective.name='span_corruption' is not allowed for "
                                "model.arch='mine'; choose one of 'bert_style', 'mass_style'")
    in_place.require_objective("bert_style")
    encoder_decoder = Architecture("mine", "encoder_decoder", (_ENCODER, _DECODER), "P", "M")
    causal = Architecture("mine", "decoder_only", (Stack("decoder", True),), "P", "M")
    for record in (encoder_decoder, causal):
        record.require_objective("span_corruption")
        with pytest.raises(ConfigError, match=r"'blank_infilling' is not allowed for "
                           r"model.arch='mine'; .*or a model.arch that trains it: 'prefix_lm'$"):
            record.require_objective("blank_infilling")
    prefix = dataclasses.replace(causal, prefix_attention=True)
    assert prefix.objectives == objectives.names()
    for name in objectives.names():
        prefix.require_objective(name)


def test_the_readme_s_architecture_file_registers_a_model_with_its_own_table_2_labels(
        monkeypatch):
    """The README's "Adding an architecture" block, run as written in a registry of this
    test's own: a whole config file whose model has half the encoder and its own labels (it
    copied the encoder-decoder's 2P / M, which a sweep then showed for a 1.4x model)."""
    monkeypatch.setattr(architectures, "_REGISTRY", dict(architectures._REGISTRY))
    block = readme_python_block('name="deep_decoder"')
    namespace: dict = {}
    exec(block, namespace)  # as `--config=FILE` runs it
    config = namespace["get_config"]()
    assert config.model.arch == "deep_decoder"
    ours = accounting.table2_columns(config.model, 64, 16)
    config.model.arch = "encoder_decoder"
    theirs = accounting.table2_columns(config.model, 64, 16)
    assert (ours.params_label, ours.cost_label) == ("1.5P", "< M")
    assert 1.0 < ours.params_ratio < theirs.params_ratio
    assert ours.flops_ratio < theirs.flops_ratio
