"""Text-to-text formatting against the T5 paper's appendix D, the task registry, GLUE average."""
import collections
import json
import os

import numpy as np
import pytest

from conftest import readme_python_block, require_shared_data
from t5x_lite import presets
from t5x_lite.data import builtin, tasks
from t5x_lite.errors import ConfigError

# (task, TFDS-style record, processed input, processed target), each from the paper's appendix D
# ("Original input" fields with "Original target" as the class index, then "Processed input" and
# "Processed target"). The paper typesets some apostrophes as ’; they are kept as printed.
APPENDIX_D = [
    (
        "glue_cola",
        {"sentence": "John made Bill master of himself.", "label": 1},
        "cola sentence: John made Bill master of himself.",
        "acceptable",
    ),
    (
        "glue_rte",
        {
            "sentence1": "A smaller proportion of Yugoslavia’s Italians were settled in Slovenia "
            "(at the 1991 national census, some 3000 inhabitants of Slovenia declared themselves "
            "as ethnic Italians).",
            "sentence2": "Slovenia has 3,000 inhabitants.",
            "label": 1,
        },
        "rte sentence1: A smaller proportion of Yugoslavia’s Italians were settled in Slovenia "
        "(at the 1991 national census, some 3000 inhabitants of Slovenia declared themselves as "
        "ethnic Italians). sentence2: Slovenia has 3,000 inhabitants.",
        "not_entailment",
    ),
    (
        "glue_mnli",
        {
            "premise": "yeah well losing is i mean i’m i’m originally from Saint Louis and Saint "
            "Louis Cardinals when they were there were uh a mostly a losing team but",
            "hypothesis": "The St. Louis Cardinals have always won.",
            "label": 2,
        },
        "mnli hypothesis: The St. Louis Cardinals have always won. premise: yeah well losing is "
        "i mean i’m i’m originally from Saint Louis and Saint Louis Cardinals when they were "
        "there were uh a mostly a losing team but",
        "contradiction",
    ),
    (
        "glue_mrpc",
        {
            "sentence1": 'We acted because we saw the existing evidence in a new light , through '
            'the prism of our experience on 11 September , " Rumsfeld said .',
            "sentence2": 'Rather , the US acted because the administration saw " existing '
            'evidence in a new light , through the prism of our experience on September 11 " .',
            "label": 1,
        },
        'mrpc sentence1: We acted because we saw the existing evidence in a new light , through '
        'the prism of our experience on 11 September , " Rumsfeld said . sentence2: Rather , the '
        'US acted because the administration saw " existing evidence in a new light , through the '
        'prism of our experience on September 11 " .',
        "equivalent",
    ),
    (
        "glue_qnli",
        {
            "question": "Where did Jebe die?",
            "sentence": "Genghis Khan recalled Subutai back to Mongolia soon afterwards, and Jebe "
            "died on the road back to Samarkand.",
            "label": 0,
        },
        "qnli question: Where did Jebe die? sentence: Genghis Khan recalled Subutai back to "
        "Mongolia soon afterwards, and Jebe died on the road back to Samarkand.",
        "entailment",
    ),
    (
        "glue_qqp",
        {
            "question1": "What attributes would have made you highly desirable in ancient Rome?",
            "question2": "How I GET OPPERTINUTY TO JOIN IT COMPANY AS A FRESHER?",
            "label": 0,
        },
        "qqp question1: What attributes would have made you highly desirable in ancient Rome? "
        "question2: How I GET OPPERTINUTY TO JOIN IT COMPANY AS A FRESHER?",
        "not_duplicate",
    ),
    (
        "glue_sst2",
        {
            "sentence": "it confirms fincher ’s status as a film maker who artfully bends "
            "technical know-how to the service of psychological insight .",
            "label": 1,
        },
        "sst2 sentence: it confirms fincher ’s status as a film maker who artfully bends "
        "technical know-how to the service of psychological insight .",
        "positive",
    ),
]


@pytest.mark.parametrize("name, record, inputs, targets", APPENDIX_D,
                         ids=[case[0] for case in APPENDIX_D])
def test_glue_formatting_matches_the_paper(name, record, inputs, targets):
    example = tasks.get_task(name).formatter(record)
    assert example.inputs == inputs
    assert example.targets == targets
    assert example.references == (targets,)


