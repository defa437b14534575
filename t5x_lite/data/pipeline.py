"""The NumPy input pipeline: pre-training chunks, and packed or padded downstream batches.

Pre-training (`PretrainData`): tokenise every document, append EOS, concatenate, cut the stream
into chunks of exactly `raw_length` tokens (the objective turns each chunk into inputs and
targets on the device). T5 concatenates its documents' chunks with no separator
(`reduce_concat_tokens`) and appends EOS only after an example's inputs and targets; here a
document's end stays in the stream as EOS (GLM's [END] and BART's sentences read it), so an
example's inputs or targets may hold an EOS before their own (README, "Where the model and its
training differ from T5's own code"). The objectives T5 makes from one document at a time
(`Objective.within_document`: its prefix LM and deshuffling, whose gin files leave out
`reduce_concat_tokens`) read document segments instead: each document cut from its start into
pieces of the objective's raw length, the last one shorter, without its EOS, padded (T5's
`select_random_chunk` of up to 65536 tokens, then `split_tokens_to_inputs_length`). Which
chunks form the global batch of a step is a pure function of (seed, step), so a resumed run
sees exactly the batches it would have seen, and each of several processes feeds its
contiguous rows of it (`process_rows`).

Downstream (`pack_examples` / `pad_examples`): tokenised (inputs, targets) pairs become
fixed-shape batches of a family's rows (`t5x_lite.batch_format`, the format pre-training
builds on the device too); packed rows carry segment ids and positions so the attention masks
(`t5x_lite.attention`) keep examples apart.
"""
from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
from typing import Any, Iterable, Sequence

import ml_collections
import numpy as np

from t5x_lite import batch_format
from t5x_lite.config import EOS_ID, PAD_ID, UNK_ID, ConfigError
from t5x_lite.data.builders import (
    PythonDocs, TextFiles, as_source, content_key, default_data_dir, is_catalog_name, load_split)
from t5x_lite.data.vocabulary import Vocabulary, load_vocabulary, train_vocabulary

log = logging.getLogger(__name__)

_ENCODE_BLOCK = 1024  # documents per SentencePiece call: bounds memory, keeps threads busy
# A vocabulary is trained on at most this many documents, evenly spaced through the corpus.
# SentencePiece's time grows with the text: for 8192 ids on a shared 2-core machine it took
# 334 s on all 46k documents of shared/data/pretrain (74 M characters) and 141 s on every 4th
# one (11.6k documents, 19 M characters). Smaller corpora (python_docs, the tests') are used
# whole.
VOCAB_MAX_DOCUMENTS = 10_000

Example = tuple[Sequence[int], Sequence[int]]  # (input ids, target ids)


# ----------------------------------------------------------------------------- pre-training


def _texts(records: Sequence[Any]) -> Iterable[str]:
    for record in records:
        yield record if isinstance(record, str) else record["text"]


