"""A SentencePiece vocabulary with T5's reserved ids and sentinels, and how to train one.

Ids follow seqio: pad=0, eos=1, unk=2, no bos; the SentencePiece model's pieces come first and
`num_extra_ids` sentinels are appended at the top, so `vocab_size = pieces + num_extra_ids` and
`<extra_id_0>` is `vocab_size - 1`, counting down. The sentinels are added to the model as
user-defined pieces, so `encode('<extra_id_3>')` and `decode` handle them like any token.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
from typing import Iterable, Sequence

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from t5x_lite.config import (DEFAULT_NUM_SENTINELS, EOS_ID, NUM_RESERVED_IDS, PAD_ID, UNK_ID,
                             sentinel_id)

# Byte fallback needs 256 byte pieces; below this many pieces they would crowd out subwords.
_MIN_PIECES_FOR_BYTE_FALLBACK = 1024
# SentencePiece trains on at most this many sentences (a random sample of longer corpora).
_MAX_TRAINING_SENTENCES = 2_000_000
# SentencePiece's unigram trainer gives another model for another thread count, so the count is
# fixed, not the machine's cores: the same text makes the same vocabulary on every machine (2,
# the development machine's cores, which trained every vocabulary behind this repository's
# measured numbers). Part of the options, so of a cached model's name.
TRAINING_THREADS = 2


def sentinel_text(i: int) -> str:
    """The text form of sentinel `i`, as in T5: `<extra_id_i>`."""
    return f"<extra_id_{i}>"


class Vocabulary:
    """Text <-> ids for a SentencePiece model plus `num_extra_ids` sentinels at the top.

    Picklable: it pickles as the model bytes and rebuilds the processor when loaded.
    """

    def __init__(self, model_proto: bytes, num_extra_ids: int = DEFAULT_NUM_SENTINELS):
        if num_extra_ids < 0:
            raise ValueError(f"num_extra_ids={num_extra_ids} must be >= 0")
        self._model_proto = model_proto
        self.num_extra_ids = num_extra_ids
        base = spm.SentencePieceProcessor(model_proto=model_proto)
        reserved = (base.pad_id(), base.eos_id(), base.unk_id())
        if reserved != (PAD_ID, EOS_ID, UNK_ID):
            raise ValueError(
                f"the SentencePiece model has (pad, eos, unk) ids {reserved}; t5x_lite needs "
                f"{(PAD_ID, EOS_ID, UNK_ID)} (the T5 convention)")
        self.base_vocab_size = base.get_piece_size()
        self._processor = spm.SentencePieceProcessor(model_proto=_with_sentinels(
            model_proto, num_extra_ids))

    def __getstate__(self) -> dict:
        return {"model_proto": self._model_proto, "num_extra_ids": self.num_extra_ids}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_proto"], state["num_extra_ids"])

    @property
    def vocab_size(self) -> int:
        """SentencePiece pieces plus sentinels."""
        return self.base_vocab_size + self.num_extra_ids

    @property
    def model_proto(self) -> bytes:
        """The SentencePiece model without sentinels (what `load_vocabulary` reads)."""
        return self._model_proto

    def sentinel_id(self, i: int) -> int:
        """Id of `<extra_id_i>` (`config.sentinel_id`: vocab_size - 1 - i)."""
        if not 0 <= i < self.num_extra_ids:
            raise ValueError(f"sentinel index {i} must be in [0, {self.num_extra_ids})")
        return sentinel_id(self.vocab_size, i)

    def pieces(self) -> list[str]:
        """Every id's piece, as SentencePiece segments text: '▁' (U+2581) marks a word's start
        (pieces never hold whitespace elsewhere), a byte-fallback piece is its byte (as a
        Latin-1 character), and reserved ids and sentinels are their names (`</s>`,
        `<extra_id_0>`)."""
        processor = self._processor
        return [chr(int(processor.id_to_piece(i)[3:5], 16)) if processor.is_byte(i)
                else processor.id_to_piece(i) for i in range(self.vocab_size)]

    def encode(self, text: str) -> list[int]:
        """Ids of `text` (no EOS appended)."""
        return self._processor.encode(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """`encode` of each text; `num_threads > 1` encodes in parallel inside SentencePiece."""
        return self._processor.encode(list(texts), num_threads=num_threads)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids` up to the first EOS, without pads; sentinels appear as `<extra_id_N>`."""
        kept = []
        for i in map(int, ids):
            if i == EOS_ID:
                break
            if i != PAD_ID:
                kept.append(i)
        return self._processor.decode(kept)