def test_squad_formatting_matches_the_paper():
    # Appendix D, SQuAD: the context as it is in SQuAD v1.1 dev (newlines inside "O\n2"); the
    # paper prints "O 2", i.e. whitespace runs become one space and punctuation stays as is.
    context = (
        "Hyperbaric (high-pressure) medicine uses special oxygen chambers to increase the partial "
        "pressure of O\n2 around the patient and, when needed, the medical staff. Carbon monoxide "
        "poisoning, gas gangrene, and decompression sickness (the ’bends’) are sometimes treated "
        "using these devices. Increased O\n2 concentration in the lungs helps to displace carbon "
        "monoxide from the heme group of hemoglobin. Oxygen gas is poisonous to the anaerobic "
        "bacteria that cause gas gangrene, so increasing its partial pressure helps kill them. "
        "Decompression sickness occurs in divers who decompress too quickly after a dive, "
        "resulting in bubbles of inert gas, mostly nitrogen and helium, forming in their blood. "
        "Increasing the pressure of O\n2 as soon as possible is part of the treatment."
    )
    record = {
        "id": "571cd3b55efbb31900334e04",
        "title": "Oxygen",
        "question": "What does increased oxygen concentrations in the patient’s lungs displace?",
        "context": context,
        "answers": {"text": ["carbon monoxide", "carbon monoxide"], "answer_start": [345, 345]},
    }
    example = tasks.get_task("squad").formatter(record)
    assert example.inputs == (
        "question: What does increased oxygen concentrations in the patient’s lungs displace? "
        "context: Hyperbaric (high-pressure) medicine uses special oxygen chambers to increase "
        "the partial pressure of O 2 around the patient and, when needed, the medical staff. "
        "Carbon monoxide poisoning, gas gangrene, and decompression sickness (the ’bends’) are "
        "sometimes treated using these devices. Increased O 2 concentration in the lungs helps "
        "to displace carbon monoxide from the heme group of hemoglobin. Oxygen gas is poisonous "
        "to the anaerobic bacteria that cause gas gangrene, so increasing its partial pressure "
        "helps kill them. Decompression sickness occurs in divers who decompress too quickly "
        "after a dive, resulting in bubbles of inert gas, mostly nitrogen and helium, forming in "
        "their blood. Increasing the pressure of O 2 as soon as possible is part of the treatment."
    )
    assert example.targets == "carbon monoxide"
    assert example.references == ("carbon monoxide", "carbon monoxide")


def test_stsb_matches_t5():
    # T5's `stsb` preprocessor docstring: label 1.8 -> inputs below, targets "1.8".
    record = {
        "sentence1": "Three more US soldiers killed in Afghanistan",
        "sentence2": "NATO Soldier Killed in Afghanistan",
        "label": 1.8,
    }
    example = tasks.get_task("glue_stsb").formatter(record)
    assert example.inputs == (
        "stsb sentence1: Three more US soldiers killed in Afghanistan "
        "sentence2: NATO Soldier Killed in Afghanistan"
    )
    assert example.targets == "1.8"


@pytest.mark.parametrize(
    "score, text",
    # x5 then round: 3.25 -> 16.25 -> 16; 2.59 -> 12.95 -> 13; 3.9 -> 19.5 -> 20 (half to even);
    # 3.7 -> 18.5 -> 18 (half to even, as tf.round); the ends stay at 0 and 5.
    # TFDS's labels are float32, and T5 rounds them in float32: float32 3.7 x 5 is 18.5 there
    # (18.5000002 in float64, which would round up to "3.8"), float32 0.1 x 5 is 0.5 (-> 0),
    # float32 3.1 x 5 is 15.5 (-> 16).
    [(3.25, "3.2"), (2.59, "2.6"), (3.9, "4.0"), (3.7, "3.6"), (0.0, "0.0"), (5.0, "5.0"),
     (np.float32(3.7), "3.6"), (np.float32(0.1), "0.0"), (np.float32(3.1), "3.2"),
     (np.float32(4.9), "4.8")],
)
def test_stsb_rounds_to_the_nearest_fifth(score, text):
    record = {"sentence1": "a", "sentence2": "b", "label": score}
    assert tasks.format_stsb(record).targets == text


