"""TFDS builders: build and read back small generated files, bad records, catalog names."""
import concurrent.futures
import json
import logging
import pathlib
import threading

import pytest
import tensorflow_datasets as tfds
from absl import logging as absl_logging

from t5x_lite.data import builders
from t5x_lite.errors import ConfigError
from t5x_lite.data.builders import (GlueTsv, ParallelText, SquadJson,
                                    SummarizationJsonl, TextFiles, load_split)



def write(path, content: str | bytes) -> str:
    mode = "wb" if isinstance(content, bytes) else "w"
    with open(path, mode) as f:
        f.write(content)
    return str(path)


@pytest.fixture(scope="session")
def python_docs_dir(tmp_path_factory):
    """One python_docs build shared by every test that reads it."""
    return str(tmp_path_factory.mktemp("python_docs"))


def test_python_docs_builds_from_the_standard_library(python_docs_dir):
    train = load_split("python_docs", "train", python_docs_dir)
    validation = load_split("python_docs", "validation", python_docs_dir)
    assert len(train) > 300 and 0 < len(validation) < len(train) / 10
    texts = [r["text"] for r in train]
    assert all(isinstance(t, str) and t.strip() for t in texts)
    assert any(t.startswith("json\n") and "JSON" in t for t in texts)  # a module docstring
    assert any(t.startswith("assert\n") for t in texts + [r["text"] for r in validation])
    assert not any(t.startswith(("antigravity", "this\n", "tkinter", "idlelib")) for t in texts)
    # The same interpreter's build is reused, not rebuilt: no file of it is written again.
    files = {path: path.stat().st_mtime_ns for path in pathlib.Path(python_docs_dir).rglob("*")
             if path.is_file()}
    assert [r["text"] for r in load_split("python_docs", "train", python_docs_dir)] == texts
    assert {path: path.stat().st_mtime_ns for path in pathlib.Path(python_docs_dir).rglob("*")
            if path.is_file()} == files and files


def test_gathering_counts_skipped_modules():
    docs, counts = builders._gather_in_child()
    assert counts["skipped_unsafe"] >= len({"antigravity", "this", "tkinter", "idlelib"})
    assert counts["modules"] > 300 and len(docs) > counts["modules"] / 2


def test_the_python_docs_corpus_does_not_depend_on_the_working_folder(tmp_path, monkeypatch):
    """A command run in a folder holding a file named as a standard-library module gathers the
    same corpus: the module's own docstring, not the file's."""
    (tmp_path / "colorsys.py").write_text('"""SHADOWED colorsys."""\n')
    monkeypatch.chdir(tmp_path)
    builders._gather_in_child.cache_clear()
    try:
        docs, counts = builders._gather_in_child()
    finally:
        builders._gather_in_child.cache_clear()
    assert not any("SHADOWED" in doc for doc in docs)
    assert any("RGB" in doc and "YIQ" in doc for doc in docs)  # colorsys's own docstring


@pytest.mark.parametrize("unit, expected", [
    ("block", ["Title one\nline a", "Title two\nline b", "third"]),
    ("line", ["Title one", "line a", "Title two", "line b", "third"]),
    ("file", ["Title one\nline a\n\nTitle two\nline b\n\nthird\n"]),
])
@pytest.mark.parametrize("line_end, blank", [("\n", ""), ("\r\n", ""), ("\n", " \t")])
def test_text_files_units(tmp_path, unit, expected, line_end, blank):
    """Alike with Windows line ends, and with blank lines that hold spaces."""
    text = f"Title one\nline a\n{blank}\nTitle two\nline b\n\nthird\n"
    write(tmp_path / "a.txt", text.replace("\n", line_end))
    source = TextFiles(files={"train": str(tmp_path / "*.txt")}, unit=unit)
    if unit == "file":
        expected = [text]
    assert [r["text"] for r in load_split(source, "train", str(tmp_path / "dd"))] == expected


