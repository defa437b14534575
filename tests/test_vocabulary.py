"""The SentencePiece vocabulary: reserved ids, sentinels at the top, round trips, caching."""
import os
import pickle
import random

import pytest

from t5x_lite.config import EOS_ID, PAD_ID, UNK_ID
from t5x_lite.data.vocabulary import (Vocabulary, load_vocabulary, sentinel_text,
                                      train_vocabulary)

VOCAB_SIZE, EXTRA = 400, 20
_RNG = random.Random(0)
_WORDS = ["".join(_RNG.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(_RNG.randint(2, 8)))
          for _ in range(1500)]
CORPUS = ["the quick fox jumps over seven lazy dogs while the river flows to the sea."] + [
    " ".join(_RNG.choice(_WORDS) for _ in range(20)) + "." for _ in range(400)]


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="module")
def vocab(vocab_dir) -> Vocabulary:
    return train_vocabulary(CORPUS, VOCAB_SIZE, EXTRA, cache_dir=vocab_dir)


def test_sizes_and_reserved_ids(vocab):
    assert vocab.vocab_size == VOCAB_SIZE
    assert vocab.base_vocab_size == VOCAB_SIZE - EXTRA
    ids = vocab.encode(CORPUS[0])
    assert ids and all(3 <= i < vocab.base_vocab_size for i in ids)


def test_sentinels_sit_at_the_top_counting_down(vocab):
    assert vocab.sentinel_id(0) == VOCAB_SIZE - 1
    assert vocab.sentinel_id(EXTRA - 1) == VOCAB_SIZE - EXTRA
    for i in (0, 7, EXTRA - 1):
        # The text form encodes to the sentinel (after SentencePiece's word-start piece).
        assert vocab.encode(sentinel_text(i))[-1] == vocab.sentinel_id(i)
        assert vocab.decode([vocab.sentinel_id(i)]) == sentinel_text(i)
    with pytest.raises(ValueError, match=r"sentinel index 20 must be in \[0, 20\)"):
        vocab.sentinel_id(EXTRA)


def test_round_trip_text_and_sentinels(vocab):
    text = "the quick fox jumps over seven lazy dogs."
    assert vocab.decode(vocab.encode(text)) == text
    ids = vocab.encode("the river") + [vocab.sentinel_id(0)] + vocab.encode("flows")
    assert vocab.decode(ids) == "the river<extra_id_0> flows"


def test_decode_stops_at_eos_and_drops_pad(vocab):
    ids = vocab.encode("the sea")
    assert vocab.decode([PAD_ID] + ids + [PAD_ID, EOS_ID] + vocab.encode("dogs")) == "the sea"


def test_encode_batch_matches_encode(vocab):
    assert vocab.encode_batch(CORPUS[:3]) == [vocab.encode(t) for t in CORPUS[:3]]


def test_unknown_characters_map_to_unk_without_byte_fallback(vocab):
    # 380 pieces is below the byte-fallback threshold, so an unseen character is unk.
    assert UNK_ID in vocab.encode("漢")


def test_pickle_rebuilds_the_same_vocabulary(vocab):
    clone = pickle.loads(pickle.dumps(vocab))
    assert clone.vocab_size == vocab.vocab_size
    assert clone.encode(CORPUS[3]) == vocab.encode(CORPUS[3])


def test_the_same_text_makes_the_same_vocabulary_on_machines_of_any_core_count(monkeypatch):
    """SentencePiece's trainer gives another model for another thread count: the vocabulary
    (and every token id a run trains on) must not depend on the machine's cores."""
    models = set()
    for cores in (1, 2, 4):
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        models.add(train_vocabulary(CORPUS, VOCAB_SIZE, EXTRA).model_proto)
    assert len(models) == 1


def test_cache_is_reused_and_keyed_by_text(vocab, vocab_dir):
    models = sorted(os.listdir(vocab_dir))
    again = train_vocabulary(CORPUS, VOCAB_SIZE, EXTRA, cache_dir=vocab_dir)
    assert sorted(os.listdir(vocab_dir)) == models  # nothing retrained
    assert again.model_proto == vocab.model_proto
    train_vocabulary(CORPUS + ["a new document about ships"], VOCAB_SIZE, EXTRA,
                     cache_dir=vocab_dir)
    assert len(os.listdir(vocab_dir)) == len(models) + 1


def test_load_vocabulary_reads_a_model_file(vocab, vocab_dir):
    # The cached file of `vocab` (other tests cache other vocabularies in the same folder).
    path = next(path for path in (os.path.join(vocab_dir, name) for name in os.listdir(vocab_dir))
                if open(path, "rb").read() == vocab.model_proto)
    loaded = load_vocabulary(path, num_extra_ids=EXTRA)
    assert loaded.encode(CORPUS[1]) == vocab.encode(CORPUS[1])
    with pytest.raises(FileNotFoundError, match="vocabulary path 'nope.model' is not a file"):
        load_vocabulary("nope.model")


def test_bad_sizes_are_rejected_before_training():
    with pytest.raises(ValueError, match=r"vocab_size=50 leaves -50 pieces"):
        train_vocabulary(CORPUS, 50, num_extra_ids=100)
    # SentencePiece's own bound ("<= N") counts pieces without the sentinels and moves with
    # byte fallback: not a vocab_size, so it is left out.
    with pytest.raises(ValueError, match=r"cannot train a vocabulary with vocab_size=100000 "
                                         r"\(num_extra_ids=100\) on this text \(.*too high.*\): "
                                         r"choose a smaller vocab_size or give it more text$"
                       ) as error:
        train_vocabulary(CORPUS, 100_000, num_extra_ids=100)
    assert "<=" not in str(error.value)


def test_byte_fallback_when_the_vocabulary_is_large_enough(tmp_path):
    big = train_vocabulary(CORPUS, 1300, 100, cache_dir=None)
    ids = big.encode("漢")
    assert UNK_ID not in ids and big.decode(ids) == "漢"