def test_translation_and_summarization_prefixes():
    example = tasks.get_task("wmt_ende").formatter({"en": "That is good.", "de": "Das ist gut."})
    assert example.inputs == "translate English to German: That is good."
    assert example.targets == "Das ist gut."
    enro = tasks.get_task("wmt_enro").formatter({"en": "Hi.", "ro": "Salut."})
    assert enro.inputs == "translate English to Romanian: Hi."
    # Appendix D, CNN/Daily Mail: the article keeps its text after "summarize: ".
    article = ("marouane fellaini and adnan januzaj continue to show the world they are not just "
               "teammates but also best mates.")
    record = {"article": article, "highlights": "best mates."}
    example = tasks.get_task("cnn_dailymail").formatter(record)
    assert example.inputs == "summarize: " + article
    assert example.targets == "best mates."


def test_unknown_language_code_is_rejected():
    with pytest.raises(ValueError, match="language code 'xx'.*en, de, fr, ro"):
        tasks.format_translation({"en": "a", "xx": "b"}, source="en", target="xx")


def _task_over(records, name="glue_rte"):
    """`name`'s formatting over in-memory records, with a fake source."""
    base = tasks.get_task(name)
    splits = {"validation": "validation", "test": "test"}
    return tasks.Task(name, lambda split, data_dir, data_root: records, base.formatter,
                      base.metric_names, splits, base.postprocess)


def test_unlabeled_records_are_skipped_except_in_test():
    records = [
        {"sentence1": "a", "sentence2": "b", "label": 0},
        {"sentence1": "c", "sentence2": "d", "label": -1},
    ]
    task = _task_over(records)
    assert [ex.targets for ex in task.examples("validation")] == ["entailment"]
    test = task.examples("test")
    assert [ex.targets for ex in test] == ["entailment", None]
    assert test[1].references == ()
    with pytest.raises(ValueError, match="unlabeled"):
        task.score(test, ["entailment", "entailment"])


def test_score_turns_text_into_classes_and_counts_invalid_text_wrong():
    labels = [1, 1, 0, 0]  # equivalent, equivalent, not_equivalent, not_equivalent
    records = [{"sentence1": "a", "sentence2": "b", "label": label} for label in labels]
    task = _task_over(records, "glue_mrpc")
    examples = task.examples("validation")
    scores = task.score(examples, ["equivalent", "maybe", "not_equivalent", "equivalent"])
    # Classes 1, -1, 0, 1 vs 1, 1, 0, 0: accuracy 2/4; tp=1 fn=1 fp=1, F1 = 2/(2+1+1).
    assert scores == pytest.approx({"accuracy": 50.0, "f1": 50.0})


def test_stsb_score_reads_numbers():
    records = [{"sentence1": "a", "sentence2": "b", "label": s} for s in (1.0, 2.0, 3.0)]
    task = _task_over(records, "glue_stsb")
    scores = task.score(task.examples("validation"), ["1.0", "3.0", "2.0"])
    # Deviations (-1, 0, 1) and (-1, 1, 0): Pearson 1/2; the values are their own ranks.
    assert scores == pytest.approx({"pearson_corrcoef": 50.0, "spearman_corrcoef": 50.0})
    assert tasks.string_to_float("three") == -1.0


def test_squad_score_uses_every_gold_answer():
    record = {"question": "q", "context": "c", "answers": {"text": ["Paris", "the city of Paris"]}}
    task = _task_over([record], "squad")
    scores = task.score(task.examples("validation"), ["city of Paris"])
    assert scores == pytest.approx({"em": 100.0, "f1": 100.0})


def test_registry_has_the_paper_tasks_and_names_them_in_errors():
    paper = ["glue_cola", "glue_sst2", "glue_mrpc", "glue_qqp", "glue_stsb", "glue_mnli",
             "glue_mnli_matched", "glue_mnli_mismatched", "glue_qnli", "glue_rte", "glue_wnli",
             "squad", "cnn_dailymail", "wmt_ende", "wmt_enfr", "wmt_enro"]
    assert set(paper) <= set(tasks.TASKS)
    with pytest.raises(ValueError,
                       match="unknown task 'glue_colaa'; known tasks: builtin_module, "
                             "builtin_reverse, builtin_sort, cnn_dailymail, glue_cola"):
        tasks.get_task("glue_colaa")