def test_text_files_jsonl_and_bad_records_are_counted(tmp_path, caplog):
    write(tmp_path / "a.jsonl", '{"text": "good one"}\n{"text": ""}\nnot json\n{"other": 1}\n')
    write(tmp_path / "b.txt", b"fine doc\n\n\xff\xfe broken\n")  # not UTF-8 as a whole
    write(tmp_path / "c.txt", "second good doc\n")
    source = TextFiles(files={"train": str(tmp_path / "*")}, unit="file")
    with caplog.at_level(logging.WARNING):
        records = load_split(source, "train", str(tmp_path / "dd"))
    assert [r["text"] for r in records] == ["good one", "second good doc\n"]
    warnings = [r.message for r in caplog.records if "bad records" in r.message]
    assert len(warnings) == 1
    for part in ("skipped 4 bad records", "empty text: 1", "invalid json: 1",
                 "missing field 'text': 1", "undecodable bytes: 1"):
        assert part in warnings[0]


def test_a_source_without_a_good_record_is_one_line_naming_its_files(tmp_path):
    write(tmp_path / "a.jsonl", '{"other": 1}\n')
    source = TextFiles(files={"train": str(tmp_path / "a.jsonl")}, unit="file")
    with pytest.raises(ConfigError, match=r"^the train split of .*/a\.jsonl holds no records "
                                          r"\(skipped 1 bad ones: missing field 'text': 1\)$"):
        load_split(source, "train", str(tmp_path / "dd"))


def test_tfds_custom_config_notice_is_dropped_and_absl_s_other_warnings_kept(tmp_path, caplog):
    """A source's build and read draw no "Using custom data configuration" lines (TFDS's, at
    every builder made for a per-source config); absl's other warnings still show."""
    source = TextFiles(files={"train": write(tmp_path / "a.txt", "one doc\n")}, unit="file")
    verbosity = absl_logging.get_verbosity()  # the CLI, run by an earlier test, lowers it
    absl_logging.set_verbosity(absl_logging.WARNING)
    try:
        with caplog.at_level(logging.WARNING):
            load_split(source, "train", str(tmp_path / "dd"))
            load_split(source, "train", str(tmp_path / "dd"))
            absl_logging.warning("another warning")
    finally:
        absl_logging.set_verbosity(verbosity)
    absl_messages = [r.getMessage() for r in caplog.records if r.name == "absl"]
    assert "another warning" in absl_messages
    assert not [m for m in absl_messages if m.startswith("Using custom data configuration")]


def test_edited_input_gets_a_new_build(tmp_path):
    path = write(tmp_path / "a.txt", "first version\n")
    source = TextFiles(files={"train": path}, unit="file")
    before = source.build_name()
    assert load_split(source, "train", str(tmp_path / "dd"))[0]["text"] == "first version\n"
    write(path, "second version, longer\n")
    assert source.build_name() != before
    assert load_split(source, "train", str(tmp_path / "dd"))[0]["text"].startswith("second")


def test_concurrent_builds_of_one_source_share_one_build(tmp_path, capfd):
    """Processes of one run (or a parallel sweep) on one host build the same source into the
    same data_dir at once: one builds, the others wait and read it. Without the lock, the
    later build's final rename fails with FileExistsError. Threads stand in for processes:
    flock excludes separate opens of the lock file in one process too."""
    path = write(tmp_path / "a.txt", "".join(f"line {i} of the corpus\n" for i in range(50)))
    source, data_dir = TextFiles(files={"train": path}, unit="line"), str(tmp_path / "data")
    start = threading.Barrier(3)

    def build_it():
        start.wait()
        return len(builders.build(source, data_dir).as_data_source()["train"])

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        sizes = [f.result() for f in [pool.submit(build_it) for _ in range(3)]]
    assert sizes == [50, 50, 50]
    assert capfd.readouterr().err.count("Building the local dataset") == 1


def test_a_build_that_finishes_between_making_a_builder_and_checking_it_is_read_whole(
        tmp_path, monkeypatch):
    """The race the concurrent test above can meet: another process's build lands after this
    one made its builder (which read the dataset's info then: no splits yet) and before it
    asked `is_prepared`. Here the other build runs inside that first question."""
    path = write(tmp_path / "a.txt", "".join(f"line {i} of the corpus\n" for i in range(50)))
    source, data_dir = TextFiles(files={"train": path}, unit="line"), str(tmp_path / "data")
    is_prepared = builders.LocalFiles.is_prepared

    def another_build_lands_first(builder):
        monkeypatch.setattr(builders.LocalFiles, "is_prepared", is_prepared)
        builders.build(source, data_dir)
        return is_prepared(builder)

    monkeypatch.setattr(builders.LocalFiles, "is_prepared", another_build_lands_first)
    assert len(builders.build(source, data_dir).as_data_source()["train"]) == 50


