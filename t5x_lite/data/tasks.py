"""Downstream tasks in the text-to-text format of the T5 paper, and their registry.

A `Task` ties together where its records come from, how a record becomes an (inputs, targets)
text pair, how a decoded prediction becomes a value a metric can score, and which metrics it
reports. `get_task(name)` finds one; `task.examples(split, data_dir, data_root)` gives formatted
`Example`s and `task.score(examples, predictions)` the metrics on the paper's 0-100 scale.

Formatting follows the paper's appendix D and T5's preprocessors (`t5/data/preprocessors.py`:
`glue`, `stsb`, `squad`, `translate`, `summarize`), e.g.

    cola sentence: John made Bill master of himself.                  -> acceptable
    mnli hypothesis: ... premise: ...                                 -> contradiction
    stsb sentence1: ... sentence2: ...                                -> 3.8
    question: What does ... displace? context: Hyperbaric ...         -> carbon monoxide
    translate English to German: That is good.                        -> Das ist gut.
    summarize: <article>                                              -> <summary>

Records are those of the TFDS catalog (`glue/*`, `squad`, `cnn_dailymail`, `wmt*_translate/*`)
or of the local builders in `t5x_lite.data.builders`, which use the same field names.

The registry holds the paper's tasks, read from the TFDS catalog (`glue_cola` ... `glue_wnli`,
`squad`, `cnn_dailymail`, `wmt_ende`, `wmt_enfr`, `wmt_enro`), `local_*` tasks with the same
formats, read from the small real sets under a data root laid out as `../shared/data`, and
`builtin_*` tasks generated from the built-in python_docs corpus (`t5x_lite.data.builtin`),
which need no data at all:

    reverse: return the first value                                   -> value first the return
    sort: return the first value                                      -> first return the value
    module sentence: Push more data into the parser.                  -> email
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from t5x_lite import metrics
from t5x_lite.data import builders, builtin
from t5x_lite.errors import ConfigError

Record = Mapping[str, Any]
# (split name of the source, data_dir, data_root) -> records; see `Task.examples`.
Loader = Callable[[str, "str | None", "str | None"], Sequence[Record]]


@dataclasses.dataclass(frozen=True)
class Example:
    """One formatted example.

    inputs: the encoder (or prefix) text.
    targets: the text the model is trained to produce; None for an unlabeled (test) record.
    references: every acceptable target, for metrics that score against several (SQuAD, BLEU);
      `(targets,)` for single-answer tasks and `()` when unlabeled.
    """

    inputs: str
    targets: str | None
    references: tuple[str, ...]


def _labeled(inputs: str, targets: str | None) -> Example:
    return Example(inputs, targets, () if targets is None else (targets,))


# ---------------------------------------------------------------------------------------------
# Formatters: record -> Example.


def _join_fields(prefix: str, record: Record, keys: Sequence[str]) -> str:
    # T5 joins "<benchmark>", "key:", text, ... with single spaces and leaves the text as is.
    return " ".join([prefix, *(f"{key}: {record[key]}" for key in keys)])


def format_glue(
    record: Record, *, benchmark: str, keys: Sequence[str], label_names: Sequence[str]
) -> Example:
    """A GLUE classification record -> "<benchmark> key1: text1 key2: text2", target = label word.

    `label` is the class index (TFDS); -1 marks an unlabeled test record, which gets no target
    (T5 writes "<unk>" there; we keep None so it can never be trained on by mistake).
    """
    label = int(record["label"])
    target = None if label == -1 else label_names[label]
    return _labeled(_join_fields(benchmark, record, keys), target)


def format_stsb(record: Record) -> Example:
    """STS-B: the 0-5 similarity score rounded to the nearest 0.2 and written with one decimal
    ("3.8"), turning regression into 26-way generation (T5's `stsb`). As T5 computes it on
    TFDS's float32 label: x5, rounded half to even (`tf.round`) and /5, all in float32. (In
    float64, a float32 label's error decides the ties: float32 3.7 -> 18.5000002 -> "3.8",
    where T5 writes "3.6".) A negative score marks an unlabeled test record."""
    score = np.float32(record["label"])
    target = None if score < 0 else f"{np.round(score * np.float32(5)) / np.float32(5):.1f}"
    return _labeled(_join_fields("stsb", record, ("sentence1", "sentence2")), target)


def format_squad(record: Record) -> Example:
    """SQuAD -> "question: <q> context: <c>", target = the first gold answer.

    As in the paper's appendix D example, runs of whitespace (SQuAD contexts contain newlines)
    become one space and punctuation is left alone. T5's code differs: its `squad` preprocessor
    puts spaces around every non-word character (`\\W`, its first release) or, since 2022, every
    ASCII punctuation character (`[[:punct:]]`) of the question, the context and the answers
    (so its targets, and the gold answers it scores against, are padded too: "1,000" ->
    "1 , 000"); after SQuAD's normalisation that leaves exact match as it is and moves F1 by
    ~0.3 (the gold answers of SQuAD's dev set scored against each
    other: 92.51 here, 92.82 padded).
    """
    answers = tuple(record["answers"]["text"])
    inputs = " ".join(f"question: {record['question']} context: {record['context']}".split())
    return Example(inputs, answers[0] if answers else None, answers)


# The names T5 writes in the prefix (it asks babel for the English name of each code).
LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "ro": "Romanian"}


def format_translation(record: Record, *, source: str, target: str) -> Example:
    """Parallel text -> "translate <Source> to <Target>: <text>", target = the translation."""
    for code in (source, target):
        if code not in LANGUAGE_NAMES:
            raise ValueError(f"language code {code!r} has no name; known codes: "
                             f"{', '.join(LANGUAGE_NAMES)}")
    prefix = f"translate {LANGUAGE_NAMES[source]} to {LANGUAGE_NAMES[target]}:"
    return _labeled(f"{prefix} {record[source]}", record[target])


def format_summarization(
    record: Record, *, document_key: str = "document", summary_key: str = "summary"
) -> Example:
    """A document/summary pair -> "summarize: <document>", target = the summary."""
    return _labeled(f"summarize: {record[document_key]}", record[summary_key])


def format_word_task(
    record: Record, *, prefix: str, transform: Callable[[list[str]], list[str]]
) -> Example:
    """A `{'words': 'w1 .. wn'}` record -> "<prefix>: w1 .. wn", target = the transformed words."""
    return _labeled(f"{prefix}: {record['words']}", " ".join(transform(record["words"].split())))


def reverse_words(words: list[str]) -> list[str]:
    return words[::-1]


# ---------------------------------------------------------------------------------------------
# Post-processing: decoded text -> the value a metric compares.


def label_to_class_id(text: str, label_names: Sequence[str]) -> int:
    """The index of a label word, or -1 for text that is no label (metrics count it as wrong)."""
    return label_names.index(text) if text in label_names else -1


def string_to_float(text: str) -> float:
    """The number a prediction spells, or -1.0 when it spells none (as T5's `string_to_float`)."""
    try:
        return float(text)
    except ValueError:
        return -1.0


# ---------------------------------------------------------------------------------------------
# Tasks.


@dataclasses.dataclass(frozen=True)
class Task:
    """A downstream task.

    name: registry key.
    load: `(source_split, data_dir, data_root) -> records`.
    formatter: record -> `Example`.
    metric_names: names in `t5x_lite.metrics.METRICS`.
    splits: our split name ('train', 'validation', 'test') -> the source's split name.
    postprocess: decoded text (prediction or reference) -> the value its metrics compare.
    label_options: every target a classification task can have (its label words, in class
      order); () for a task whose targets are free text or numbers. Zero-shot scoring
      (`t5x_lite.zero_shot`) ranks these.
    targets_length: T5's fine-tuning targets length for the task (the paper's tasks: its
      code's `sequence_lengths` gin files, `T5_TARGETS_LENGTHS`), which
      `finetune.task_lengths` reads (`evaluation.with_task_lengths`); None: it has none.
    """

    name: str
    load: Loader
    formatter: Callable[[Record], Example]
    metric_names: tuple[str, ...]
    splits: Mapping[str, str]
    postprocess: Callable[[str], Any] = str
    label_options: tuple[str, ...] = ()
    targets_length: int | None = None

    def examples(
        self, split: str, data_dir: str | None = None, data_root: str | None = None
    ) -> list[Example]:
        """The formatted examples of `split`; unlabeled records are kept only for 'test'.

        data_dir: where TFDS datasets and local builds live (`builders.load_split`'s data_dir).
        data_root: the directory holding the input files of `local_*` tasks (`glue/`, `squad/`,
          `translation/`, `summarization/`, laid out as ../shared/data); unused by catalog tasks.
        """
        if split not in self.splits:
            raise ConfigError(f"task {self.name!r} has no split {split!r}; its splits: "
                              f"{', '.join(self.splits)}")
        records = self.load(self.splits[split], data_dir, data_root)
        examples = [self.formatter(record) for record in records]
        return examples if split == "test" else [ex for ex in examples if ex.targets is not None]

    def score(self, examples: Sequence[Example], predictions: Sequence[str]) -> dict[str, float]:
        """All of the task's metrics for decoded `predictions` of `examples`."""
        if any(ex.targets is None for ex in examples):
            raise ValueError(f"task {self.name!r}: cannot score unlabeled examples (targets=None)")
        values = [self.postprocess(p) for p in predictions]
        references = [[self.postprocess(r) for r in ex.references] for ex in examples]
        scores: dict[str, float] = {}
        for name in self.metric_names:
            metric = metrics.get_metric(name)
            targets = references if metric.multi_reference else [refs[0] for refs in references]
            scores.update(metric.fn(targets, values))
        return scores


# The GLUE benchmarks with labels to fine-tune on (all but the ax diagnostic), in the paper's
# order.
GLUE_BENCHMARKS = tuple(name for name, glue in builders.GLUE_TASKS.items() if glue.label_column)

# The metrics T5 reports for each GLUE benchmark.
_GLUE_METRICS = {
    "cola": ("matthews_corrcoef",), "sst2": ("accuracy",), "mrpc": ("f1", "accuracy"),
    "stsb": ("pearson_corrcoef", "spearman_corrcoef"), "qqp": ("f1", "accuracy"),
    "mnli": ("accuracy",), "qnli": ("accuracy",), "rte": ("accuracy",), "wnli": ("accuracy",),
}
_SPLITS = {"train": "train", "validation": "validation", "test": "test"}
_TRAIN_VALIDATION = {"train": "train", "validation": "validation"}


def _glue_task(
    name: str, benchmark: str, load: Loader, splits: Mapping[str, str] = _SPLITS
) -> Task:
    metric_names = _GLUE_METRICS[benchmark]
    if benchmark == "stsb":
        return Task(name, load, format_stsb, metric_names, splits, string_to_float)
    # As T5's `glue` preprocessor (from `glue_utils`): the record's text fields in sorted order
    # (so MNLI puts the hypothesis first) and the label words of the TFDS `glue` configs, in
    # their order (WNLI's classes are the other way round from RTE's).
    glue = builders.GLUE_TASKS[benchmark]
    keys, labels = tuple(sorted(glue.fields)), glue.classes
    formatter = functools.partial(format_glue, benchmark=benchmark, keys=keys, label_names=labels)
    postprocess = functools.partial(label_to_class_id, label_names=labels)
    return Task(name, load, formatter, metric_names, splits, postprocess, labels)


def _translation_task(name: str, load: Loader, target: str) -> Task:
    formatter = functools.partial(format_translation, source="en", target=target)
    return Task(name, load, formatter, ("bleu",), _SPLITS)


def _catalog(tfds_name: str) -> Loader:
    """Reads TFDS catalog dataset `tfds_name` from data_dir (which must already hold it)."""

    def load(split: str, data_dir: str | None, data_root: str | None) -> Sequence[Record]:
        del data_root  # catalog datasets live in data_dir
        return builders.load_split(tfds_name, split, data_dir)

    return load


# T5's fine-tuning targets lengths for the paper's tasks, with inputs of 512 for every one
# (its first release's t5/models/gin/sequence_lengths/: glue_v002_proportional.gin 84,
# squad_v010_allanswers.gin 97, cnn_dailymail_v002.gin and the three WMT tasks' 512), by the
# start of our task names: the `Task.targets_length` of each.
T5_TARGETS_LENGTHS = {"glue_": 84, "squad": 97, "cnn_dailymail": 512, "wmt_": 512}


def _with_t5_length(task: Task) -> Task:
    """`task` with its T5 targets length (`T5_TARGETS_LENGTHS`)."""
    length = next(length for start, length in T5_TARGETS_LENGTHS.items()
                  if task.name.startswith(start))
    return dataclasses.replace(task, targets_length=length)


def _paper_tasks() -> list[Task]:
    mnli = _catalog("glue/mnli")
    return [
        *(_glue_task(f"glue_{b}", b, _catalog(f"glue/{b}")) for b in GLUE_BENCHMARKS
          if b != "mnli"),
        # Fine-tune on glue_mnli; matched and mismatched validation accuracy are reported apart.
        _glue_task("glue_mnli", "mnli", mnli,
                   {"train": "train", "validation": "validation_matched"}),
        _glue_task("glue_mnli_matched", "mnli", mnli, {"validation": "validation_matched"}),
        _glue_task("glue_mnli_mismatched", "mnli", mnli, {"validation": "validation_mismatched"}),
        Task("squad", _catalog("squad"), format_squad, ("squad",), _TRAIN_VALIDATION),
        Task(
            "cnn_dailymail",
            _catalog("cnn_dailymail"),
            functools.partial(format_summarization, document_key="article",
                              summary_key="highlights"),
            ("rouge",),
            _SPLITS,
        ),
        # The paper's English-German data (section 2.3: "the same training data as (Vaswani
        # et al., 2017) (i.e. News Commentary v13, Common Crawl, Europarl v7) and newstest2013
        # as a validation set"): T5's wmt_t2t_ende task. wmt14_translate's has News Commentary v9.
        _translation_task("wmt_ende", _catalog("wmt_t2t_translate/de-en"), "de"),
        _translation_task("wmt_enfr", _catalog("wmt15_translate/fr-en"), "fr"),
        _translation_task("wmt_enro", _catalog("wmt16_translate/ro-en"), "ro"),
    ]


# The tasks whose loader is `_local`'s: they read files under data.data_root.
LOCAL_TASK_PREFIX = "local_"
_NO_DATA_ROOT = (f"{LOCAL_TASK_PREFIX}* tasks read their files under data.data_root, which is "
                 "not set: --config.data.data_root=DIR (e.g. ../shared/data)")


def _local(make_source: Callable[[str], Any]) -> Loader:
    """Reads the `builders` source spec `make_source(data_root)`, built under data_dir."""

    def load(split: str, data_dir: str | None, data_root: str | None) -> Sequence[Record]:
        if not data_root:
            raise ConfigError(_NO_DATA_ROOT)
        if not os.path.isdir(os.path.expanduser(data_root)):  # else named by a builder's field
            raise ConfigError(f"data.data_root={data_root!r} is not a directory (the local "
                              "tasks read their files under it, e.g. ../shared/data)")
        return builders.load_split(make_source(data_root), split, data_dir)

    return load


def require_data_root(names: Sequence[str], data_root: str | None, field: str) -> None:
    """A one-line `ConfigError` naming `field` when a local task among `names` has no
    data.data_root to read its files from (checked before a sweep starts, or a dry run)."""
    local = [name for name in names if name.startswith(LOCAL_TASK_PREFIX)]
    if local and not data_root:
        raise ConfigError(f"{field} has {local[0]!r}: {_NO_DATA_ROOT}")


# Local GLUE directories; the local data has no MNLI or QQP, and QNLI has no train split.
_LOCAL_GLUE_DIRS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B",
                    "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
# The local data has SQuAD's dev set only (48 articles), so it is split by article: the last 10
# for validation, the first 38 for training, and no paragraph lands in both.
_SQUAD_VALIDATION_ARTICLES = 10
_squad_dev = _local(lambda root: builders.SquadJson(
    {"validation": os.path.join(root, "squad", "dev-v1.1.json")}))


def _squad_dev_by_article(split: str, data_dir: str | None, data_root: str | None) -> list[Record]:
    records = list(_squad_dev("validation", data_dir, data_root))
    titles = list(dict.fromkeys(record["title"] for record in records))  # in file order
    held_out = set(titles[-_SQUAD_VALIDATION_ARTICLES:])
    return [r for r in records if (r["title"] in held_out) == (split == "validation")]


def _parallel_text(directory: str, target: str, stems: Mapping[str, str]) -> Loader:
    """English -> `target` line-aligned files `<stem>.en` / `<stem>.<target>`."""

    def make_source(root: str) -> builders.ParallelText:
        base = os.path.join(root, "translation", directory)
        files = {split: (os.path.join(base, f"{stem}.en"), os.path.join(base, f"{stem}.{target}"))
                 for split, stem in stems.items()}
        return builders.ParallelText(("en", target), files)

    return _local(make_source)


def _train_without_held_out_sources(loader: Loader, source: str,
                                    held_out: Sequence[str]) -> Loader:
    """`loader` whose train split leaves out every pair whose `source` text is also a source in
    one of the `held_out` splits. RO-STS translates the STS-B sentences, which STS-B reuses
    across its pairs and splits: 306 of its 3,000 validation sentences (96 with the same
    translation) and 141 of its test pairs were in train too, and memorised pairs raised every
    row's BLEU and narrowed their differences."""

    def load(split: str, data_dir: str | None, data_root: str | None) -> Sequence[Record]:
        records = loader(split, data_dir, data_root)
        if split != "train":
            return records
        seen = {record[source] for name in held_out
                for record in loader(name, data_dir, data_root)}
        return [record for record in records if record[source] not in seen]

    return load


def _local_tasks() -> list[Task]:
    def glue_tsv(benchmark: str) -> Loader:
        return _local(lambda root: builders.GlueTsv(
            benchmark, os.path.join(root, "glue", _LOCAL_GLUE_DIRS[benchmark])))

    dialogsum = _local(lambda root: builders.SummarizationJsonl(
        {split: os.path.join(root, "summarization", "dialogsum", f"{stem}.jsonl")
         for split, stem in (("train", "train"), ("validation", "dev"))},
        document_field="dialogue"))
    multi30k = {"train": "train", "validation": "val", "test": "test_2016_flickr"}
    ro_sts = {"train": "train", "validation": "dev", "test": "test"}
    return [
        *(_glue_task(f"local_glue_{b}", b, glue_tsv(b)) for b in _LOCAL_GLUE_DIRS if b != "qnli"),
        _glue_task("local_glue_qnli", "qnli", glue_tsv("qnli"),
                   {"validation": "validation", "test": "test"}),
        Task("local_squad", _squad_dev_by_article, format_squad, ("squad",), _TRAIN_VALIDATION),
        _translation_task("local_multi30k_ende", _parallel_text("multi30k", "de", multi30k), "de"),
        _translation_task("local_multi30k_enfr", _parallel_text("multi30k", "fr", multi30k), "fr"),
        _translation_task("local_rosts_enro", _train_without_held_out_sources(
            _parallel_text("en-ro_ro-sts", "ro", ro_sts), "en", ("validation", "test")), "ro"),
        Task("local_dialogsum", dialogsum, format_summarization, ("rouge",), _TRAIN_VALIDATION),
    ]


def _builtin_tasks() -> list[Task]:
    # A whole-string `accuracy` is the exact match of the predicted word sequence, and
    # `position_accuracy` the share of its words in the right place: the graded score keeps
    # rows apart where few sequences come out exactly right.
    def word_task(name: str, prefix: str, transform: Callable[[list[str]], list[str]]) -> Task:
        formatter = functools.partial(format_word_task, prefix=prefix, transform=transform)
        return Task(name, builtin.word_sequences, formatter, ("accuracy", "position_accuracy"),
                    _TRAIN_VALIDATION)

    labels = builtin.MODULE_CLASSES
    return [
        word_task("builtin_reverse", "reverse", reverse_words),
        word_task("builtin_sort", "sort", sorted),
        Task("builtin_module", builtin.module_sentences,
             functools.partial(format_glue, benchmark="module", keys=("sentence",),
                               label_names=labels),
             ("accuracy",), _TRAIN_VALIDATION,
             functools.partial(label_to_class_id, label_names=labels), labels),
    ]


TASKS: dict[str, Task] = {
    task.name: task for task in [*map(_with_t5_length, _paper_tasks()), *_local_tasks(),
                                 *_builtin_tasks()]}


# The splits a task may name: sweeps and fine-tuning read "train" and "validation", `eval
# --split test` a labeled test split.
SPLITS = ("train", "validation", "test")


def register(task: Task) -> Task:
    """Add a task of one's own to `TASKS` (a config or experiment file calls it, as for an
    architecture or an objective; every process that reads its runs runs the file) and return
    it. A `ValueError` naming the task for a name already registered (its loader and
    formatter are code: a file that registers a task runs once per process), a name unusable
    in file names, an unknown metric, a split other than `SPLITS`, or repeated label options."""
    where = f"task {task.name!r}"
    if task.name in TASKS:
        raise ValueError(f"{where} is already registered; a file that registers a task runs once "
                         "per Python process (a notebook: restart its kernel to load it again)")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", task.name):
        raise ValueError(f"{where}: a name is letters, digits, _ . - (it names files)")
    unknown = [name for name in task.metric_names if name not in metrics.METRICS]
    if not task.metric_names or unknown:
        raise ValueError(f"{where}: metric_names must name some of {', '.join(metrics.METRICS)}"
                         + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
    if not task.splits or set(task.splits) - set(SPLITS):
        raise ValueError(f"{where}: splits maps some of {', '.join(SPLITS)} to the source's "
                         f"split names; got {dict(task.splits)}")
    if len(set(task.label_options)) != len(task.label_options):
        raise ValueError(f"{where}: label_options repeat: {task.label_options}")
    TASKS[task.name] = task
    return task


def get_tasks(names: Sequence[str], field: str | None = None) -> list[Task]:
    """The registered tasks called `names`; else a one-line `ConfigError` naming `field` (the
    config field or flag the names came from, if any), every unknown name and every known
    task."""
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        where = f"{field} has " if field else ""
        what = (f"task {unknown[0]!r}" if len(unknown) == 1
                else f"tasks {', '.join(map(repr, unknown))}")
        raise ConfigError(f"{where}unknown {what}; known tasks: {', '.join(sorted(TASKS))}")
    return [TASKS[name] for name in names]


def get_task(name: str, field: str | None = None) -> Task:
    """The registered task called `name` (`get_tasks`)."""
    return get_tasks([name], field)[0]


# ---------------------------------------------------------------------------------------------
# The GLUE average as the paper reports it.

# Task -> (group, part): the part of the paper's GLUE average its score is. As in T5's
# `eval_utils.compute_avg_glue`: tasks with two metrics (MRPC, STS-B, QQP) average them first,
# and MNLI averages its matched and mismatched validation accuracies. A sweep fine-tunes and
# validates `glue_mnli`, whose validation split is validation_matched: it is the matched part,
# as `glue_mnli_matched` is (the same split), so the two never count twice.
# WNLI is left out, as in T5 (its `glue_utils` trains on WSC/DPR instead of WNLI).
GLUE_AVERAGE_GROUPS: dict[str, tuple[str, str]] = {
    **{f"glue_{name}": (name, name)
       for name in ("cola", "sst2", "mrpc", "stsb", "qqp", "qnli", "rte")},
    "glue_mnli": ("mnli", "matched"),
    "glue_mnli_matched": ("mnli", "matched"),
    "glue_mnli_mismatched": ("mnli", "mismatched"),
}


def is_glue(task: str) -> bool:
    """Whether `task` is one of GLUE's (`glue_*`, or its `local_glue_*` stand-in)."""
    return task.removeprefix("local_").startswith("glue_")


def glue_part(task: str) -> tuple[str, str] | None:
    """`task`'s (group, part) of the GLUE average (`local_glue_*` as its namesake), or None."""
    return GLUE_AVERAGE_GROUPS.get(task.removeprefix("local_"))


def glue_part_name(part: tuple[str, str]) -> str:
    """A (group, part) of `GLUE_AVERAGE_GROUPS` as messages name it: the group's name
    ('qqp'), or 'mnli matched' / 'mnli mismatched' for MNLI's halves."""
    group, half = part
    return group if group == half else f"{group} {half}"


def missing_glue_parts(task_names: Iterable[str]) -> list[str]:
    """The parts of the paper's GLUE average that `task_names` lack, sorted, by
    `glue_part_name`."""
    present = {glue_part(task) for task in task_names}
    return sorted(map(glue_part_name, set(GLUE_AVERAGE_GROUPS.values()) - present))


def glue_average(scores: Mapping[str, Mapping[str, float]], allow_missing: bool = False) -> float:
    """The average GLUE score from `{task name: {metric: score}}` (0-100 scale).

    Each task's metrics (`Task.metric_names`; other values are left out) are averaged, then the
    parts of a group (MNLI matched and mismatched), then the groups. `local_glue_*` tasks stand in
    for their `glue_*` namesakes; tasks outside `GLUE_AVERAGE_GROUPS` (WNLI, non-GLUE tasks) are
    ignored; two tasks that are one part (`glue_mnli` and `glue_mnli_matched`) are refused. Every
    part must be present unless `allow_missing` (the local data lacks MNLI and QQP; a sweep of
    `glue_mnli` has MNLI's matched half only), and then the result is not the paper's number.
    """
    parts: dict[tuple[str, str], tuple[str, float]] = {}
    for task, task_scores in scores.items():
        part = glue_part(task)
        if part is None:
            continue
        # The task's own metrics only, as T5's `compute_avg_glue` reads them by name: any
        # other value a record holds (a loss) would be averaged in.
        names = TASKS[task].metric_names
        lacking = [name for name in names if name not in task_scores]
        if lacking:
            raise ValueError(f"glue_average: task {task!r} has no {', '.join(lacking)} score "
                             f"(its metrics: {', '.join(names)})")
        if part in parts:
            raise ValueError(f"glue_average: {parts[part][0]!r} and {task!r} are the same part "
                             f"of GLUE ({glue_part_name(part)}); give one of them")
        parts[part] = task, sum(task_scores[name] for name in names) / len(names)
    missing = missing_glue_parts(scores)
    if (missing and not allow_missing) or not parts:
        raise ValueError(f"glue_average: no scores for {', '.join(missing)}; "
                         "pass allow_missing=True to average the parts present")
    groups: dict[str, list[float]] = {}
    for (group, _), (_, mean) in parts.items():
        groups.setdefault(group, []).append(mean)
    return sum(sum(means) / len(means) for means in groups.values()) / len(groups)