def test_bad_split_and_missing_data_root_are_explained(tmp_path):
    with pytest.raises(ValueError,
                       match="'glue_mnli_matched' has no split 'train'; its splits: validation"):
        tasks.get_task("glue_mnli_matched").examples("train")
    with pytest.raises(ConfigError, match=r"^local_\* tasks read their files under "
                                          r"data.data_root, which is not set: "
                                          r"--config.data.data_root=DIR"):
        tasks.get_task("local_glue_rte").examples("validation")
    # A mistyped root was named as a builder's field (ParallelText.files['train']=...).
    with pytest.raises(ConfigError, match=r"^data.data_root='.*nowhere' is not a directory"):
        tasks.get_task("local_glue_rte").examples("validation", str(tmp_path),
                                                  str(tmp_path / "nowhere"))
    # '~' is a directory (the loaders expand it): what is missing is the task's files there.
    with pytest.raises(FileNotFoundError, match=r"GlueTsv.directory='~/glue/RTE' holds none"):
        tasks.get_task("local_glue_rte").examples("validation", str(tmp_path), "~")


def test_glue_average_as_the_paper():
    scores = {
        "glue_cola": {"matthews_corrcoef": 40.0},
        "glue_sst2": {"accuracy": 90.0},
        "glue_mrpc": {"f1": 90.0, "accuracy": 80.0},  # 85
        "glue_stsb": {"pearson_corrcoef": 88.0, "spearman_corrcoef": 86.0},  # 87
        "glue_qqp": {"f1": 70.0, "accuracy": 90.0},  # 80
        "glue_mnli_matched": {"accuracy": 84.0},
        "glue_mnli_mismatched": {"accuracy": 82.0},  # MNLI 83
        "glue_qnli": {"accuracy": 91.0},
        "glue_rte": {"accuracy": 70.0},
        "glue_wnli": {"accuracy": 0.0},  # left out
        "squad": {"em": 0.0, "f1": 0.0},  # not GLUE
    }
    # (40 + 90 + 85 + 87 + 80 + 83 + 91 + 70) / 8 = 626 / 8
    assert tasks.glue_average(scores) == pytest.approx(626 / 8)
    # A value that is not one of the task's metrics is left out (it was averaged in: a loss
    # of 500 made the average 97.93), and a metric the task lacks is an error naming it.
    assert tasks.glue_average({**scores, "glue_cola": {"matthews_corrcoef": 40.0,
                                                       "eval_loss": 500.0}}) == pytest.approx(
        626 / 8)
    with pytest.raises(ValueError, match=r"task 'glue_stsb' has no spearman_corrcoef score "
                                         r"\(its metrics: pearson_corrcoef, spearman_corrcoef\)"):
        tasks.glue_average({**scores, "glue_stsb": {"pearson_corrcoef": 88.0}})


def test_glue_average_missing_tasks():
    partial = {"local_glue_cola": {"matthews_corrcoef": 40.0},
               "glue_mrpc": {"f1": 90.0, "accuracy": 80.0}}
    with pytest.raises(ValueError, match="no scores for mnli matched, mnli mismatched, qnli, "
                                         "qqp, rte, sst2, stsb"):
        tasks.glue_average(partial)
    # local_glue_cola counts as CoLA: (40 + 85) / 2.
    assert tasks.glue_average(partial, allow_missing=True) == pytest.approx(62.5)


def test_glue_average_counts_mnli_matched_once_and_needs_both_halves():
    complete = {f"glue_{name}": dict.fromkeys(tasks.get_task(f"glue_{name}").metric_names, 80.0)
                for name in ("cola", "sst2", "mrpc", "stsb", "qqp", "qnli", "rte")}
    # A sweep's glue_mnli is validated on validation_matched: MNLI's matched half alone.
    with pytest.raises(ValueError, match="no scores for mnli mismatched;"):
        tasks.glue_average({**complete, "glue_mnli": {"accuracy": 60.0}})
    both = {**complete, "glue_mnli": {"accuracy": 60.0},
            "glue_mnli_mismatched": {"accuracy": 70.0}}
    assert tasks.glue_average(both) == pytest.approx((7 * 80 + 65) / 8)
    # glue_mnli_matched is the same split as glue_mnli's validation: refused, not averaged in.
    with pytest.raises(ValueError, match="'glue_mnli' and 'glue_mnli_matched' are the same part "
                                         r"of GLUE \(mnli matched\)"):
        tasks.glue_average({**both, "glue_mnli_matched": {"accuracy": 90.0}})
    assert tasks.missing_glue_parts(["glue_mnli", "local_glue_rte"]) == [
        "cola", "mnli mismatched", "mrpc", "qnli", "qqp", "sst2", "stsb"]


