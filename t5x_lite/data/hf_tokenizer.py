"""Our vocabulary as Hugging Face tokenizer files, giving the same ids as `Vocabulary.encode`.

`tokenizer_files(vocab)` returns the files `AutoTokenizer.from_pretrained(DIR)` reads:

    spiece.model           the SentencePiece model without sentinels (T5Tokenizer, seqio)
    tokenizer.json         the `tokenizers` pipeline below, which AutoTokenizer loads as it is
    tokenizer_config.json  its class (PreTrainedTokenizerFast) and special tokens

Why our own tokenizer.json rather than transformers' T5Tokenizer: that class rebuilds its
pipeline from the vocabulary without byte fallback (so bytes our SentencePiece model encodes
become <unk>) and splits the text at sentinels before it normalises whitespace (so
"a <extra_id_0>" loses the word-boundary piece SentencePiece gives before the sentinel).
The pipeline here mirrors SentencePiece's steps instead:
- normaliser: its precompiled character map, then (`remove_extra_whitespaces`) strip the text
  and collapse runs of spaces, spaces to "▁", and (`add_dummy_prefix`) one "▁" in front;
- pre-tokeniser (`split_by_whitespace`): pieces start at a "▁", as SentencePiece's do;
- model: Unigram over the same pieces and scores, the sentinels appended as ordinary pieces
  (score 0, as `Vocabulary` adds them), so `<extra_id_i>` is `vocab_size - 1 - i` and wins
  over any split of its text as SentencePiece's user-defined pieces do; byte fallback as the
  model was trained;
- post-processor: EOS (id 1) appended, as the input pipeline appends it to every sequence.
So `tokenizer(text).input_ids == vocab.encode(text) + [EOS_ID]` for nearly all text: 3,024 of
3,029 texts of the shared enwiki / enwikinews samples and edge cases (checked 2026-12-05; every
one decodes alike). The rest: text holding the literal strings "<pad>", "</s>" or "<unk>",
which transformers always reads as those special tokens (SentencePiece spells them out as
pieces); exact ties between two splits' scores, which the two libraries break differently
("1,000": "00" + "0" or "0" + "00"); a word that SentencePiece splits otherwise inside a very
long text (16.7k characters) than alone; and a U+0085 at the text's start or end.
"""
from __future__ import annotations

import base64
import json
from typing import Any

from sentencepiece import sentencepiece_model_pb2

from t5x_lite.config import EOS_ID, PAD_ID, UNK_ID
from t5x_lite.data.vocabulary import Vocabulary, sentinel_text

SPIECE_FILE = "spiece.model"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
_WORD_START = "▁"  # SentencePiece's whitespace symbol (U+2581)


def tokenizer_files(vocab: Vocabulary) -> dict[str, bytes]:
    """{file name: contents} of the Hugging Face tokenizer of `vocab` (see the module
    docstring). No `model_max_length`: relative position buckets set no length limit."""
    proto = sentencepiece_model_pb2.ModelProto.FromString(vocab.model_proto)
    specials = {PAD_ID: "pad_token", EOS_ID: "eos_token", UNK_ID: "unk_token"}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **{name: proto.pieces[i].piece for i, name in specials.items()},
        "extra_ids": vocab.num_extra_ids,  # informational: the sentinels are in the vocabulary
    }
    return {
        SPIECE_FILE: vocab.model_proto,
        TOKENIZER_FILE: _json(_tokenizer_json(proto, vocab.num_extra_ids)),
        TOKENIZER_CONFIG_FILE: _json(config),
    }


def _json(data: dict[str, Any]) -> bytes:
    return json.dumps(data, indent=2, ensure_ascii=False).encode("utf-8")


def _tokenizer_json(proto: Any, num_extra_ids: int) -> dict[str, Any]:
    """The `tokenizers` serialisation (format "1.0") of the pipeline in the module docstring."""
    normalizer_spec, trainer_spec = proto.normalizer_spec, proto.trainer_spec
    normalizers: list[dict[str, Any]] = []
    if normalizer_spec.precompiled_charsmap:
        normalizers.append({"type": "Precompiled", "precompiled_charsmap": base64.b64encode(
            normalizer_spec.precompiled_charsmap).decode("ascii")})
    if normalizer_spec.remove_extra_whitespaces:
        normalizers += [{"type": "Strip", "strip_left": True, "strip_right": True},
                        {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]
    normalizers.append({"type": "Replace", "pattern": {"String": " "}, "content": _WORD_START})
    if normalizer_spec.add_dummy_prefix:
        normalizers.append({"type": "Prepend", "prepend": _WORD_START})
    pieces = [[piece.piece, piece.score] for piece in proto.pieces]
    pieces += [[sentinel_text(i), 0.0] for i in reversed(range(num_extra_ids))]
    eos_piece = proto.pieces[EOS_ID].piece
    eos = {"SpecialToken": {"id": eos_piece, "type_id": 0}}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        # Only the reserved ids: listing the sentinels here would cut the text at them before
        # normalisation (see the module docstring).
        "added_tokens": [
            {"id": i, "content": proto.pieces[i].piece, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True}
            for i in (PAD_ID, EOS_ID, UNK_ID)
        ],
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": ({"type": "Metaspace", "replacement": _WORD_START,
                           "prepend_scheme": "never", "split": True}
                          if trainer_spec.split_by_whitespace else None),
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}, eos],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, eos,
                     {"Sequence": {"id": "B", "type_id": 0}}, eos],
            "special_tokens": {eos_piece: {"id": eos_piece, "ids": [EOS_ID],
                                           "tokens": [eos_piece]}},
        },
        # Pieces back to text as SentencePiece decodes them: "▁" is a space, byte pieces are
        # joined into their characters, and the dummy prefix's space is dropped.
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": _WORD_START}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": int(normalizer_spec.add_dummy_prefix),
             "stop": 0},
        ]},
        "model": {"type": "Unigram", "unk_id": UNK_ID, "vocab": pieces,
                  "byte_fallback": trainer_spec.byte_fallback},
    }
