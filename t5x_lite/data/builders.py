"""TFDS builders for local corpora and downstream sets, and `load_split`, the one way to read them.

Every source is read as a random-access sequence of dict records (`load_split`). Local files
are turned into an ArrayRecord TFDS dataset once (`LocalFiles`, a `GeneratorBasedBuilder`) and
read back with `as_data_source()`; TFDS catalog names are read with `tfds.data_source` from a
`data_dir` that already holds them. No TensorFlow is needed for either path.

Record fields (text fields are `str`, as in the TFDS catalog):

  python_docs, text_files       {'text'}
  glue_tsv  cola, sst2          {'sentence', 'label', 'idx'}
            mrpc, stsb, rte, wnli  {'sentence1', 'sentence2', 'label', 'idx'}
            qqp                 {'question1', 'question2', 'label', 'idx'}
            mnli, ax            {'premise', 'hypothesis', 'label', 'idx'}
            qnli                {'question', 'sentence', 'label', 'idx'}
            `label` is an int class index in TFDS order (-1 = unlabeled test row); stsb's is a
            float score (-1.0 unlabeled).
  squad_json                    {'id', 'title', 'context', 'question',
                                 'answers': {'text': list[str], 'answer_start': list[int]}}
  parallel_text                 one key per language code, e.g. {'en', 'de'}
  summarization_jsonl           {'document', 'summary'}
  catalog names                 the catalog's own fields, e.g. cnn_dailymail {'article',
                                'highlights'}, c4 {'text', ...}, wmt*_translate {'de', 'en'}.

Local sources are described by small frozen dataclasses (`PythonDocs`, `TextFiles`, `GlueTsv`,
`SquadJson`, `ParallelText`, `SummarizationJsonl`). Each build lives under
`data_dir/local_files/<kind>-<hash>/`, where the hash covers the spec's options and every input
file's path, size and modification time, so an edited input never reuses a stale build.
Bad records (empty text, undecodable bytes, missing columns) are skipped and counted; one
warning per split summarises the counts.
"""
from __future__ import annotations

import collections
import contextlib
import csv
import dataclasses
import fcntl
import functools
import glob
import hashlib
import importlib
import io
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import tensorflow_datasets as tfds

from t5x_lite import compilation_cache
from t5x_lite.errors import ConfigError

log = logging.getLogger(__name__)

# A parsed line/row/file is either a record or the reason it was skipped.
Parsed = tuple[str, "dict[str, Any] | str"]

TEXT_UNITS = ("file", "line", "block")


# ----------------------------------------------------------------------------- local sources


def _file_fingerprint(paths: Sequence[str]) -> list[tuple[str, int, int]]:
    """(absolute path, size, mtime) of each file: changes whenever an input is edited."""
    return [(os.path.abspath(p), os.path.getsize(p), os.stat(p).st_mtime_ns) for p in paths]


def _expand(field: str, pattern: str) -> list[str]:
    """Sorted files matching `pattern`; an empty match is an error naming `field`."""
    paths = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True)
                   if os.path.isfile(p))
    if not paths:
        raise FileNotFoundError(f"{field}={pattern!r} matches no file")
    return paths