def test_local_squad_is_split_by_article(tmp_path):
    # 12 one-question articles: the last 10 are validation, the first 2 train.
    def article(i):
        qa = {"id": f"q{i}", "question": f"question {i}?",
              "answers": [{"text": f"{i}", "answer_start": 8}]}
        return {"title": f"article{i}", "paragraphs": [{"context": f"context {i}", "qas": [qa]}]}

    articles = [article(i) for i in range(12)]
    os.makedirs(tmp_path / "root" / "squad")
    with open(tmp_path / "root" / "squad" / "dev-v1.1.json", "w") as f:
        json.dump({"version": "1.1", "data": articles}, f)
    task = tasks.get_task("local_squad")
    train = task.examples("train", str(tmp_path / "build"), str(tmp_path / "root"))
    validation = task.examples("validation", str(tmp_path / "build"), str(tmp_path / "root"))
    assert [ex.targets for ex in train] == ["0", "1"]
    assert [ex.targets for ex in validation] == [str(i) for i in range(2, 12)]
    assert validation[0].inputs == "question: question 2? context: context 2"


def test_local_glue_rte_from_shared_data(tmp_path, shared_data):
    shared_data("glue", "RTE")  # skips (fails under CI=true) without it
    root = shared_data()
    task = tasks.get_task("local_glue_rte")
    examples = task.examples("validation", str(tmp_path), root)
    assert len(examples) == 277  # dev.tsv rows (SOURCES.md)
    assert {ex.targets for ex in examples} == {"entailment", "not_entailment"}
    # First row of dev.tsv: Dana Reeve ... / Christopher Reeve had an accident. / not_entailment
    assert examples[0].inputs.startswith("rte sentence1: Dana Reeve, the widow of the actor")
    assert examples[0].inputs.endswith(" sentence2: Christopher Reeve had an accident.")
    assert examples[0].targets == "not_entailment"
    assert all(ex.targets is None for ex in task.examples("test", str(tmp_path), root))


# ---------------------------------------------------------------------------------------------
# Built-in tasks, generated from the python_docs corpus.

BUILTIN = ("builtin_reverse", "builtin_sort", "builtin_module")


@pytest.fixture(scope="module")
def docs_dir(tmp_path_factory):
    """One python_docs build for the built-in task tests (a few seconds)."""
    return str(tmp_path_factory.mktemp("python_docs"))


def _examples(name, split, data_dir):
    return tasks.get_task(name).examples(split, data_dir)


@pytest.mark.parametrize("name, prefix, transform", [
    ("builtin_reverse", "reverse: ", lambda words: words[::-1]),
    ("builtin_sort", "sort: ", sorted),
])
def test_builtin_word_tasks(docs_dir, name, prefix, transform):
    vocabulary = set(builtin.word_vocabulary(docs_dir))
    assert len(vocabulary) == builtin.WORD_VOCABULARY_SIZE
    for split, size in (("train", 8192), ("validation", 256)):
        examples = _examples(name, split, docs_dir)
        assert len(examples) == size
        lengths = collections.Counter()
        for ex in examples:
            assert ex.inputs.startswith(prefix)
            words = ex.inputs.removeprefix(prefix).split(" ")
            lengths[len(words)] += 1
            assert all(w.isascii() and w.isalpha() and w.islower() for w in words)
            assert set(words) <= vocabulary
            assert ex.targets.split(" ") == transform(words)
        # Every length of 2-6 words, each drawn about equally often.
        assert sorted(lengths) == list(range(2, 7))
        assert max(lengths.values()) < 1.5 * min(lengths.values())
    # Exact match over the whole sequence: one word out of place makes an example wrong;
    # position_accuracy counts the words in place: 3 right sequences and one whose last word of
    # n is missing score (3 + (n - 1) / n) / 4.
    examples = _examples(name, "validation", docs_dir)[:4]
    last = examples[3].targets.split(" ")
    predictions = [ex.targets for ex in examples[:3]] + [" ".join(last[:-1])]
    scores = tasks.get_task(name).score(examples, predictions)
    n = len(last)
    assert scores == {"accuracy": 75.0,
                      "position_accuracy": pytest.approx(100 * (3 + (n - 1) / n) / 4)}