def document_segments(tokens: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) int64 of the stream's document segments: each document (its tokens
    before its EOS) cut from its start into pieces of `length` tokens, the last shorter;
    empty documents have none."""
    ends = np.flatnonzero(np.asarray(tokens) == EOS_ID)
    if len(ends) == 0 or ends[-1] != len(tokens) - 1:  # a stream that stops mid-document
        ends = np.append(ends, len(tokens))
    doc_starts = np.concatenate([[0], ends[:-1] + 1])
    doc_lengths = ends - doc_starts
    pieces = -(-doc_lengths // length)  # ceil
    first = np.repeat(np.cumsum(pieces) - pieces, pieces)  # each segment's document's first
    index = np.arange(pieces.sum()) - first  # the segment's number within its document
    starts = np.repeat(doc_starts, pieces) + index * length
    return starts, np.minimum(length, np.repeat(ends, pieces) - starts)


def tokenize_stream(vocab: Vocabulary, texts: Iterable[str]) -> np.ndarray:
    """All documents' ids, each followed by EOS, as one int32 stream.

    Real tokens must lie in [3, pieces): a pad id or a sentinel (literal `<extra_id_N>` in the
    text) would confuse the objectives, so such ids become UNK and are counted in a warning.
    """
    parts, block = [], []
    eos = np.array([EOS_ID], np.int32)

    def flush():
        for ids in vocab.encode_batch(block, num_threads=os.cpu_count() or 1):
            if ids:
                parts.extend((np.asarray(ids, np.int32), eos))
        block.clear()

    for text in texts:
        block.append(text)
        if len(block) == _ENCODE_BLOCK:
            flush()
    flush()
    stream = np.concatenate(parts) if parts else np.zeros([0], np.int32)
    bad = (stream == PAD_ID) | (stream >= vocab.base_vocab_size)
    if bad.any():
        log.warning("replaced %d pad / sentinel ids in the text with UNK", int(bad.sum()))
        stream[bad] = UNK_ID
    return stream


class PretrainData:
    """Batches of raw token chunks `int32 [global_batch_size // process_count, raw_length]`.

    The chunks are the stream's consecutive `raw_length` tokens, or with `segment_length` the
    documents' segments of at most that many tokens (<= raw_length), each from its document's
    start or its previous segment's end, without the document's EOS, padded with PAD_ID.

    The global batch of a step is the same for any number of processes: every process reads
    the whole corpus into one token stream, visits its chunks in a seeded random order that
    changes every epoch, and `batch(step)` returns process `process_index`'s contiguous rows
    of that step's global batch (rows p * B / P to (p + 1) * B / P). So a run on P processes
    trains on exactly the batches of a single-process run, and `batch(step)` depends only on
    (seed, step, process index), never on earlier calls. With `cache_dir`, the token stream is
    stored as `.npy` under a hash of the vocabulary and the corpus's content and memory-mapped,
    so a restart skips tokenising (and processes sharing the directory share the file). The
    content is the corpus's text, or for a local source (a glob of text files) its
    `builders.content_key`, so a restart reads no document either.

    Held-out text (`held_out_batches` > 0): the last `held_out_batches` global batches of
    chunks in the first epoch's order (`held_out_batch`). Training reads that order from its
    start, so a run of at most `steps_before_held_out` steps never sees them, and holding them
    out changes no training batch.
    """

    def __init__(
        self,
        records_or_source: Any,
        vocab: Vocabulary,
        raw_length: int,
        global_batch_size: int,
        seed: int,
        process_index: int = 0,
        process_count: int = 1,
        cache_dir: str | None = None,
        data_dir: str | None = None,
        held_out_batches: int = 0,
        segment_length: int | None = None,
    ):
        if raw_length <= 0:
            raise ValueError(f"raw_length={raw_length} must be positive")
        if segment_length is not None and not 0 < segment_length <= raw_length:
            raise ValueError(f"segment_length={segment_length} must be in [1, {raw_length}]")
        if not 0 <= process_index < process_count:
            raise ValueError(f"process_index={process_index} must be in [0, {process_count})")
        if global_batch_size <= 0 or global_batch_size % process_count:
            raise ValueError(f"global_batch_size={global_batch_size} must be a positive multiple "
                             f"of process_count={process_count}")
        records, key = records_or_source, None
        if isinstance(records, str) or not isinstance(records, Sequence):
            key = content_key(records)
            records = load_split(records, "train", data_dir)
        if key is not None:  # ":0:1:" as single-process runs named it: old caches stay valid
            key = f"{key}:0:1:{len(records)}"
        self.raw_length = raw_length
        self.global_batch_size = global_batch_size
        self.batch_size = global_batch_size // process_count
        self.seed = seed
        self.process_index = process_index
        self.tokens = self._load_tokens(vocab, records, key, cache_dir)
        if segment_length is None:
            self.segments = None
            self.num_chunks = len(self.tokens) // raw_length
        else:
            self.segments = document_segments(self.tokens, segment_length)
            self.num_chunks = len(self.segments[0])
        if self.num_chunks == 0:
            raise ConfigError(f"the corpus (data.corpus) has {len(self.tokens)} tokens, fewer "
                              f"than one chunk of raw_length={raw_length} (what "
                              "objective.inputs_length needs): give it more text or shorter "
                              "inputs")
        self.held_out_batches = held_out_batches
        self._permutations: dict[int, np.ndarray] = {}

    @staticmethod
    def _load_tokens(vocab: Vocabulary, records: Sequence[Any], key: str | None,
                     cache_dir: str | None) -> np.ndarray:
        """The corpus's token stream; `key` (if not None) stands for its text in the cache name."""

        def texts() -> Iterable[str]:
            return _texts(records)

        if not cache_dir:
            return tokenize_stream(vocab, texts())
        digest = hashlib.sha256(vocab.model_proto)
        digest.update(str(vocab.num_extra_ids).encode())
        if key is not None:
            digest.update(b"key:" + key.encode())
        else:
            for text in texts():
                digest.update(text.encode("utf-8") + b"\0")
        path = os.path.join(cache_dir, f"tokens-{digest.hexdigest()[:20]}.npy")
        if not os.path.isfile(path):
            os.makedirs(cache_dir, exist_ok=True)
            # Named per host and process: hosts sharing data_dir may run under equal pids.
            tmp = f"{path}.tmp{socket.gethostname()}-{os.getpid()}.npy"
            np.save(tmp, tokenize_stream(vocab, texts()))
            os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
        return np.load(path, mmap_mode="r")

    def passes(self, steps: int) -> float:
        """How many times `steps` steps read the corpus's chunks (T5's section 3.4.2: repeated
        text hurts past a few passes)."""
        return steps * self.global_batch_size / self.num_chunks

    @property
    def steps_per_epoch(self) -> int:
        """Full global batches per pass over the corpus's chunks."""
        return self.num_chunks // self.global_batch_size

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._permutations:
            if len(self._permutations) > 1:  # a batch spans at most two epochs
                self._permutations.pop(min(self._permutations))
            # (seed, 0, epoch): the seeds single-process runs always used, so their batches
            # are unchanged.
            rng = np.random.default_rng([self.seed, 0, epoch])
            self._permutations[epoch] = rng.permutation(self.num_chunks)
        return self._permutations[epoch]

    def batch(self, step: int) -> np.ndarray:
        """This process's rows of the global batch of `step`: `int32 [batch_size, raw_length]`."""
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        first = step * self.global_batch_size + self.process_index * self.batch_size
        positions = first + np.arange(self.batch_size)
        epochs, offsets = np.divmod(positions, self.num_chunks)
        chunks = np.empty_like(positions)
        for epoch in np.unique(epochs):
            here = epochs == epoch
            chunks[here] = self._permutation(int(epoch))[offsets[here]]
        return self._chunk_tokens(chunks)

    def _chunk_tokens(self, chunks: np.ndarray) -> np.ndarray:
        """The tokens of chunks `chunks` (indices into the chunks): int32 [n, raw_length]."""
        offsets = np.arange(self.raw_length)
        if self.segments is None:
            return np.asarray(self.tokens[chunks[:, None] * self.raw_length + offsets],
                              dtype=np.int32)
        starts, lengths = (part[chunks, None] for part in self.segments)
        inside = offsets < lengths
        tokens = np.asarray(self.tokens[np.where(inside, starts + offsets, 0)], dtype=np.int32)
        return np.where(inside, tokens, PAD_ID).astype(np.int32)

    @property
    def steps_before_held_out(self) -> int:
        """The most steps a run can take without reading a held-out chunk."""
        held_out = self.held_out_batches * self.global_batch_size
        return max(self.num_chunks - held_out, 0) // self.global_batch_size

    def held_out_batch(self, index: int) -> np.ndarray:
        """Held-out global batch `index` (< `held_out_batches`), every row, the same in every
        process: `int32 [global_batch_size, raw_length]`, chunks from the end of the first
        epoch's order."""
        if not 0 <= index < self.held_out_batches:
            raise ValueError(f"index={index} must be in [0, {self.held_out_batches})")
        if self.held_out_batches * self.global_batch_size > self.num_chunks:
            raise ValueError(f"{self.held_out_batches} held-out batches of "
                             f"{self.global_batch_size} need more than the corpus's "
                             f"{self.num_chunks} chunks")
        end = self.num_chunks - (self.held_out_batches - 1 - index) * self.global_batch_size
        return self._chunk_tokens(self._permutation(0)[end - self.global_batch_size:end])