def _decode(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _read_text(path: str) -> str | None:
    """A whole file as UTF-8 text (BOM dropped), or None if it is not valid UTF-8."""
    with open(path, "rb") as f:
        text = _decode(f.read())
    return None if text is None else text.removeprefix("\ufeff")


@dataclasses.dataclass(frozen=True)
class _LocalSource:
    """Base of the local source specs: splits -> files, features, and a parser per split."""

    kind = ""  # set by subclasses; the first part of the build directory name

    def split_files(self) -> dict[str, list[str]]:
        """Split name -> the input files it reads (checked to exist)."""
        raise NotImplementedError

    def features(self) -> tfds.features.FeaturesDict:
        raise NotImplementedError

    def parse(self, split: str, paths: list[str]) -> Iterator[Parsed]:
        """Yields (unique key, record) or (key, reason it is a bad record)."""
        raise NotImplementedError

    def build_name(self) -> str:
        """`<kind>-<hash of options and input files>`: one build per distinct input."""
        files = {split: _file_fingerprint(paths) for split, paths in self.split_files().items()}
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        blob = json.dumps([self.kind, options, files, _BUILD_FORMAT], sort_keys=True, default=str)
        return f"{self.kind}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def _text_features(*names: str, **others: Any) -> tfds.features.FeaturesDict:
    return tfds.features.FeaturesDict({**{n: tfds.features.Text() for n in names}, **others})


@dataclasses.dataclass(frozen=True)
class TextFiles(_LocalSource):
    """Plain-text or JSON-lines corpora: `files` maps split -> glob of `.txt` / `.jsonl` files.

    `unit` says what one document is: a whole file, one line, or one blank-line separated
    block (the format of shared/data/pretrain; a blank line may hold spaces or tabs). Line ends
    are read as "\n" whatever the file's (Windows' "\r\n", old Macs' "\r"). For `.jsonl`,
    every line is a JSON object whose `jsonl_field` is the document (`unit` is then ignored).
    """

    files: Mapping[str, str]
    unit: str = "block"
    jsonl_field: str = "text"
    kind = "text_files"

    def __post_init__(self):
        if self.unit not in TEXT_UNITS:
            raise ValueError(f"TextFiles.unit={self.unit!r} is not allowed; choose one of "
                             f"{', '.join(TEXT_UNITS)}")

    def split_files(self) -> dict[str, list[str]]:
        return {split: _expand(f"TextFiles.files[{split!r}]", pattern)
                for split, pattern in self.files.items()}

    def features(self) -> tfds.features.FeaturesDict:
        return _text_features("text")

    def parse(self, split: str, paths: list[str]) -> Iterator[Parsed]:
        for file_index, path in enumerate(paths):
            if path.endswith(".jsonl"):
                for key, record in _parse_jsonl(path, file_index):
                    if isinstance(record, str):
                        yield key, record
                    elif not isinstance(record.get(self.jsonl_field), str):
                        yield key, f"missing field {self.jsonl_field!r}"
                    else:
                        yield key, _text_record(record[self.jsonl_field])
                continue
            text = _read_text(path)
            if text is None:
                yield f"{file_index}", "undecodable bytes"
                continue
            text = text.replace("\r\n", "\n").replace("\r", "\n")  # Windows / old Mac ends
            if self.unit == "file":
                yield f"{file_index}", _text_record(text)
                continue
            # Blank lines (spaces allowed) / extra newlines separate documents; they are not
            # bad records.
            docs = (text.split("\n") if self.unit == "line"
                    else re.split(r"\n[ \t]*\n", text))
            for doc_index, doc in enumerate(docs):
                if doc.strip():
                    yield f"{file_index}:{doc_index}", {"text": doc.strip("\n")}


def _text_record(text: str) -> dict[str, str] | str:
    return {"text": text} if text.strip() else "empty text"


def _parse_jsonl(path: str, file_index: int) -> Iterator[Parsed]:
    """(key, JSON object) per non-empty line, or (key, reason) for a line that is not one."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f):
            key = f"{file_index}:{line_no}"
            line = _decode(raw)
            if line is None:
                yield key, "undecodable bytes"
            elif not line.strip():
                continue
            else:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    yield key, "invalid json"
                    continue
                yield key, record if isinstance(record, dict) else "invalid json"


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """How one GLUE task's tsv columns map to the catalog's record fields, and its label names
    (which `t5x_lite.data.tasks` writes as targets)."""

    fields: Mapping[str, str]  # record field -> tsv column
    label_column: str | None  # None: no labels in any split (ax)
    classes: tuple[str, ...] = ()  # label names in TFDS order; () = regression (stsb)
    headerless_columns: tuple[str, ...] = ()  # CoLA train/dev have no header row


# The GLUE tasks in the paper's order, and the unlabeled ax diagnostic.
GLUE_TASKS = {
    "cola": GlueTask({"sentence": "sentence"}, "label", ("unacceptable", "acceptable"),
                     headerless_columns=("source", "label", "star", "sentence")),
    "sst2": GlueTask({"sentence": "sentence"}, "label", ("negative", "positive")),
    "mrpc": GlueTask({"sentence1": "#1 String", "sentence2": "#2 String"}, "Quality",
                     ("not_equivalent", "equivalent")),
    "stsb": GlueTask({"sentence1": "sentence1", "sentence2": "sentence2"}, "score"),
    "qqp": GlueTask({"question1": "question1", "question2": "question2"}, "is_duplicate",
                    ("not_duplicate", "duplicate")),
    "mnli": GlueTask({"premise": "sentence1", "hypothesis": "sentence2"}, "gold_label",
                     ("entailment", "neutral", "contradiction")),
    "qnli": GlueTask({"question": "question", "sentence": "sentence"}, "label",
                     ("entailment", "not_entailment")),
    "rte": GlueTask({"sentence1": "sentence1", "sentence2": "sentence2"}, "label",
                    ("entailment", "not_entailment")),
    "wnli": GlueTask({"sentence1": "sentence1", "sentence2": "sentence2"}, "label",
                     ("not_entailment", "entailment")),
    "ax": GlueTask({"premise": "sentence1", "hypothesis": "sentence2"}, None,
                   ("entailment", "neutral", "contradiction")),
}
# GLUE file name -> TFDS split name.
_GLUE_SPLITS = {
    "mnli": {"train": "train", "dev_matched": "validation_matched",
             "dev_mismatched": "validation_mismatched", "test_matched": "test_matched",
             "test_mismatched": "test_mismatched"},
    "ax": {"diagnostic": "test"},
}
_GLUE_DEFAULT_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


@dataclasses.dataclass(frozen=True)
class GlueTsv(_LocalSource):
    """One GLUE task in the original tsv layout (`directory` holds train.tsv, dev.tsv, ...).

    Splits whose file is absent are left out (e.g. QNLI without train.tsv); labels become the
    catalog's class indices, so `glue_tsv` and `glue/<task>` records are interchangeable.
    """

    task: str
    directory: str
    kind = "glue_tsv"

    def __post_init__(self):
        if self.task not in GLUE_TASKS:
            raise ValueError(f"GlueTsv.task={self.task!r} is not allowed; choose one of "
                             f"{', '.join(GLUE_TASKS)}")

    def split_files(self) -> dict[str, list[str]]:
        names = _GLUE_SPLITS.get(self.task, _GLUE_DEFAULT_SPLITS)
        found = {split: [os.path.join(self.directory, f"{stem}.tsv")]
                 for stem, split in names.items()
                 if os.path.isfile(os.path.join(self.directory, f"{stem}.tsv"))}
        if not found:
            raise FileNotFoundError(
                f"GlueTsv.directory={self.directory!r} holds none of "
                f"{', '.join(s + '.tsv' for s in names)} for task {self.task!r}")
        return found

    def features(self) -> tfds.features.FeaturesDict:
        spec = GLUE_TASKS[self.task]
        label = np.float32 if not spec.classes else np.int64
        return _text_features(*spec.fields, label=label, idx=np.int32)

    def parse(self, split: str, paths: list[str]) -> Iterator[Parsed]:
        spec = GLUE_TASKS[self.task]
        text = _read_text(paths[0])
        if text is None:
            raise ValueError(f"{paths[0]} is not UTF-8 text")
        # GLUE fields may contain quote characters that are not csv quoting. Rows end at line
        # ends only: str.splitlines would also cut a field at U+2028, U+0085 or a form feed.
        rows = list(csv.reader(io.StringIO(text, newline=""), delimiter="\t",
                               quoting=csv.QUOTE_NONE))
        header = list(spec.headerless_columns)
        if not header or (rows and rows[0] and rows[0][0] == "index"):
            header, rows = rows[0], rows[1:]
        missing = [c for c in spec.fields.values() if c not in header]
        if missing:
            raise ValueError(f"{paths[0]}: GLUE task {self.task!r} needs columns {missing}, "
                             f"the header has {header}")
        column = {name: i for i, name in enumerate(header)}
        has_label = spec.label_column in column
        needed = max(column[c] for c in [*spec.fields.values(), spec.label_column] if c in column)
        for idx, row in enumerate(rows):
            if len(row) <= needed:
                yield f"{idx}", "missing columns"
                continue
            record = {field: row[column[col]] for field, col in spec.fields.items()}
            if not all(v.strip() for v in record.values()):
                yield f"{idx}", "empty text"
                continue
            label = self._label(row[column[spec.label_column]] if has_label else "")
            if label is None:
                yield f"{idx}", "unknown label"
                continue
            yield f"{idx}", {**record, "label": label, "idx": idx}

    def _label(self, value: str) -> int | float | None:
        """Class index / score of a label cell; -1 for an unlabeled row; None if unknown."""
        classes = GLUE_TASKS[self.task].classes
        if not value:
            return -1 if classes else -1.0
        if not classes:
            try:
                return float(value)
            except ValueError:
                return None
        if value in classes:
            return classes.index(value)
        return int(value) if value in {str(i) for i in range(len(classes))} else None


@dataclasses.dataclass(frozen=True)
class SquadJson(_LocalSource):
    """SQuAD v1.1 json files (`files`: split -> path): one record per question."""

    files: Mapping[str, str]
    kind = "squad_json"

    def split_files(self) -> dict[str, list[str]]:
        return {split: _expand(f"SquadJson.files[{split!r}]", p) for split, p in self.files.items()}

    def features(self) -> tfds.features.FeaturesDict:
        answers = tfds.features.Sequence(
            {"text": tfds.features.Text(), "answer_start": np.int32})
        return _text_features("id", "title", "context", "question", answers=answers)

    def parse(self, split: str, paths: list[str]) -> Iterator[Parsed]:
        for path in paths:
            text = _read_text(path)
            if text is None:
                raise ValueError(f"{path} is not UTF-8 text")
            for article in json.loads(text)["data"]:
                for paragraph in article["paragraphs"]:
                    for qa in paragraph["qas"]:
                        answers = qa.get("answers", [])
                        record = {
                            "id": qa.get("id", ""), "title": article.get("title", ""),
                            "context": paragraph["context"], "question": qa.get("question", ""),
                            "answers": {"text": [a["text"] for a in answers],
                                        "answer_start": [a["answer_start"] for a in answers]},
                        }
                        ok = all(record[k].strip() for k in ("id", "context", "question"))
                        yield record["id"] or repr(qa), record if ok else "empty text"


@dataclasses.dataclass(frozen=True)
class ParallelText(_LocalSource):
    """Line-aligned translation pairs: `files` maps split -> (source path, target path)."""

    languages: tuple[str, str]
    files: Mapping[str, tuple[str, str]]
    kind = "parallel_text"

    def split_files(self) -> dict[str, list[str]]:
        return {split: [_expand(f"ParallelText.files[{split!r}]", p)[0] for p in pair]
                for split, pair in self.files.items()}

    def features(self) -> tfds.features.FeaturesDict:
        return _text_features(*self.languages)

    def parse(self, split: str, paths: list[str]) -> Iterator[Parsed]:
        sides = []
        for path in paths:
            with open(path, "rb") as f:
                sides.append(f.read().split(b"\n"))
        if len(sides[0]) != len(sides[1]):
            raise ValueError(f"ParallelText.files[{split!r}] are not line-aligned: "
                             f"{len(sides[0])} vs {len(sides[1])} lines in {paths}")
        for line_no, pair in enumerate(zip(*sides)):
            if line_no == len(sides[0]) - 1 and not any(pair):
                continue  # the empty piece after a final newline
            texts = [_decode(raw) for raw in pair]
            if None in texts:
                yield f"{line_no}", "undecodable bytes"
            elif not all(t.strip() for t in texts):
                yield f"{line_no}", "empty text"
            else:
                yield f"{line_no}", dict(zip(self.languages, texts))


@dataclasses.dataclass(frozen=True)
class SummarizationJsonl(_LocalSource):
    """JSON-lines summarisation sets; the input fields are configurable (DialogSum: `dialogue`)."""

    files: Mapping[str, str]
    document_field: str = "document"
    summary_field: str = "summary"
    kind = "summarization_jsonl"

    def split_files(self) -> dict[str, list[str]]:
        return {split: _expand(f"SummarizationJsonl.files[{split!r}]", p)
                for split, p in self.files.items()}

    def features(self) -> tfds.features.FeaturesDict:
        return _text_features("document", "summary")

    def parse(self, split: str, paths: list[str]) -> Iterator[Parsed]:
        for file_index, path in enumerate(paths):
            for key, raw in _parse_jsonl(path, file_index):
                if isinstance(raw, str):
                    yield key, raw
                    continue
                document, summary = raw.get(self.document_field), raw.get(self.summary_field)
                if not isinstance(document, str) or not isinstance(summary, str):
                    yield key, "missing column"
                elif not document.strip() or not summary.strip():
                    yield key, "empty text"
                else:
                    yield key, {"document": document, "summary": summary}


# Standard-library modules never imported for python_docs: they open windows or browsers,
# print on import, change the interpreter, or are test suites rather than documentation.
_UNSAFE_MODULES = frozenset({
    "antigravity", "this", "tkinter", "turtle", "turtledemo", "idlelib", "test", "lib2to3",
    "distutils", "readline", "ensurepip", "venv", "pydoc_data",
})


def gather_python_docs() -> tuple[list[str], dict[str, int]]:
    """Documents from this interpreter's `pydoc_data` topics and standard-library docstrings.

    Runs in this process, importing standard-library modules: call it through `PythonDocs`,
    which runs it in a child interpreter so imports cannot affect the caller. Returns the
    documents (sorted topics, then modules in sorted order; one document per module: its
    docstring, then each public class / function / method docstring) and counts of modules
    read, skipped as unsafe, and failed to import.
    """
    import inspect
    import pkgutil
    import warnings

    from pydoc_data.topics import topics

    docs = [f"{name}\n\n{topics[name].strip()}" for name in sorted(topics)]
    counts = collections.Counter()
    names = sorted(n for n in sys.stdlib_module_names if not n.startswith("_"))
    pending = collections.deque(names)
    while pending:
        name = pending.popleft()
        if name.split(".")[0] in _UNSAFE_MODULES:
            counts["skipped_unsafe"] += 1
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                module = importlib.import_module(name)
            except Exception:  # noqa: BLE001 - any import failure only means "skip this module"
                counts["skipped_import_failed"] += 1
                continue
        counts["modules"] += 1
        if hasattr(module, "__path__"):  # a package: its public submodules come next, sorted
            subs = sorted(f"{name}.{m.name}" for m in pkgutil.iter_modules(module.__path__)
                          if not m.name.startswith("_") and "test" not in m.name)
            pending.extendleft(reversed(subs))
        parts = [inspect.getdoc(module) or ""]
        for attr, obj in sorted(vars(module).items()):
            if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            if inspect.isclass(obj) or inspect.isfunction(obj):
                parts.append(f"{attr}: {inspect.getdoc(obj) or ''}")
                if inspect.isclass(obj):
                    parts.extend(f"{attr}.{m}: {inspect.getdoc(f)}"
                                 for m, f in sorted(vars(obj).items())
                                 if not m.startswith("_") and inspect.isfunction(f)
                                 and f.__doc__)
        body = "\n\n".join(p.strip() for p in parts if p.strip() and not p.strip().endswith(":"))
        if body:
            docs.append(f"{name}\n\n{body}")
    return docs, dict(counts)


@dataclasses.dataclass(frozen=True)
class PythonDocs(_LocalSource):
    """The built-in corpus: this interpreter's pydoc topics and standard-library docstrings.

    Every ~50th document (by a hash of its text) forms the `validation` split.
    """

    kind = "python_docs"

    def split_files(self) -> dict[str, list[str]]:
        # No input files; the interpreter version stands in for them in the build name.
        return {"train": [], "validation": []}

    def build_name(self) -> str:
        version = "_".join(map(str, sys.version_info[:3]))
        where = hashlib.sha256(f"{sys.prefix}{_BUILD_FORMAT}".encode()).hexdigest()[:8]
        return f"{self.kind}-py{version}-{where}"

    def features(self) -> tfds.features.FeaturesDict:
        return _text_features("text")

    def parse(self, split: str, paths: list[str]) -> Iterator[Parsed]:
        docs, counts = _gather_in_child()
        log.info("python_docs: %d documents; module counts %s", len(docs), counts)
        for i, doc in enumerate(docs):
            digest = int(hashlib.sha256(doc.encode()).hexdigest(), 16)
            if (digest % 50 == 0) == (split == "validation"):
                yield f"{i}", _text_record(doc)


@functools.lru_cache(maxsize=1)  # both splits of one build come from one gathering
def _gather_in_child() -> tuple[list[str], dict[str, int]]:
    """Runs `gather_python_docs` in a fresh interpreter (stdin closed, output to a file), in
    an empty folder: `python -c` puts its working folder first on the module path, where a
    file such as `colorsys.py` would stand in for the standard library's module and change
    the corpus."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "docs.json")
        # Last on the path, after the standard library: where this process found t5x_lite.
        package_parent = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
        code = (f"import sys; sys.path.append({package_parent!r}); import json; "
                "from t5x_lite.data.builders import gather_python_docs; "
                "json.dump(gather_python_docs(), open(sys.argv[1], 'w'))")
        child = subprocess.run([sys.executable, "-c", code, out], timeout=600, cwd=tmp,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
        if child.returncode != 0:
            raise RuntimeError("gathering the python_docs corpus failed in a child interpreter "
                               f"(exit code {child.returncode}):\n{child.stderr[-2000:]}")
        with open(out) as f:
            docs, counts = json.load(f)
    return docs, counts


# ----------------------------------------------------------------------------- the TFDS builder

# Bump when parsing changes, so every old build is rebuilt (1.1.0: text files' line ends and
# blank lines holding spaces).
_BUILD_FORMAT = "1.1.0"


@dataclasses.dataclass(eq=False)
class _LocalConfig(tfds.core.BuilderConfig):
    source: _LocalSource | None = None


def _not_tfds_custom_config_notice(record: logging.LogRecord) -> bool:
    """False for TFDS's "Using custom data configuration" warning (absl's logger), which a
    config made per source (`_LocalConfig`) draws at every build and read: four lines of a
    run's output in a notebook (the CLI sets absl's verbosity to errors)."""
    return not str(record.msg).startswith("Using custom data configuration")


logging.getLogger("absl").addFilter(_not_tfds_custom_config_notice)


class LocalFiles(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """One ArrayRecord TFDS dataset per local source (`config.source`), in generation order."""

    name = "local_files"
    VERSION = tfds.core.Version(_BUILD_FORMAT)
    # Nothing is downloaded, so there is no checksums file to find next to the code; locating
    # the code would need `importlib_resources`, which tfds does not install.
    code_path = None

    def __init__(self, source: _LocalSource, data_dir: str):
        config = _LocalConfig(name=source.build_name(), source=source)
        super().__init__(config=config, data_dir=data_dir, file_format="array_record")

    @property
    def source(self) -> _LocalSource:
        return self.builder_config.source

    def _info(self) -> tfds.core.DatasetInfo:
        # disable_shuffling keeps file order, so `idx` and record order agree.
        return tfds.core.DatasetInfo(builder=self, features=self.source.features(),
                                     disable_shuffling=True)

    def _split_generators(self, dl_manager) -> dict[str, Iterator]:
        return {split: self._generate_examples(split, paths)
                for split, paths in self.source.split_files().items()}

    def _generate_examples(self, split: str, paths: list[str]) -> Iterator[tuple[str, dict]]:
        bad, good = collections.Counter(), 0
        for key, record in self.source.parse(split, paths):
            if isinstance(record, str):
                bad[record] += 1
            else:
                good += 1
                yield key, record
        skipped = ", ".join(f"{k}: {v}" for k, v in bad.items())
        if not good:  # else TFDS's AssertionError, "No examples were yielded", as a traceback
            shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3
                                            else "")
            raise ConfigError(f"the {split} split of {shown} holds no records ("
                              + (f"skipped {sum(bad.values())} bad ones: {skipped})" if bad
                                 else "its files are empty)"))
        if bad:
            log.warning("%s split %r: skipped %d bad records (%s)", self.builder_config.name,
                        split, sum(bad.values()), skipped)


# ----------------------------------------------------------------------------- reading

# Catalog builders are imported lazily by tfds; these modules register the ones T5 uses.
_CATALOG_MODULES = ("text", "summarization", "translate")


class Records(Sequence):
    """Random access to one split's records as plain Python values (`str`, `int`, lists)."""

    def __init__(self, source: Sequence[dict]):
        self._source = source

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"record {index} out of range for {len(self)} records")
        return _plain(self._source[index % len(self)])


def _plain(value: Any) -> Any:
    """TFDS values (bytes, numpy scalars / arrays, nested dicts) as Python values."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic) or isinstance(value, np.ndarray):
        return value.item()
    return value


def default_data_dir() -> str:
    """Where builds and caches go when no data_dir is configured: the user's t5x_lite cache
    folder (`compilation_cache.user_cache_dir`, which honours $XDG_CACHE_HOME)."""
    return str(compilation_cache.user_cache_dir())


def as_source(source: str | _LocalSource) -> str | _LocalSource:
    """A source spec from a config string: 'python_docs', a file glob, or a TFDS catalog name."""
    if not isinstance(source, str):
        return source
    if source == "python_docs":
        return PythonDocs()
    if any(c in source for c in "*?[") or os.path.exists(os.path.expanduser(source)):
        return TextFiles(files={"train": source})
    return source


def content_key(source: str | _LocalSource) -> str | None:
    """A name that changes whenever the source's records can change, without reading them:
    a local source's build name (it hashes the options and every input file's path, size and
    modification time). None for a catalog name, whose content the name does not fix."""
    source = as_source(source)
    return source.build_name() if isinstance(source, _LocalSource) else None


def build(source: _LocalSource, data_dir: str) -> LocalFiles:
    """The prepared builder of a local source (built on first use, reused afterwards).

    Safe to call from several processes at once (a multi-process run or a parallel sweep on
    one host, sharing `data_dir`): one builds while the others wait on a lock file beside the
    build, then read it. Without the lock the second finished build fails its final rename."""
    # A builder reads the dataset's info when it is made: one made before another process's
    # build lands knows no splits, even once `is_prepared` says yes. So the builder returned
    # is always made after the check that found the build.
    if LocalFiles(source, data_dir=data_dir).is_prepared():
        return LocalFiles(source, data_dir=data_dir)
    lock_dir = os.path.join(data_dir, LocalFiles.name)
    os.makedirs(lock_dir, exist_ok=True)
    with open(os.path.join(lock_dir, f"{source.build_name()}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        builder = LocalFiles(source, data_dir=data_dir)  # another process may have built it
        if not builder.is_prepared():
            # TFDS prints "Downloading and preparing dataset..." to stdout, which would mix
            # into a command's output (the report table) and is wrong here: nothing is
            # downloaded. Its progress bars (stderr) stay.
            print(f"Building the local dataset {source.kind!r} in {builder.data_dir} (once; "
                  "nothing is downloaded)", file=sys.stderr, flush=True)
            with contextlib.redirect_stdout(io.StringIO()):
                builder.download_and_prepare()
    return builder


def is_catalog_name(name: str) -> bool:
    """Whether `name` ('c4/en', 'glue/cola:2.0.0', ...) names a dataset in the TFDS catalog."""
    for module in _CATALOG_MODULES:  # TFDS registers catalog builders when their module loads
        importlib.import_module(f"tensorflow_datasets.{module}")
    return name.split("/")[0].split(":")[0] in tfds.list_builders(with_community_datasets=False)


def load_split(source: str | _LocalSource, split: str, data_dir: str | None = None) -> Records:
    """One split of any source as a random-access sequence of dict records.

    `source` is a local source spec, 'python_docs', a glob of text files, or a TFDS catalog
    name such as 'glue/cola' (read from `data_dir`, which must already hold it as ArrayRecord,
    e.g. `tfds build glue/cola --file_format=array_record`; nothing is downloaded).
    """
    data_dir = data_dir or default_data_dir()
    source = as_source(source)
    if isinstance(source, _LocalSource):
        splits = build(source, data_dir).as_data_source()
        if split not in splits:
            raise ValueError(f"split={split!r} is not in {source.kind}; "
                             f"choose one of {', '.join(splits)}")
        return Records(splits[split])
    if not is_catalog_name(source):
        raise ValueError(
            f"source={source!r} is not 'python_docs', an existing file or glob of text files, "
            "or a TFDS catalog name (e.g. 'c4/en', 'glue/cola')")
    builder = tfds.builder(source, data_dir=data_dir, file_format="array_record")
    try:
        return Records(builder.as_data_source(split=split))
    except KeyError as e:  # tfds' way of saying the split was never generated
        raise FileNotFoundError(
            f"split={split!r} of TFDS dataset {source!r} is not in data_dir={data_dir!r} "
            f"(prepared splits: {', '.join(builder.info.splits) or 'none'}); prepare it where "
            f"the network is reachable with `tfds build {source} --file_format=array_record "
            f"--data_dir=...` and copy it there") from e