def test_builtin_word_vocabulary_is_the_most_frequent_words(docs_dir):
    counts = collections.Counter(word for _, paragraph in builtin._paragraphs(docs_dir)
                                 for word in builtin._words(paragraph))
    vocabulary = builtin.word_vocabulary(docs_dir)
    assert vocabulary[0] == "the"
    least = min(counts[word] for word in vocabulary)
    assert all(counts[word] <= least for word in counts if word not in vocabulary)


def test_builtin_module_is_balanced_and_hides_its_labels(docs_dir):
    task = tasks.get_task("builtin_module")
    sizes = {}
    for split in ("train", "validation"):
        examples = _examples("builtin_module", split, docs_dir)
        counts = collections.Counter(ex.targets for ex in examples)
        assert set(counts) == {"asyncio", "email", "logging", "xml"}
        assert len(set(counts.values())) == 1  # the same number of every class
        sizes[split] = len(examples)
        for ex in examples:
            sentence = ex.inputs.removeprefix("module sentence: ")
            assert sentence != ex.inputs and 6 <= len(sentence.split()) <= 30
            assert not any(label in sentence.lower() for label in counts)
    # Validation holds about one sentence in five.
    assert 4 * 100 <= sizes["train"] and 0.1 < sizes["validation"] / sizes["train"] < 0.4
    examples = _examples("builtin_module", "validation", docs_dir)[:2]
    scores = task.score(examples, [examples[0].targets, "not a module"])
    assert scores == {"accuracy": 50.0}


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_splits_are_disjoint(docs_dir, name):
    train = {ex.inputs for ex in _examples(name, "train", docs_dir)}
    validation = {ex.inputs for ex in _examples(name, "validation", docs_dir)}
    assert validation and not train & validation


def test_builtin_tasks_are_deterministic(docs_dir, tmp_path):
    before = {name: _examples(name, "train", docs_dir) for name in BUILTIN}
    # A second build of the corpus, generated afresh, gives the same examples in the same order.
    for cached in (builtin._paragraphs, builtin._word_sequences, builtin._module_sentences):
        cached.cache_clear()
    assert {name: _examples(name, "train", str(tmp_path)) for name in BUILTIN} == before


def test_builtin_tasks_have_no_test_split(docs_dir):
    with pytest.raises(ValueError, match="'builtin_reverse' has no split 'test'; "
                                         "its splits: train, validation"):
        tasks.get_task("builtin_reverse").examples("test", docs_dir)
    with pytest.raises(ValueError, match="built-in tasks have no split 'dev'; "
                                         "choose one of train, validation"):
        builtin.word_sequences("dev", docs_dir, None)


# ---------------------------------------------------------------------------------------------
# The `small` preset's local tasks, each read from the real files of ../shared/data.


def _head_of_shared_data(shared, root, rows: int = 6) -> None:
    """`root`: ../shared/data cut to its first `rows` records per file (a header line kept),
    so TFDS builds each task in a moment. The SQuAD file keeps its first 12 articles with one
    paragraph each (10 are held out for validation)."""
    for directory, _, files in os.walk(shared):
        for name in files:
            source = os.path.join(directory, name)
            target = os.path.join(root, os.path.relpath(source, shared))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if name.endswith(".json"):
                with open(source, encoding="utf-8") as f:
                    squad = json.load(f)
                squad["data"] = [dict(a, paragraphs=a["paragraphs"][:1])
                                 for a in squad["data"][:12]]
                with open(target, "w", encoding="utf-8") as f:
                    json.dump(squad, f)
            elif name.endswith((".tsv", ".jsonl", ".en", ".de", ".fr", ".ro")):
                with open(source, encoding="utf-8") as f:
                    head = [line for _, line in zip(range(rows + 1), f)]
                with open(target, "w", encoding="utf-8") as f:
                    f.writelines(head)