def _with_sentinels(model_proto: bytes, num_extra_ids: int) -> bytes:
    """The model with `<extra_id_{n-1}>` ... `<extra_id_0>` appended as user-defined pieces."""
    model = sentencepiece_model_pb2.ModelProto.FromString(model_proto)
    for i in reversed(range(num_extra_ids)):
        piece = model.pieces.add()
        piece.piece = sentinel_text(i)
        piece.score = 0.0
        piece.type = sentencepiece_model_pb2.ModelProto.SentencePiece.Type.USER_DEFINED
    return model.SerializeToString()


def load_vocabulary(path: str, num_extra_ids: int = DEFAULT_NUM_SENTINELS) -> Vocabulary:
    """A `Vocabulary` from an existing SentencePiece `.model` file (e.g. T5's public one)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"vocabulary path {path!r} is not a file")
    with open(path, "rb") as f:
        return Vocabulary(f.read(), num_extra_ids)


def train_vocabulary(
    texts: Iterable[str],
    vocab_size: int,
    num_extra_ids: int = DEFAULT_NUM_SENTINELS,
    cache_dir: str | None = None,
) -> Vocabulary:
    """Trains a unigram SentencePiece model so that the vocabulary has `vocab_size` ids.

    The model gets `vocab_size - num_extra_ids` pieces (3 of them pad/eos/unk) and byte
    fallback when there is room for it (>= 1024 pieces), so no text maps to unk. Documents are
    split into lines for training. With `cache_dir`, the model is stored under a hash of the
    text and the options and reused when the same request comes again.
    """
    num_pieces = vocab_size - num_extra_ids
    if num_pieces <= NUM_RESERVED_IDS:
        raise ValueError(f"vocab_size={vocab_size} leaves {num_pieces} pieces after "
                         f"num_extra_ids={num_extra_ids}; need more than {NUM_RESERVED_IDS}")
    options = dict(
        model_type="unigram", vocab_size=num_pieces, pad_id=PAD_ID, eos_id=EOS_ID,
        unk_id=UNK_ID, bos_id=-1, byte_fallback=num_pieces >= _MIN_PIECES_FOR_BYTE_FALLBACK,
        input_sentence_size=_MAX_TRAINING_SENTENCES, shuffle_input_sentence=True,
        num_threads=TRAINING_THREADS,
    )
    digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
    lines = []
    for text in texts:
        digest.update(text.encode("utf-8") + b"\0")
        lines.extend(line for line in text.split("\n") if line.strip())
    path = None
    if cache_dir:
        path = os.path.join(cache_dir, f"spm-{num_pieces}-{digest.hexdigest()[:16]}.model")
        if os.path.isfile(path):
            return load_vocabulary(path, num_extra_ids)
    if not lines:
        raise ValueError("train_vocabulary got no text to train on")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                                       minloglevel=2,  # only SentencePiece's errors
                                       **options)
    except RuntimeError as e:  # e.g. "Vocabulary size too high": name our field
        # Its "Please set it to a value <= N" counts pieces, without the sentinels, and moves
        # with byte fallback (on from 1024 pieces): not a vocab_size to set.
        said = re.sub(r"\s*Please set it to a value <= \d+\.?", "", str(e)).strip()
        raise ValueError(f"cannot train a vocabulary with vocab_size={vocab_size} "
                         f"(num_extra_ids={num_extra_ids}) on this text ({said}): choose a "
                         "smaller vocab_size or give it more text") from e
    if path:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = f"{path}.tmp{socket.gethostname()}-{os.getpid()}"  # hosts may share the folder
        with open(tmp, "wb") as f:
            f.write(model.getvalue())
        os.replace(tmp, path)  # atomic: concurrent processes never read half a model
    return Vocabulary(model.getvalue(), num_extra_ids)
