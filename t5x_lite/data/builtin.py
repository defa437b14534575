"""Records of the built-in downstream tasks, generated from the built-in python_docs corpus.

They let the whole pipeline (pre-train -> fine-tune -> evaluate -> report) run with nothing but
this interpreter: no network, no ../shared/data. Both generators read the python_docs build
(`builders.load_split('python_docs', ...)`, seconds to make the first time), cut it into unique
paragraphs (the corpus repeats some docstrings, e.g. in every `encodings` codec) and derive
records from them with a fixed seed, so a given interpreter and numpy always give the same
records. The tasks in `tasks.TASKS` that use them:

  builtin_reverse  "reverse: w1 .. wn" -> "wn .. w1"        word_sequences
  builtin_sort     "sort: w1 .. wn" -> the words sorted       word_sequences
  builtin_module   "module sentence: <docs sentence>" -> which of MODULE_CLASSES documents it

Train and validation never share an input: a record's split is a function of its text
(`split_of`), not of where it was drawn, so the two are disjoint by construction.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import itertools
import re
import string

import numpy as np

from t5x_lite.data import builders

SEED = 0
VALIDATION_SHARE = 5  # one text in VALIDATION_SHARE goes to validation
SPLITS = ("train", "validation")

# Word sequences: how many records per split, the range of their lengths in words, and how
# many of the corpus' most frequent words they are made of. A tiny model learns to reverse
# these within the demo's few hundred fine-tuning steps; on sequences of 3-8 words from the
# whole vocabulary (about 7,700 words) every demo row stayed at 0-1% exact match.
WORD_SEQUENCE_SIZES = {"train": 8192, "validation": 256}
MIN_WORDS, MAX_WORDS = 2, 6
WORD_VOCABULARY_SIZE = 128

# The four packages with the most usable docs sentences in CPython 3.11 (250 - 400 each); their
# names are also the label words. The classes are balanced, so chance accuracy is 25%.
MODULE_CLASSES = ("asyncio", "email", "logging", "xml")
MIN_SENTENCE_WORDS, MAX_SENTENCE_WORDS = 6, 30
MIN_SENTENCES_PER_CLASS = 20  # per split; fewer means the corpus is not the one expected

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
# gather_python_docs writes "Name: docstring" / "Class.method: docstring"; the name is not prose.
_DOC_NAME_PREFIX = re.compile(r"^[\w.]+: ")
_CODE_CHARACTERS = set("<>{}[]=_|\\`")


def split_of(text: str) -> str:
    """'validation' for one text in VALIDATION_SHARE (by a hash of the text), else 'train'."""
    digest = int(hashlib.sha256(text.encode()).hexdigest(), 16)
    return "validation" if digest % VALIDATION_SHARE == 0 else "train"


@functools.lru_cache(maxsize=4)
def _paragraphs(data_dir: str | None) -> tuple[tuple[str, str], ...]:
    """(top-level module or pydoc topic, paragraph) for every distinct paragraph, corpus order."""
    seen: dict[str, str] = {}
    for split in ("train", "validation"):  # the corpus' own splits; ours are made by split_of
        for record in builders.load_split("python_docs", split, data_dir):
            name, _, body = record["text"].partition("\n\n")
            for paragraph in body.split("\n\n"):
                paragraph = " ".join(paragraph.split())
                if paragraph:
                    seen.setdefault(paragraph, name.split(".")[0])
    return tuple((module, paragraph) for paragraph, module in seen.items())


def _words(paragraph: str) -> list[str]:
    """The paragraph's lower-cased words made only of ASCII letters, in order (others dropped)."""
    tokens = (token.strip(string.punctuation) for token in paragraph.lower().split())
    return [t for t in tokens if t.isascii() and t.isalpha()]


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"built-in tasks have no split {split!r}; choose one of "
                         f"{', '.join(SPLITS)}")


def word_vocabulary(data_dir: str | None) -> tuple[str, ...]:
    """The WORD_VOCABULARY_SIZE most frequent `_words` of the corpus, most frequent first (ties
    in the order the corpus first uses them)."""
    counts = collections.Counter(word for _, paragraph in _paragraphs(data_dir)
                                 for word in _words(paragraph))
    return tuple(word for word, _ in counts.most_common(WORD_VOCABULARY_SIZE))


def _windows(data_dir: str | None) -> dict[int, list[str]]:
    """Length -> every distinct run of that many consecutive corpus words that are all in
    `word_vocabulary`, in corpus order."""
    vocabulary = set(word_vocabulary(data_dir))
    windows: dict[int, dict[str, None]] = {n: {} for n in range(MIN_WORDS, MAX_WORDS + 1)}
    for _, paragraph in _paragraphs(data_dir):
        words = _words(paragraph)
        # The maximal runs of vocabulary words; every window lies inside one.
        for known, run in itertools.groupby(words, key=vocabulary.__contains__):
            run = list(run)
            if known:
                for n, texts in windows.items():
                    for start in range(len(run) - n + 1):
                        texts.setdefault(" ".join(run[start:start + n]), None)
    return {n: list(texts) for n, texts in windows.items()}