def _tsv_rows(path: str, header: bool) -> list[list[str]]:
    """A GLUE file's rows as GLUE ships them: tab-separated, no quoting, MRPC's byte-order mark
    dropped."""
    with open(path, encoding="utf-8-sig") as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    return rows[1:] if header else rows


def _first_rows_by_hand(root: str, name: str, split: str) -> tuple[int, str, str]:
    """(number of records, first inputs, first targets) of `name`'s `split`, transcribed
    directly from the file's rows with the paper's appendix D templates."""
    glue = os.path.join(root, "glue")
    dev_or_train = "dev" if split == "validation" else "train"
    if name == "local_glue_cola":  # no header: source, label, author's mark, sentence
        rows = _tsv_rows(os.path.join(glue, "CoLA", f"{dev_or_train}.tsv"), header=False)
        return len(rows), f"cola sentence: {rows[0][3]}", (
            "unacceptable", "acceptable")[int(rows[0][1])]
    if name == "local_glue_sst2":  # sentence, label
        rows = _tsv_rows(os.path.join(glue, "SST-2", f"{dev_or_train}.tsv"), header=True)
        return len(rows), f"sst2 sentence: {rows[0][0]}", ("negative", "positive")[int(rows[0][1])]
    if name == "local_glue_mrpc":  # Quality, #1 ID, #2 ID, #1 String, #2 String
        rows = _tsv_rows(os.path.join(glue, "MRPC", f"{dev_or_train}.tsv"), header=True)
        return len(rows), f"mrpc sentence1: {rows[0][3]} sentence2: {rows[0][4]}", (
            "not_equivalent", "equivalent")[int(rows[0][0])]
    if name == "local_glue_stsb":  # ..., sentence1, sentence2, score (rounded to a fifth)
        rows = _tsv_rows(os.path.join(glue, "STS-B", f"{dev_or_train}.tsv"), header=True)
        return len(rows), f"stsb sentence1: {rows[0][7]} sentence2: {rows[0][8]}", (
            f"{round(float(rows[0][9]) * 5) / 5:.1f}")
    if name == "local_glue_rte":  # index, sentence1, sentence2, label
        rows = _tsv_rows(os.path.join(glue, "RTE", f"{dev_or_train}.tsv"), header=True)
        return len(rows), f"rte sentence1: {rows[0][1]} sentence2: {rows[0][2]}", rows[0][3]
    if name == "local_squad":  # the last 10 articles validate, the others train
        with open(os.path.join(root, "squad", "dev-v1.1.json"), encoding="utf-8") as f:
            articles = json.load(f)["data"]
        articles = articles[-10:] if split == "validation" else articles[:-10]
        questions = [(qa, p["context"]) for a in articles for p in a["paragraphs"]
                     for qa in p["qas"]]
        qa, context = questions[0]
        return len(questions), " ".join(
            f"question: {qa['question']} context: {context}".split()), qa["answers"][0]["text"]
    if name == "local_dialogsum":
        with open(os.path.join(root, "summarization", "dialogsum", f"{dev_or_train}.jsonl"),
                  encoding="utf-8") as f:
            records = [json.loads(line) for line in f]
        return len(records), f"summarize: {records[0]['dialogue']}", records[0]["summary"]
    directory, target, language, stem = {
        "local_multi30k_ende": ("multi30k", "de", "German", "val"),
        "local_multi30k_enfr": ("multi30k", "fr", "French", "val"),
        "local_rosts_enro": ("en-ro_ro-sts", "ro", "Romanian", "dev"),
    }[name]
    stem = stem if split == "validation" else "train"
    def read(stem, code):
        with open(os.path.join(root, "translation", directory, f"{stem}.{code}"),
                  encoding="utf-8") as f:
            return f.read().splitlines()

    pairs = list(zip(read(stem, "en"), read(stem, target)))
    if name == "local_rosts_enro" and split == "train":  # without validation's or test's sources
        held_out = {*read("dev", "en"), *read("test", "en")}
        pairs = [(en, other) for en, other in pairs if en not in held_out]
    return len(pairs), f"translate English to {language}: {pairs[0][0]}", pairs[0][1]