def vocabulary_from_config(config: ml_collections.ConfigDict) -> Vocabulary:
    """The vocabulary a run of `config` uses (pre-training and fine-tuning alike).

    `config.data.vocab` is a SentencePiece `.model` path, or '' to train one on
    `config.data.corpus` (at most `VOCAB_MAX_DOCUMENTS` of its documents, see
    `vocabulary_sample`) with `config.model.vocab_size` ids (cached under
    `config.data.data_dir`, default `builders.default_data_dir()`). With several hosts, share
    that directory (or a `.model` path) so all hosts use the same vocabulary.
    """
    data_dir = config.data.data_dir or default_data_dir()
    if config.data.vocab:
        try:
            vocab = load_vocabulary(config.data.vocab, config.model.num_sentinels)
        except FileNotFoundError:
            raise ConfigError(f"data.vocab={config.data.vocab!r} is not a file: give a "
                              "SentencePiece .model path, or '' to train one on data.corpus"
                              ) from None
        except RuntimeError:  # SentencePiece's, from C++: "[model_proto->ParseFromArray(...)]"
            raise ConfigError(f"data.vocab={config.data.vocab!r} is not a SentencePiece model "
                              "file: give a .model path, or '' to train one on data.corpus"
                              ) from None
    else:
        records = load_split(_corpus_source(config), "train", data_dir)
        texts = _texts(vocabulary_sample(records))
        try:
            vocab = train_vocabulary(texts, config.model.vocab_size, config.model.num_sentinels,
                                     cache_dir=os.path.join(data_dir, "vocab"))
        except ValueError as error:  # e.g. more ids than the corpus has pieces for
            raise ConfigError(f"model.vocab_size={config.model.vocab_size} on data.corpus="
                              f"{config.data.corpus!r}: {error}; or give data.vocab (a "
                              "SentencePiece .model, e.g. T5's public 32,000-piece one for "
                              "the paper preset)") from None
    if vocab.vocab_size != config.model.vocab_size:
        raise ConfigError(f"model.vocab_size={config.model.vocab_size} but the vocabulary "
                          f"data.vocab={config.data.vocab!r} has {vocab.vocab_size} ids")
    return vocab