def test_bad_options_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="TextFiles.unit='page' is not allowed; choose one of "
                                         "file, line, block"):
        TextFiles(files={"train": "x"}, unit="page")
    with pytest.raises(FileNotFoundError, match=r"TextFiles.files\['train'\]=.* matches no file"):
        load_split(TextFiles(files={"train": str(tmp_path / "*.none")}), "train", str(tmp_path))
    with pytest.raises(ValueError, match="GlueTsv.task='colaa' is not allowed; choose one of "
                                         "cola, sst2"):
        GlueTsv(task="colaa", directory=str(tmp_path))
    write(tmp_path / "a.txt", "x\n")
    with pytest.raises(ValueError, match="split='test' is not in text_files; choose one of train"):
        load_split(str(tmp_path / "*.txt"), "test", str(tmp_path / "dd"))


def test_glue_cola_headerless_and_labels(tmp_path):
    write(tmp_path / "train.tsv", 'gj04\t1\t\tThe "sailors" rode.\ngj04\t0\t*\tRode the.\n'
                                  "gj04\t1\t\t\nshort\trow\n")
    write(tmp_path / "test.tsv", "index\tsentence\n0\tBill whistled.\n")
    source = GlueTsv(task="cola", directory=str(tmp_path))
    train = load_split(source, "train", str(tmp_path / "dd"))
    assert list(train) == [
        {"sentence": 'The "sailors" rode.', "label": 1, "idx": 0},
        {"sentence": "Rode the.", "label": 0, "idx": 1},
    ]
    assert list(load_split(source, "test", str(tmp_path / "dd"))) == [
        {"sentence": "Bill whistled.", "label": -1, "idx": 0}]


def test_a_glue_row_is_cut_at_line_ends_only(tmp_path):
    """A sentence holding a Unicode line separator, a next-line or a form feed stays one row
    (str.splitlines cut it in two: one half dropped, the other a wrong example)."""
    write(tmp_path / "dev.tsv", "sentence\tlabel\nfine movie\t1\n"
                                "bad\u2028movie\x85really\x0cbad\t0\nlast one\t1\n")
    rows = load_split(GlueTsv(task="sst2", directory=str(tmp_path)), "validation",
                      str(tmp_path / "dd"))
    assert list(rows) == [
        {"sentence": "fine movie", "label": 1, "idx": 0},
        {"sentence": "bad\u2028movie\x85really\x0cbad", "label": 0, "idx": 1},
        {"sentence": "last one", "label": 1, "idx": 2}]


def test_glue_pairs_bom_header_named_labels_and_scores(tmp_path):
    mrpc, rte, stsb = (tmp_path / t for t in ("mrpc", "rte", "stsb"))
    for d in (mrpc, rte, stsb):
        d.mkdir()
    write(mrpc / "dev.tsv", "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA b .\tB a .\n")
    write(rte / "train.tsv", "index\tsentence1\tsentence2\tlabel\n0\tP.\tH.\tnot_entailment\n"
                             "1\tP2.\tH2.\tmaybe\n")
    write(stsb / "dev.tsv", "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\t"
                            "sentence1\tsentence2\tscore\n0\tg\tf\ty\to\tn\tn\tA.\tB.\t3.800\n")
    dd = str(tmp_path / "dd")
    assert load_split(GlueTsv("mrpc", str(mrpc)), "validation", dd)[0] == {
        "sentence1": "A b .", "sentence2": "B a .", "label": 1, "idx": 0}
    rte_train = load_split(GlueTsv("rte", str(rte)), "train", dd)
    assert list(rte_train) == [{"sentence1": "P.", "sentence2": "H.", "label": 1, "idx": 0}]
    score = load_split(GlueTsv("stsb", str(stsb)), "validation", dd)[0]["label"]
    assert score == pytest.approx(3.8)


def test_glue_wrong_header_is_an_error_naming_the_columns(tmp_path):
    write(tmp_path / "train.tsv", "index\tquestion\tlabel\n0\tq\tentailment\n")
    with pytest.raises(ValueError, match=r"needs columns \['sentence'\]"):
        load_split(GlueTsv("qnli", str(tmp_path)), "train", str(tmp_path / "dd"))