@functools.lru_cache(maxsize=4)
def _word_sequences(data_dir: str | None) -> dict[str, tuple[str, ...]]:
    """Split -> its distinct word sequences, drawn with SEED until each split is full."""
    windows = _windows(data_dir)
    rng = np.random.default_rng(SEED)
    chosen: dict[str, dict[str, None]] = {split: {} for split in SPLITS}  # ordered sets
    max_draws = 20 * sum(WORD_SEQUENCE_SIZES.values())
    for draw in itertools.count():
        if all(len(chosen[s]) == WORD_SEQUENCE_SIZES[s] for s in SPLITS):
            break
        if draw == max_draws:
            found = ", ".join(f"{len(texts)} {split}" for split, texts in chosen.items())
            raise RuntimeError(f"python_docs gave only {found} distinct word sequences in "
                               f"{max_draws} draws; wanted {WORD_SEQUENCE_SIZES}")
        # Every length is equally likely, and so is every distinct sequence of that length.
        texts = windows[int(rng.integers(MIN_WORDS, MAX_WORDS + 1))]
        text = texts[int(rng.integers(len(texts)))]
        split = split_of(text)
        if len(chosen[split]) < WORD_SEQUENCE_SIZES[split]:
            chosen[split][text] = None
    return {split: tuple(texts) for split, texts in chosen.items()}


def word_sequences(split: str, data_dir: str | None, data_root: str | None) -> list[dict]:
    """`{'words': 'w1 .. wn'}` records: n = MIN_WORDS..MAX_WORDS consecutive docs words, each
    one of the corpus' WORD_VOCABULARY_SIZE most frequent (`word_vocabulary`).

    Words are lower-cased and made of ASCII letters only (tokens with digits or symbols are
    skipped), so reversing or sorting them is unambiguous. WORD_SEQUENCE_SIZES records per split.
    """
    del data_root  # built from python_docs, which lives in data_dir
    _check_split(split)
    return [{"words": text} for text in _word_sequences(data_dir)[split]]


def _is_prose(sentence: str) -> bool:
    """A plain-English sentence of a sensible length that does not name any class."""
    words = sentence.split()
    return (MIN_SENTENCE_WORDS <= len(words) <= MAX_SENTENCE_WORDS
            and sentence[0].isupper() and sentence[-1] in ".!?"
            and not _CODE_CHARACTERS & set(sentence)
            # A sentence naming a class would give its label away.
            and not any(name in sentence.lower() for name in MODULE_CLASSES))


@functools.lru_cache(maxsize=4)
def _module_sentences(data_dir: str | None) -> dict[str, tuple[dict, ...]]:
    """Split -> its balanced, shuffled `module_sentences` records."""
    owners: dict[str, set[int]] = {}  # sentence -> the classes whose docs contain it
    for module, paragraph in _paragraphs(data_dir):
        if module in MODULE_CLASSES:
            for sentence in _SENTENCE_END.split(_DOC_NAME_PREFIX.sub("", paragraph)):
                if _is_prose(sentence):
                    owners.setdefault(sentence, set()).add(MODULE_CLASSES.index(module))
    rng = np.random.default_rng(SEED)
    records = {}
    for split in SPLITS:
        per_class = [[s for s, labels in owners.items() if labels == {label} and
                      split_of(s) == split] for label in range(len(MODULE_CLASSES))]
        size = min(len(sentences) for sentences in per_class)
        if size < MIN_SENTENCES_PER_CLASS:
            raise RuntimeError(
                f"python_docs has only {size} usable {split} sentences for one of the classes "
                f"{', '.join(MODULE_CLASSES)} (need {MIN_SENTENCES_PER_CLASS}); is this CPython's "
                "standard library?")
        # Balanced classes: a random `size` sentences of each, then one random order.
        balanced = [{"sentence": sentences[i], "label": label}
                    for label, sentences in enumerate(per_class)
                    for i in sorted(rng.permutation(len(sentences))[:size])]
        records[split] = tuple(balanced[i] for i in rng.permutation(len(balanced)))
    return records


def module_sentences(split: str, data_dir: str | None, data_root: str | None) -> list[dict]:
    """`{'sentence': str, 'label': int}` records, label = index into MODULE_CLASSES.

    Sentences come from the docstrings of each class's package (e.g. `email.message` counts as
    `email`); sentences found in two classes' docs, naming a class, or looking like code are
    left out. Every class has the same number of records in a split (a few hundred in train,
    about a quarter of that in validation, depending on the interpreter's standard library).
    """
    del data_root  # built from python_docs, which lives in data_dir
    _check_split(split)
    return [dict(record) for record in _module_sentences(data_dir)[split]]