def layout_with_vocabulary(layout: Any, config: ml_collections.ConfigDict) -> Any:
    """`layout` (an `objectives.BatchLayout`) reading sentences off the vocabulary of `config`
    (`vocabulary_from_config`) if it runs a sentence objective, else `layout` itself (the
    vocabulary is then not even loaded)."""
    return layout.with_sentences(vocabulary_from_config(config)) if layout.reads_sentences \
        else layout


def vocabulary_sample(records: Sequence[Any]) -> Sequence[Any]:
    """The documents a vocabulary is trained on: all of them, or `VOCAB_MAX_DOCUMENTS` evenly
    spaced ones (every k-th, from the first), so each part of the corpus is represented."""
    stride = -(-len(records) // VOCAB_MAX_DOCUMENTS)  # ceil
    if stride <= 1:
        return records
    return [records[i] for i in range(0, len(records), stride)]


def _corpus_source(config: ml_collections.ConfigDict) -> Any:
    """The source spec of `config.data.corpus`; a `ConfigError` naming the field (and the
    data root it was derived from) if there is no such corpus, checked before any work."""
    corpus, root = config.data.corpus, config.data.data_root
    source = as_source(corpus)
    if isinstance(source, TextFiles):
        try:
            source.split_files()
        except FileNotFoundError:
            under = (f": the pre-training text under data.data_root={root!r} is missing"
                     if root and corpus.startswith(root) else "")
            raise ConfigError(f"data.corpus={corpus!r} matches no file{under}") from None
    elif isinstance(source, str) and not is_catalog_name(source):
        raise ConfigError(
            f"data.corpus={corpus!r} is not 'python_docs', an existing file or glob "
            "of .txt/.jsonl files, or a TFDS catalog name prepared in data.data_dir")
    return source


def describe_corpus(config: ml_collections.ConfigDict) -> str:
    """What a run pre-trains on, for its first log line: the corpus with its file count and
    size, the built-in python_docs, or a catalog name. Raises `ConfigError` like the
    pipeline would if the corpus is missing, so a run calling it first stops before any work."""
    source = _corpus_source(config)
    if isinstance(source, PythonDocs):
        return "python_docs (the built-in corpus of Python documentation)"
    if isinstance(source, TextFiles):
        paths = source.split_files()["train"]
        size = sum(os.path.getsize(p) for p in paths)
        return f"{config.data.corpus} ({len(paths)} files, {size / 1e6:.1f} MB)"
    return f"{source} (TFDS catalog, from data.data_dir)"


def pretrain_data_from_config(
    config: ml_collections.ConfigDict,
    raw_length: int,
    process_index: int = 0,
    process_count: int = 1,
) -> tuple[Vocabulary, PretrainData]:
    """The vocabulary (`vocabulary_from_config`) and pre-training batches the config asks for.

    `config.data.corpus` is 'python_docs', a glob of text files or a TFDS catalog name (read
    from `config.data.data_dir`, where it must be prepared). An objective read within documents
    gets its documents' segments of its own raw length (`segment_length`).
    """
    data_dir = config.data.data_dir or default_data_dir()
    source = _corpus_source(config)
    vocab = vocabulary_from_config(config)
    held_out = config.train.eval_batches if config.train.eval_every else 0
    data = PretrainData(source, vocab, raw_length, config.train.batch_size, config.train.seed,
                        process_index, process_count, cache_dir=os.path.join(data_dir, "tokens"),
                        data_dir=data_dir, held_out_batches=held_out,
                        segment_length=segment_length(config))
    return vocab, data


def segment_length(config: ml_collections.ConfigDict) -> int | None:
    """The document segments' length of the config's objective (its raw length), or None for
    an objective that reads the stream's chunks (`Objective.within_document`)."""
    from t5x_lite import objective_registry  # the registry imports JAX, the data path does not

    objective = objective_registry.get(config.objective.name)
    return objective.lengths(config.objective)[0] if objective.within_document else None


def seconds_per_batch(data: PretrainData, num_batches: int = 200) -> float:
    """Mean wall time of `data.batch` over `num_batches` fresh steps (for the benchmark)."""
    data.batch(0)  # first touch of the memory map and the permutation
    start = time.perf_counter()
    for step in range(1, num_batches + 1):
        data.batch(step)
    return (time.perf_counter() - start) / num_batches


# ----------------------------------------------------------------------------- downstream


def encode_examples(vocab: Vocabulary, pairs: Iterable[tuple[str, str]]) -> list[Example]:
    """(inputs text, targets text) pairs as id lists, each ending in EOS as in T5."""
    pairs = list(pairs)
    inputs = vocab.encode_batch([p[0] for p in pairs])
    targets = vocab.encode_batch([p[1] for p in pairs])
    return [(i + [EOS_ID], t + [EOS_ID]) for i, t in zip(inputs, targets)]


def _truncate(ids: Sequence[int], length: int) -> tuple[list[int], bool]:
    """At most `length` ids; a cut sequence keeps its final EOS so the model still stops."""
    ids = list(ids)
    if len(ids) <= length:
        return ids, False
    return ids[: length - 1] + ids[-1:], True


def truncate_examples(examples: Sequence[Example], inputs_length: int,
                      targets_length: int) -> tuple[list[Example], int]:
    """Examples cut to at most `inputs_length` input and `targets_length` target ids (each
    keeping its final EOS), and how many were cut. The batchers do this too, warning per
    call; truncate once up front to count a whole data set."""
    out, truncated = [], 0
    for inputs, targets in examples:
        inputs, cut_i = _truncate(inputs, inputs_length)
        targets, cut_t = _truncate(targets, targets_length)
        truncated += cut_i or cut_t
        out.append((inputs, targets))
    return out, truncated


def _rows(examples: Sequence[Example], inputs_length: int, targets_length: int,
          family: str, pack: bool) -> list[list[Example]]:
    """Examples grouped into rows: one each, or greedily in order while every stack's part of
    the row still has room (decoder-only: any split of the total length between the parts)."""
    examples, truncated = truncate_examples(examples, inputs_length, targets_length)
    capacity = batch_format.row_lengths(family, inputs_length, targets_length)
    rows = []
    used = dict.fromkeys(capacity, 0)
    for inputs, targets in examples:
        needs = batch_format.row_lengths(family, len(inputs), len(targets))
        if pack and rows and all(used[s] + needs[s] <= capacity[s] for s in capacity):
            rows[-1].append((inputs, targets))
            used = {s: used[s] + needs[s] for s in capacity}
        else:
            rows.append([(inputs, targets)])
            used = needs
    if truncated:
        log.warning("truncated %d of %d examples to inputs_length=%d, targets_length=%d",
                    truncated, len(examples), inputs_length, targets_length)
    return rows


def _example_rows(examples: list[Example], family: str, inputs_length: int,
                  targets_length: int, mask_token: int | None) -> dict[str, np.ndarray]:
    """`batch_format.example_rows` of (already truncated) examples, built in one call."""
    inputs = np.zeros([len(examples), inputs_length], np.int32)
    targets = np.zeros([len(examples), targets_length], np.int32)
    for i, (x, y) in enumerate(examples):
        inputs[i, :len(x)], targets[i, :len(y)] = x, y
    return batch_format.example_rows(family, np, inputs, targets, inputs_length, targets_length,
                                     mask_token=mask_token)


def _layout(rows: list[list[Example]], inputs_length: int, targets_length: int, family: str,
            pack: bool, mask_token: int | None) -> dict[str, np.ndarray]:
    """Rows (the empty ones last: padding) -> the batch dict of `family`'s format.

    Unpacked, a row is its example's row at the batch's lengths, as pre-training builds it.
    Packed, it holds its examples' own rows (each one's first `row_lengths` positions of every
    stack) one after the other, with segment ids (1, 2, ... in a row) and positions restarting
    at 0 per example."""
    out = batch_format.zeros(family, len(rows), inputs_length, targets_length)
    examples = [example for row in rows for example in row]
    if not pack:
        for key, value in _example_rows(examples, family, inputs_length, targets_length,
                                        mask_token).items():
            out[key][:len(value)] = value
        return out
    input_lengths = np.array([len(x) for x, _ in examples], np.int64)
    target_lengths = np.array([len(y) for _, y in examples], np.int64)
    # As wide as the longest example needs: an example's own rows do not depend on the width.
    built = _example_rows(examples, family, input_lengths.max(initial=0),
                          target_lengths.max(initial=0), mask_token)
    row_sizes = [len(row) for row in rows]
    row_of = np.repeat(np.arange(len(rows)), row_sizes)  # [examples]
    first_of_row = np.cumsum([0] + row_sizes)[:-1][row_of]  # [examples]: its row's first one
    segment = np.arange(len(examples)) - first_of_row + 1
    own_sizes = batch_format.row_lengths(family, input_lengths, target_lengths)
    for stack, length in batch_format.row_lengths(family, inputs_length, targets_length).items():
        size = own_sizes[stack]
        before = np.cumsum(size) - size  # the sizes of the batch's examples before each one
        start = before - before[first_of_row]  # ... of its row's
        offset = np.arange(size.max(initial=0))
        own = offset < size[:, None]  # [examples, offset]: the example's own positions
        to_row = np.broadcast_to(row_of[:, None], own.shape)[own]
        to_column = (start[:, None] + offset)[own]
        for key, value in built.items():
            if batch_format.stack_of(key) == stack:
                out[key][to_row, to_column] = value[:, :own.shape[1]][own]
        for key, value in (("segment_ids", segment[:, None]), ("positions", offset)):
            out[f"{stack}_{key}"] = np.zeros([len(rows), length], np.int32)
            out[f"{stack}_{key}"][to_row, to_column] = np.broadcast_to(value, own.shape)[own]
    return out


def _batches(examples: Sequence[Example], batch_size: int, inputs_length: int,
             targets_length: int, family: str, pack: bool,
             mask_token: int | None = None) -> list[dict[str, np.ndarray]]:
    pack = pack and batch_format.packable(family)
    if batch_size <= 0 or inputs_length <= 0 or targets_length <= 0:
        raise ValueError(f"batch_size={batch_size}, inputs_length={inputs_length} and "
                         f"targets_length={targets_length} must be positive")
    rows = _rows(examples, inputs_length, targets_length, family, pack)
    rows += [[] for _ in range(-len(rows) % batch_size)]  # empty rows fill the last batch
    return [_layout(rows[start:start + batch_size], inputs_length, targets_length, family, pack,
                    mask_token) for start in range(0, len(rows), batch_size)]


def pack_examples(examples: Sequence[Example], batch_size: int, inputs_length: int,
                  targets_length: int, family: str = "encoder_decoder",
                  mask_token: int | None = None) -> list[dict[str, np.ndarray]]:
    """Packed batches of `family`'s rows (`t5x_lite.batch_format`): consecutive examples share
    a row while they fit.

    Encoder-decoder rows hold `inputs_length` encoder and `targets_length` decoder tokens;
    decoder-only rows hold inputs followed by targets in `inputs_length + targets_length`
    tokens, loss only on targets, `inputs_mask` marking each prefix. Every batch has
    `{encoder,decoder}_segment_ids` (1, 2, ... in a row, 0 = padding) and `_positions`
    (restarting at 0 per example), shape `[batch_size, length]`; the last batch is filled with
    empty rows. Longer examples are truncated (keeping EOS last) with a warning.

    `encoder_only` rows hold the inputs, then `targets_length` mask slots (`mask_token`,
    needed for that family), one example each: that family is not `batch_format.packable`,
    so packing it pads.
    """
    return _batches(examples, batch_size, inputs_length, targets_length, family, True,
                    mask_token)


def pad_examples(examples: Sequence[Example], batch_size: int, inputs_length: int,
                 targets_length: int, family: str = "encoder_decoder",
                 mask_token: int | None = None) -> list[dict[str, np.ndarray]]:
    """Like `pack_examples` with one example per row and no segment ids or positions."""
    return _batches(examples, batch_size, inputs_length, targets_length, family, False,
                    mask_token)


def process_rows(batch: dict[str, np.ndarray], process_index: int,
                 process_count: int) -> dict[str, np.ndarray]:
    """Process `process_index`'s contiguous share of a global batch's rows, as the train and
    eval steps take it: `[B, ...]` -> rows p * B / P to (p + 1) * B / P of every array."""
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} must be in [0, {process_count})")
    rows = {len(value) for value in batch.values()}
    if len(rows) != 1 or next(iter(rows)) % process_count:
        raise ValueError(f"the batch's arrays have {sorted(rows)} rows; process_rows needs one "
                         f"row count divisible by process_count={process_count}")
    share = next(iter(rows)) // process_count
    return {name: value[process_index * share:(process_index + 1) * share]
            for name, value in batch.items()}