def test_squad_json_one_record_per_question(tmp_path):
    data = {"version": "1.1", "data": [{"title": "T", "paragraphs": [{
        "context": "Paris is in France.",
        "qas": [{"id": "q1", "question": "Where is Paris?",
                 "answers": [{"text": "France", "answer_start": 12},
                             {"text": "in France", "answer_start": 9}]},
                {"id": "q2", "question": "", "answers": []}]}]}]}
    write(tmp_path / "dev.json", json.dumps(data))
    records = load_split(SquadJson(files={"validation": str(tmp_path / "dev.json")}),
                         "validation", str(tmp_path / "dd"))
    assert list(records) == [{
        "id": "q1", "title": "T", "context": "Paris is in France.",
        "question": "Where is Paris?",
        "answers": {"text": ["France", "in France"], "answer_start": [12, 9]}}]


def test_parallel_text_and_misalignment(tmp_path):
    write(tmp_path / "a.en", "Hello.\nTwo\n\n")
    write(tmp_path / "a.de", "Hallo.\nZwei\nDrei\n")
    source = ParallelText(languages=("en", "de"),
                          files={"train": (str(tmp_path / "a.en"), str(tmp_path / "a.de"))})
    records = load_split(source, "train", str(tmp_path / "dd"))
    assert list(records) == [{"en": "Hello.", "de": "Hallo."}, {"en": "Two", "de": "Zwei"}]
    write(tmp_path / "b.de", "Hallo.\n")
    short = ParallelText(languages=("en", "de"),
                         files={"train": (str(tmp_path / "a.en"), str(tmp_path / "b.de"))})
    with pytest.raises(ValueError, match="are not line-aligned: 4 vs 2 lines"):
        load_split(short, "train", str(tmp_path / "dd"))


def test_summarization_jsonl_with_renamed_fields(tmp_path):
    write(tmp_path / "dev.jsonl", '{"dialogue": "#P1#: hi", "summary": "greeting"}\n'
                                  '{"dialogue": "#P1#: bye"}\n')
    source = SummarizationJsonl(files={"validation": str(tmp_path / "dev.jsonl")},
                                document_field="dialogue")
    assert list(load_split(source, "validation", str(tmp_path / "dd"))) == [
        {"document": "#P1#: hi", "summary": "greeting"}]


@pytest.mark.parametrize("name, fields", [
    ("glue/cola", {"sentence", "label", "idx"}),
    ("glue/stsb", {"sentence1", "sentence2", "label", "idx"}),
    ("squad", {"id", "title", "context", "question", "answers"}),
    ("wmt_t2t_translate/de-en", {"de", "en"}),
    ("cnn_dailymail", {"article", "highlights", "id", "publisher"}),
])
def test_catalog_names_read_through_tfds_data_source(tmp_path, name, fields):
    with tfds.testing.mock_data(num_examples=4):
        records = load_split(name, "train", str(tmp_path))
        assert len(records) == 4
        assert set(records[0]) == fields and records[-1] == records[3]


def test_catalog_name_missing_from_data_dir_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="split='train' of TFDS dataset 'glue/rte' is not in data_dir="):
        load_split("glue/rte", "train", str(tmp_path))


def test_shared_glue_cola_builds(tmp_path, shared_data):
    source = GlueTsv("cola", shared_data("glue", "CoLA"))
    dd = str(tmp_path)
    train, dev, test = (load_split(source, s, dd) for s in ("train", "validation", "test"))
    assert (len(train), len(dev), len(test)) == (8551, 1043, 1063)  # counts from SOURCES.md
    assert {r["label"] for r in dev} == {0, 1} and test[0]["label"] == -1


def test_shared_squad_builds(tmp_path, shared_data):
    source = SquadJson(files={"validation": shared_data("squad", "dev-v1.1.json")})
    records = load_split(source, "validation", str(tmp_path))
    assert len(records) == 10570  # questions, per SOURCES.md
    first = records[0]
    for text, start in zip(first["answers"]["text"], first["answers"]["answer_start"]):
        assert first["context"][start:start + len(text)] == text
