"""The input pipeline: deterministic pre-training chunks, split by rows between processes;
packing and padding."""
import os
import random

import numpy as np
import pytest

from t5x_lite import attention, batch_format
from t5x_lite.config import EOS_ID, UNK_ID, ConfigError, default_config
from t5x_lite.data import builders, pipeline
from t5x_lite.data.pipeline import (MixtureData, PretrainData, encode_examples, pack_examples,
                                    pad_examples, pretrain_data_from_config, tokenize_stream)
from t5x_lite.data.vocabulary import train_vocabulary

VOCAB_SIZE, EXTRA = 300, 20
_RNG = random.Random(0)
_WORDS = ["".join(_RNG.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(_RNG.randint(2, 7)))
          for _ in range(800)]
# Document i starts with its own marker word, so a decoded chunk tells where it came from.
DOCS = [f"doc{i} " + " ".join(_RNG.choice(_WORDS) for _ in range(_RNG.randint(5, 30)))
        for i in range(200)]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return train_vocabulary(DOCS, VOCAB_SIZE, EXTRA,
                            cache_dir=str(tmp_path_factory.mktemp("vocab")))


def make(vocab, **kw):
    args = dict(records_or_source=[{"text": d} for d in DOCS], vocab=vocab, raw_length=16,
                global_batch_size=8, seed=3)
    return PretrainData(**{**args, **kw})


def test_stream_is_documents_each_followed_by_eos(vocab):
    stream = tokenize_stream(vocab, DOCS[:3] + ["", "x <extra_id_0>"])
    expected = [t for d in DOCS[:3] for t in vocab.encode(d) + [EOS_ID]]
    assert stream.dtype == np.int32 and stream[:len(expected)].tolist() == expected
    # The sentinel written as text never reaches the stream: it became UNK.
    tail = stream[len(expected):]
    assert tail[-1] == EOS_ID and UNK_ID in tail and tail.max() < vocab.base_vocab_size


def test_batches_are_exact_chunks_of_the_stream(vocab):
    data = make(vocab)
    batch = data.batch(0)
    assert batch.shape == (8, 16) and batch.dtype == np.int32
    stream = tokenize_stream(vocab, DOCS)
    chunks = {tuple(stream[i:i + 16]) for i in range(0, len(stream) - 15, 16)}
    assert all(tuple(row) in chunks for row in batch)
    assert (batch > 0).all() and (batch < vocab.base_vocab_size).all()


def test_same_step_after_a_restart_gives_the_same_batch(vocab, tmp_path):
    first = make(vocab, cache_dir=str(tmp_path))
    seen = [first.batch(s) for s in (0, 5, 123)]
    restarted = make(vocab, cache_dir=str(tmp_path))  # reads the cached token stream
    assert len(os.listdir(tmp_path)) == 1
    for step, batch in zip((0, 5, 123), seen):
        np.testing.assert_array_equal(restarted.batch(step), batch)
    # Order of calls does not matter, and another seed gives another order.
    np.testing.assert_array_equal(restarted.batch(5), seen[1])
    assert not np.array_equal(make(vocab, seed=4).batch(0), seen[0])


def test_each_epoch_visits_every_chunk_once_in_a_new_order(vocab):
    data = make(vocab, global_batch_size=5)
    n = data.num_chunks
    steps = 2 * n // 5 + 1
    rows = np.concatenate([data.batch(s) for s in range(steps)])
    first, second = rows[:n], rows[n:2 * n]
    as_set = lambda a: sorted(map(tuple, a.tolist()))  # noqa: E731
    all_chunks = data.tokens[: n * 16].reshape(n, 16)
    assert as_set(first) == as_set(all_chunks) == as_set(second)
    assert not np.array_equal(first, second)


def test_passes_count_the_corpus_read_by_a_run_s_steps(vocab):
    data = make(vocab, global_batch_size=5)
    assert data.passes(data.num_chunks) == 5.0  # 5 rows a step
    assert data.passes(1) == 5 / data.num_chunks