class MixtureData:
    """Fine-tuning batches from one task or an examples-proportional mixture of several.

    `tasks` holds each task's encoded training examples (already truncated). As in the T5
    paper, task t is sampled in proportion to r_t = min(len(examples_t), mixing_limit) (the
    rate limit K). The stream is laid out in mixture epochs of sum(r_t) slots: epoch e takes
    the next r_t examples of each task's own stream (a fresh seeded permutation per pass over
    the task) and shuffles the slots with a seeded permutation. `batch(step)` reads
    `examples_per_step` consecutive slots, so it depends only on (seed, step).

    Unpacked, a step holds `batch_size` examples. Packed, it takes as many as fit on average
    (from the mean example length) and packs them into `batch_size` rows; examples that do
    not fit are left out of this step.

    With several processes, every one builds the same global batch and `batch(step)` returns
    process `process_index`'s contiguous `batch_size // process_count` rows of it
    (`process_rows`), so P processes train on exactly the batches of one.
    """

    def __init__(self, tasks: Sequence[Sequence[Example]], mixing_limit: int, batch_size: int,
                 inputs_length: int, targets_length: int, *, family: str, pack: bool,
                 seed: int, process_index: int = 0, process_count: int = 1,
                 mask_token: int | None = None):
        if not tasks or any(len(examples) == 0 for examples in tasks):
            raise ValueError("every task of the mixture needs at least one training example")
        if not 0 <= process_index < process_count:
            raise ValueError(f"process_index={process_index} must be in [0, {process_count})")
        if batch_size <= 0 or batch_size % process_count:
            raise ValueError(f"batch_size={batch_size} must be a positive multiple of "
                             f"process_count={process_count}")
        self.process_index, self.process_count = process_index, process_count
        self.tasks = [list(examples) for examples in tasks]
        self.rates = np.array([min(len(ex), mixing_limit) for ex in self.tasks], np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.rates)])
        self.batch_size, self.seed = batch_size, seed
        self.lengths = (inputs_length, targets_length)
        self.family, self.mask_token = family, mask_token
        self.pack = pack and batch_format.packable(family)
        self.examples_per_step = batch_size * (self._examples_per_row() if self.pack else 1)
        self._permutations: dict[tuple[int, int], np.ndarray] = {}

    def _examples_per_row(self) -> int:
        """How many examples of mean length fill a row (at least one)."""
        pairs = [(len(i), len(t)) for examples in self.tasks for i, t in examples]
        mean = batch_format.row_lengths(self.family, *np.mean(pairs, axis=0))
        capacity = batch_format.row_lengths(self.family, *self.lengths)
        return max(1, int(min(capacity[stack] // mean[stack] for stack in capacity)))

    def _permutation(self, stream: int, epoch: int, size: int) -> np.ndarray:
        """Seeded permutation of `size` items for (stream, epoch); stream -1 is the mixture."""
        key = (stream, epoch)
        if key not in self._permutations:
            if len(self._permutations) > 4 * (len(self.tasks) + 1):  # a batch spans few epochs
                self._permutations.clear()
            rng = np.random.default_rng([self.seed, stream + 1, epoch])
            self._permutations[key] = rng.permutation(size)
        return self._permutations[key]

    def example(self, position: int) -> Example:
        """The example at `position` of the mixture stream."""
        epoch, offset = divmod(position, int(self.starts[-1]))
        slot = int(self._permutation(-1, epoch, int(self.starts[-1]))[offset])
        task = int(np.searchsorted(self.starts, slot, side="right")) - 1
        task_position = epoch * int(self.rates[task]) + slot - int(self.starts[task])
        size = len(self.tasks[task])
        task_epoch, index = divmod(task_position, size)
        return self.tasks[task][int(self._permutation(task, task_epoch, size)[index])]

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """This process's rows of the global batch of `step`: the t5x/seqio keys,
        [batch_size // process_count, length] each."""
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        first = step * self.examples_per_step
        examples = [self.example(p) for p in range(first, first + self.examples_per_step)]
        # Packed, any rows beyond batch_size are dropped: their examples come round again in
        # the next epoch, in a new order.
        batch = _batches(examples, self.batch_size, *self.lengths, self.family, self.pack,
                         self.mask_token)[0]
        return process_rows(batch, self.process_index, self.process_count)