def test_ro_sts_trains_on_no_sentence_it_validates_or_tests_on(tmp_path):
    """RO-STS translates STS-B's sentences, which STS-B reuses across its splits: 306 of its
    3,000 validation sources were in train too. Train leaves out every pair whose English
    side is a validation or test source; validation and test keep all of theirs."""
    directory = tmp_path / "root" / "translation" / "en-ro_ro-sts"
    directory.mkdir(parents=True)
    splits = {"train": ["a", "b", "c", "d"], "dev": ["b", "e"], "test": ["d", "f"]}
    for stem, sources in splits.items():
        (directory / f"{stem}.en").write_text("".join(f"{s}\n" for s in sources))
        (directory / f"{stem}.ro").write_text("".join(f"{s} ro\n" for s in sources))
    task = tasks.get_task("local_rosts_enro")
    read = {split: [ex.targets for ex in task.examples(split, str(tmp_path / "build"),
                                                        str(tmp_path / "root"))]
            for split in ("train", "validation", "test")}
    assert read == {"train": ["a ro", "c ro"], "validation": ["b ro", "e ro"],
                    "test": ["d ro", "f ro"]}


@pytest.fixture(scope="module")
def shared_data_head(tmp_path_factory):
    """The first rows of ../shared/data (`_head_of_shared_data`), cut once for the module;
    skips (fails under CI=true) without ../shared/data."""
    root = str(tmp_path_factory.mktemp("shared_data_head"))
    _head_of_shared_data(require_shared_data(), root)
    return root


@pytest.mark.parametrize("name", presets.LOCAL_TASKS)
def test_every_local_task_of_the_small_preset_reads_its_shared_files(name, shared_data_head,
                                                                     tmp_path):
    """Each task the `small` preset fine-tunes on reads its train and validation records from
    the real files (their first rows), formatted as the paper formats the task."""
    root = shared_data_head
    task = tasks.get_task(name)
    for split in ("train", "validation"):
        examples = task.examples(split, str(tmp_path / "build"), root)
        count, inputs, targets = _first_rows_by_hand(root, name, split)
        assert len(examples) == count > 0, split
        assert (examples[0].inputs, examples[0].targets) == (inputs, targets), split


def test_the_readme_s_task_file_registers_a_task_that_scoring_reads(tmp_path, monkeypatch):
    """The README's "a fine-tuning task of one's own" block, run as written: its task reads
    its files under data.data_root, formats and scores them, and ranks zero-shot; a second
    run of the file, and records that could not work, are refused naming the task."""
    import dataclasses

    from t5x_lite import zero_shot

    monkeypatch.setattr(tasks, "TASKS", dict(tasks.TASKS))
    block = readme_python_block('"my_sentiment"')
    exec(block, namespace := {})
    config = namespace["get_config"]()
    assert config.finetune.tasks == ("my_sentiment",)
    (tmp_path / "my_sentiment").mkdir()
    for split, rows in (("train", "fine\t1\nawful\t0\n"), ("dev", "great\t1\nbad\t0\n")):
        (tmp_path / "my_sentiment" / f"{split}.tsv").write_text(rows)
    task = tasks.get_task("my_sentiment", "finetune.tasks")
    examples = task.examples("validation", None, str(tmp_path))
    assert [(e.inputs, e.targets) for e in examples] == [
        ("my_sentiment sentence: great", "positive"), ("my_sentiment sentence: bad", "negative")]
    assert task.score(examples, ["positive", "positive"]) == {"accuracy": 50.0}
    assert zero_shot.not_applicable(task) is None
    with pytest.raises(ValueError, match="^task 'my_sentiment' is already registered; a file "):
        exec(block, {})
    for change, message in ((dict(name="my task"), "a name is letters, digits"),
                            (dict(metric_names=("acc",)), "unknown: acc$"),
                            (dict(splits={"dev": "dev"}), "splits maps some of train, "),
                            (dict(label_options=("a", "a")), "label_options repeat")):
        with pytest.raises(ValueError, match=message):
            tasks.register(dataclasses.replace(task, **{"name": "other", **change}))