def _chunk_numbers(rows: np.ndarray) -> set[int]:
    """The chunks `rows` are, for data whose stream was replaced by np.arange (chunk c holds
    c * 16 ... c * 16 + 15)."""
    return set((rows[:, 0] // 16).tolist())


def test_held_out_chunks_are_text_no_training_batch_of_a_run_that_fits_reads(vocab):
    data = make(vocab, held_out_batches=2)
    data.tokens = np.arange(data.num_chunks * 16, dtype=np.int32)
    held_out = [data.held_out_batch(index) for index in range(2)]
    assert all(batch.shape == (8, 16) for batch in held_out)
    held = _chunk_numbers(np.concatenate(held_out))
    assert len(held) == 16  # two batches of distinct chunks
    steps = data.steps_before_held_out
    assert steps == (data.num_chunks - 16) // 8 > 0
    trained = _chunk_numbers(np.concatenate([data.batch(step) for step in range(steps)]))
    assert not held & trained
    assert _chunk_numbers(data.batch(steps)) & held  # the bound is tight: one step more reads them
    with pytest.raises(ValueError, match="index=2 must be in"):
        data.held_out_batch(2)


def test_holding_text_out_changes_no_training_batch_and_every_process_holds_the_same(vocab):
    plain, held = make(vocab), make(vocab, held_out_batches=3)
    for step in (0, 1, held.steps_before_held_out - 1):
        np.testing.assert_array_equal(held.batch(step), plain.batch(step))
    second = make(vocab, held_out_batches=3, process_index=1, process_count=2)
    np.testing.assert_array_equal(second.held_out_batch(2), held.held_out_batch(2))
    # Drawn from the seed's order, like the training batches.
    assert not np.array_equal(make(vocab, held_out_batches=3, seed=4).held_out_batch(0),
                              held.held_out_batch(0))


def test_two_hosts_feed_the_halves_of_the_single_host_batch(vocab):
    """Any number of processes trains on the batches of one: each feeds its contiguous rows."""
    single = make(vocab)
    hosts = [make(vocab, process_index=p, process_count=2) for p in (0, 1)]
    assert hosts[0].batch(0).shape == (4, 16)
    for step in (0, 1, single.steps_per_epoch, 57):  # an epoch boundary and a later epoch
        np.testing.assert_array_equal(
            np.concatenate([host.batch(step) for host in hosts]), single.batch(step))


def test_a_within_document_objective_reads_each_document_in_segments(vocab):
    """T5's prefix LM and deshuffling examples (prefix_lm.gin, all_permute.gin): each document
    cut from its start into pieces of the objective's raw length, the last shorter, no EOS;
    every piece once an epoch, padded to the layout's raw length."""
    data = make(vocab, raw_length=16, segment_length=12, global_batch_size=4)
    pieces = sorted(tuple(ids[i:i + 12]) for ids in map(vocab.encode, DOCS)
                    for i in range(0, len(ids), 12))
    assert data.num_chunks == len(pieces)
    rows = np.concatenate([data.batch(step) for step in range(-(-len(pieces) // 4))])
    epoch = rows[:len(pieces)]
    assert sorted(tuple(row[row != 0].tolist()) for row in epoch) == pieces
    assert not (epoch[:, 12:]).any() and EOS_ID not in epoch
    # A piece holds the padding only at its end (the objective reads its first n tokens).
    assert all((row[:np.count_nonzero(row)] != 0).all() for row in epoch)
    hosts = [make(vocab, raw_length=16, segment_length=12, global_batch_size=4,
                  process_index=p, process_count=2) for p in (0, 1)]
    np.testing.assert_array_equal(np.concatenate([h.batch(7) for h in hosts]), data.batch(7))
    with pytest.raises(ValueError, match=r"segment_length=17 must be in \[1, 16\]"):
        make(vocab, raw_length=16, segment_length=17)


@pytest.mark.parametrize("name, expected", [("prefix_lm", 63), ("deshuffling", 63),
                                            ("span_corruption", None), ("lm", None)])
def test_which_objectives_read_within_documents(name, expected):
    config = default_config()
    config.objective.name, config.objective.inputs_length = name, 64
    assert pipeline.segment_length(config) == expected


def test_bad_arguments_name_the_field(vocab):
    with pytest.raises(ValueError, match="global_batch_size=7 must be a positive multiple of "
                                         "process_count=2"):
        make(vocab, global_batch_size=7, process_count=2, process_index=1)
    with pytest.raises(ValueError, match=r"process_index=2 must be in \[0, 2\)"):
        make(vocab, process_index=2, process_count=2)
    # A config error (one line from the CLI; a sweep stops on it before it starts).
    with pytest.raises(ConfigError, match=r"^the corpus \(data.corpus\) has \d+ tokens, fewer "
                                          r"than one chunk of raw_length=100000"):
        make(vocab, raw_length=100_000)
    with pytest.raises(ValueError, match="step=-1 must be >= 0"):
        make(vocab).batch(-1)


def test_from_config_trains_the_vocabulary_and_reads_the_corpus(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n\n".join(DOCS[:100]))
    (corpus / "b.txt").write_text("\n\n".join(DOCS[100:]))
    config = default_config()
    config.model.update(vocab_size=VOCAB_SIZE, num_sentinels=EXTRA)
    config.data.update(corpus=str(corpus / "*.txt"), data_dir=str(tmp_path / "dd"))
    config.train.update(batch_size=4, seed=1)
    vocab, data = pretrain_data_from_config(config, raw_length=32)
    assert vocab.vocab_size == VOCAB_SIZE and data.batch(3).shape == (4, 32)
    assert vocab.sentinel_id(0) == config.model.vocab_size - 1
    assert data.segments is None and EOS_ID in data.batch(0)  # the default span corruption
    # A prefix LM reads one document per example (its raw length 15 of the layout's 32).
    config.objective.update(name="prefix_lm", inputs_length=16)
    _, segmented = pretrain_data_from_config(config, raw_length=32)
    rows = segmented.batch(0)
    assert segmented.segments is not None and EOS_ID not in rows
    assert not rows[:, 15:].any() and rows[:, 0].all()
    config.model.vocab_size = 5000  # more pieces than this corpus can give
    with pytest.raises(ValueError, match="cannot train a vocabulary with vocab_size=5000"):
        pretrain_data_from_config(config, raw_length=32)
    path = os.path.join(tmp_path / "dd" / "vocab", os.listdir(tmp_path / "dd" / "vocab")[0])
    config.data.vocab = path
    with pytest.raises(ConfigError, match="model.vocab_size=5000 but the vocabulary"):
        pretrain_data_from_config(config, raw_length=32)


def test_a_text_file_corpus_is_cached_by_its_files_and_reread_when_one_changes(
        vocab, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n\n".join(DOCS))
    args = dict(vocab=vocab, raw_length=16, global_batch_size=8, seed=3,
                cache_dir=str(tmp_path / "tokens"), data_dir=str(tmp_path / "dd"))
    first = PretrainData(str(corpus / "*.txt"), **args)
    np.testing.assert_array_equal(first.tokens, tokenize_stream(vocab, DOCS))
    # A restart finds the stream by the files' key and reads no document.
    monkeypatch.setattr(builders.Records, "__getitem__", lambda self, i: pytest.fail("read"))
    again = PretrainData(str(corpus / "*.txt"), **args)
    np.testing.assert_array_equal(again.batch(7), first.batch(7))
    monkeypatch.undo()
    (corpus / "a.txt").write_text("\n\n".join(DOCS[:50]))  # edited: a new build, new stream
    edited = PretrainData(str(corpus / "*.txt"), **args)
    np.testing.assert_array_equal(edited.tokens, tokenize_stream(vocab, DOCS[:50]))
    assert len(os.listdir(tmp_path / "tokens")) == 2


def test_the_vocabulary_trains_on_evenly_spaced_documents_of_a_large_corpus(monkeypatch):
    records = [{"text": d} for d in DOCS[:25]]
    assert pipeline.vocabulary_sample(records) is records  # small corpora are used whole
    monkeypatch.setattr(pipeline, "VOCAB_MAX_DOCUMENTS", 10)
    assert pipeline.vocabulary_sample(records) == records[::3]  # 9 documents, first to last


def test_a_glob_that_matches_nothing_is_a_config_error_naming_it(tmp_path):
    config = default_config()
    config.data.update(corpus=str(tmp_path / "*.txt"), data_dir=str(tmp_path / "dd"))
    with pytest.raises(ConfigError, match=r"data.corpus='.*/\*\.txt' matches no file$"):
        pretrain_data_from_config(config, raw_length=32)
    assert not (tmp_path / "dd").exists()  # stopped before any vocabulary was trained


def test_a_mistyped_corpus_is_a_config_error_naming_the_field(tmp_path):
    config = default_config()
    config.data.update(corpus="pyhton_docs", data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="data.corpus='pyhton_docs' is not 'python_docs'"):
        pretrain_data_from_config(config, raw_length=32)


@pytest.mark.parametrize("content, refusal", [
    ("", r"^the train split of .*/corpus\.txt holds no records \(its files are empty\)$"),
    ("three short words\n", r"^model\.vocab_size=300 on data\.corpus='.*/corpus\.txt': cannot "
                            r"train a vocabulary with vocab_size=300 .*too high.*\): choose a "
                            r"smaller vocab_size or give it more text; or give data\.vocab"),
])
def test_a_corpus_that_cannot_train_the_vocabulary_is_a_config_error(content, refusal, tmp_path):
    """Tracebacks before: TFDS's AssertionError ("No examples were yielded"), our ValueError."""
    (tmp_path / "corpus.txt").write_text(content)
    config = default_config()
    config.model.update(vocab_size=300, num_sentinels=20)
    config.data.update(corpus=str(tmp_path / "corpus.txt"), data_dir=str(tmp_path / "dd"))
    with pytest.raises(ConfigError, match=refusal):
        pretrain_data_from_config(config, raw_length=32)


def test_a_vocabulary_file_sentencepiece_cannot_read_is_a_config_error(tmp_path):
    (tmp_path / "vocab.model").write_text("not a model")
    config = default_config()
    config.data.update(vocab=str(tmp_path / "vocab.model"), data_dir=str(tmp_path / "dd"))
    with pytest.raises(ConfigError, match=r"^data\.vocab='.*/vocab\.model' is not a "
                                          r"SentencePiece model file"):
        pipeline.vocabulary_from_config(config)
    config.data.vocab = str(tmp_path / "missing.model")  # named by its field, as the others
    with pytest.raises(ConfigError, match=r"^data\.vocab='.*/missing\.model' is not a file"):
        pipeline.vocabulary_from_config(config)


# ----------------------------------------------------------------------------- downstream

def numbered_examples(lengths):
    """Example k has tokens all equal to 10 + k (inputs) and 100 + k (targets), EOS last."""
    return [([10 + k] * (i - 1) + [EOS_ID], [100 + k] * (t - 1) + [EOS_ID])
            for k, (i, t) in enumerate(lengths)]


# Every part has a token besides EOS, so each position's example can be read off its value.
LENGTHS = [(3, 2), (4, 3), (2, 2), (6, 4), (2, 2), (5, 2), (2, 3)]


def owner(tokens, segments):
    """Which example each position belongs to, read from token values; -1 for padding."""
    own = np.full(tokens.shape, -1)
    for (r, c), s in np.ndenumerate(segments):
        if s:
            value = tokens[r][(segments[r] == s) & (tokens[r] != EOS_ID)][0]
            own[r, c] = value - 100 if value >= 100 else value - 10
    return own


def test_encode_examples_appends_eos(vocab):
    [(inputs, targets)] = encode_examples(vocab, [("doc1 hello", "doc2")])
    assert inputs == vocab.encode("doc1 hello") + [EOS_ID]
    assert targets == vocab.encode("doc2") + [EOS_ID]


def test_padding_keeps_one_example_per_row():
    [batch, last] = pad_examples(numbered_examples(LENGTHS), 4, inputs_length=6,
                                 targets_length=4)
    assert set(batch) == {"encoder_input_tokens", "decoder_input_tokens",
                          "decoder_target_tokens", "decoder_loss_weights"}
    assert batch["encoder_input_tokens"][1].tolist() == [11, 11, 11, EOS_ID, 0, 0]
    assert batch["decoder_target_tokens"][1].tolist() == [101, 101, EOS_ID, 0]
    # As in a pre-training row, the first padding position is fed the last target (no loss).
    assert batch["decoder_input_tokens"][1].tolist() == [0, 101, 101, EOS_ID]
    assert batch["decoder_loss_weights"][1].tolist() == [1, 1, 1, 0]
    assert last["encoder_input_tokens"].shape == (4, 6)
    assert (last["decoder_loss_weights"][3:] == 0).all()  # filler row


def test_truncation_keeps_eos_last():
    [batch] = pad_examples(numbered_examples([(9, 7)]), 1, inputs_length=4, targets_length=3)
    assert batch["encoder_input_tokens"][0].tolist() == [10, 10, 10, EOS_ID]
    assert batch["decoder_target_tokens"][0].tolist() == [100, 100, EOS_ID]


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only"])
def test_packing_never_lets_two_examples_see_each_other(family):
    examples = numbered_examples(LENGTHS)
    batches = pack_examples(examples, 2, inputs_length=8, targets_length=5,
                            family=family)
    total = sum(int(b["decoder_loss_weights"].sum()) for b in batches)
    expected = sum(t for _, t in LENGTHS)
    assert total == expected  # every target token is trained on exactly once
    rows = sum(b["decoder_target_tokens"].shape[0] for b in batches)
    assert rows < len(LENGTHS)  # packing did share rows
    for b in batches:
        dec_seg, dec_tok = b["decoder_segment_ids"], b["decoder_target_tokens"]
        dec_owner = owner(dec_tok, dec_seg)
        if family == "decoder_only":
            mask = attention.combine_masks(attention.prefix_lm_mask(b["inputs_mask"]),
                                           attention.segment_mask(dec_seg, dec_seg))
            pairs = [(mask, dec_owner, dec_owner)]
        else:
            enc_seg, enc_tok = b["encoder_segment_ids"], b["encoder_input_tokens"]
            enc_owner = owner(enc_tok, enc_seg)
            enc_mask = attention.combine_masks(attention.segment_mask(enc_seg, enc_seg),
                                               attention.padding_mask(enc_tok > 0, enc_tok > 0))
            dec_mask = attention.combine_masks(attention.causal_mask(dec_tok.shape[1]),
                                               attention.segment_mask(dec_seg, dec_seg))
            cross = attention.cross_attention_mask(dec_tok > 0, enc_tok > 0, dec_seg, enc_seg)
            pairs = [(enc_mask, enc_owner, enc_owner), (dec_mask, dec_owner, dec_owner),
                     (cross, dec_owner, enc_owner)]
        for mask, q_owner, k_owner in pairs:
            mask = np.asarray(mask)[:, 0]
            different = (q_owner[:, :, None] != k_owner[:, None, :]) & (q_owner[:, :, None] >= 0)
            assert not (mask & different & (k_owner[:, None, :] >= 0)).any()
            # ...and an example does see itself.
            same = (q_owner[:, :, None] == k_owner[:, None, :]) & (q_owner[:, :, None] >= 0)
            assert (mask & same).any()


def test_packed_positions_and_shifted_inputs_restart_per_example():
    [batch] = pack_examples(numbered_examples([(3, 2), (2, 3)]), 1, inputs_length=6,
                            targets_length=6)
    assert batch["encoder_segment_ids"][0].tolist() == [1, 1, 1, 2, 2, 0]
    assert batch["encoder_positions"][0].tolist() == [0, 1, 2, 0, 1, 0]
    assert batch["decoder_target_tokens"][0].tolist() == [100, EOS_ID, 101, 101, EOS_ID, 0]
    assert batch["decoder_input_tokens"][0].tolist() == [0, 100, 0, 101, 101, 0]
    assert batch["decoder_positions"][0].tolist() == [0, 1, 0, 1, 2, 0]


def test_decoder_only_prefix_covers_inputs_and_the_first_prediction():
    [batch] = pack_examples(numbered_examples([(2, 2), (1, 2)]), 1, inputs_length=4,
                            targets_length=4, family="decoder_only")
    assert batch["decoder_target_tokens"][0].tolist() == [10, EOS_ID, 100, EOS_ID,
                                                          EOS_ID, 101, EOS_ID, 0]
    assert batch["decoder_input_tokens"][0].tolist() == [0, 10, EOS_ID, 100, 0, EOS_ID, 101, 0]
    assert batch["inputs_mask"][0].tolist() == [1, 1, 1, 0, 1, 1, 0, 0]
    assert batch["decoder_loss_weights"][0].tolist() == [0, 0, 1, 1, 0, 1, 1, 0]


def test_bad_lengths_are_rejected():
    with pytest.raises(ValueError, match="targets_length=0 must be positive"):
        pack_examples(numbered_examples(LENGTHS), 2, inputs_length=4, targets_length=0)


# --- fine-tuning mixtures --------------------------------------------------------------------


def _task_examples(task, count):
    """Distinguishable examples: inputs [task + 3, i + 3, EOS], targets [i + 3, EOS]."""
    return [([task + 3, i + 3, 1], [i + 3, 1]) for i in range(count)]


def _mixture(pack=False, seed=0):
    return MixtureData([_task_examples(0, 100), _task_examples(1, 10)], mixing_limit=50,
                                batch_size=6, inputs_length=8, targets_length=8,
                                family="encoder_decoder", pack=pack, seed=seed)


def test_a_mixture_is_examples_proportional_with_the_rate_limit():
    data = _mixture()
    # One mixture epoch: min(100, 50) + min(10, 50) = 60 slots = 10 steps of 6 examples.
    epoch = [data.example(p) for p in range(60)]
    by_task = [[ex for ex in epoch if ex[0][0] == task + 3] for task in (0, 1)]
    assert [len(examples) for examples in by_task] == [50, 10]
    assert sorted(ex[1] for ex in by_task[1]) == sorted(ex[1] for ex in _task_examples(1, 10))
    assert len({tuple(ex[1]) for ex in by_task[0]}) == 50  # no repeats within a pass
    # The large task continues its own pass in the next mixture epoch: its other 50 examples.
    later = [data.example(p) for p in range(60, 120) if data.example(p)[0][0] == 3]
    assert {tuple(ex[1]) for ex in by_task[0] + later} == {(i + 3, 1) for i in range(100)}


def test_two_processes_feed_the_halves_of_the_single_process_mixture_batch():
    """Fine-tuning like pre-training: process p feeds its contiguous rows of the one batch."""
    single = _mixture(pack=True)
    halves = [MixtureData([_task_examples(0, 100), _task_examples(1, 10)], mixing_limit=50,
                          batch_size=6, inputs_length=8, targets_length=8,
                          family="encoder_decoder", pack=True, seed=0, process_index=p,
                          process_count=2) for p in (0, 1)]
    for step in (0, 9):
        whole = single.batch(step)
        for name, value in whole.items():
            assert halves[0].batch(step)[name].shape[0] == 3
            np.testing.assert_array_equal(
                np.concatenate([half.batch(step)[name] for half in halves]), value)
    with pytest.raises(ValueError, match="batch_size=6 must be a positive multiple of "
                                         "process_count=4"):
        MixtureData([_task_examples(0, 10)], mixing_limit=50, batch_size=6, inputs_length=8,
                    targets_length=8, family="encoder_decoder", pack=False, seed=0,
                    process_count=4)


def test_a_family_that_cannot_pack_reads_a_batch_of_examples_a_step_when_asked_to_pack():
    """encoder_only rows hold one example each: asked to pack (fine-tuning's default), its
    mixture reads the unpacked batch, the next batch_size examples, and skips none. It read as
    many as packing would fit and kept the first batch_size of them."""
    def mixture(pack):
        return MixtureData([_task_examples(0, 100), _task_examples(1, 10)], mixing_limit=50,
                           batch_size=6, inputs_length=8, targets_length=8,
                           family="encoder_only", pack=pack, seed=0,
                           mask_token=batch_format.mask_token(64))

    asked, unpacked = mixture(pack=True), mixture(pack=False)
    assert not asked.pack and asked.examples_per_step == 6
    for step in (0, 1, 5):
        batch = asked.batch(step)
        assert batch.keys() == unpacked.batch(step).keys()
        for name, value in unpacked.batch(step).items():
            np.testing.assert_array_equal(batch[name], value)


def test_mixture_batches_are_a_pure_function_of_seed_and_step():
    data = _mixture(pack=True)
    for step in (7, 0, 3):
        fresh = _mixture(pack=True).batch(step)
        assert all(np.array_equal(fresh[k], v) for k, v in data.batch(step).items())
    other_seed = _mixture(pack=True, seed=1).batch(7)
    assert not np.array_equal(other_seed["encoder_input_tokens"],
                              data.batch(7)["encoder_input_tokens"])
    batch = data.batch(0)
    assert batch["encoder_input_tokens"].shape == (6, 8)
    # Packed: 3-token inputs fill two per 8-token row, so a step takes 12 examples.
    assert data.examples_per_step == 12 and (batch["encoder_segment_ids"].max(axis=1) == 2).all()
