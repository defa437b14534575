"""Each metric against a case worked out by hand (the arithmetic is written next to it)."""
import math
import sys

import pytest

from t5x_lite import metrics


def test_accuracy():
    # 3 of 4 right.
    assert metrics.accuracy([0, 1, 1, 0], [0, 1, 0, 0]) == {"accuracy": 75.0}


def test_position_accuracy():
    # Per example, words in the right position over the longer sequence's length:
    #   "c b a" / "c b a"   3 of 3 = 1
    #   "c b a" / "c a b"   c only: 1 of 3
    #   "d c b a" / "d c"   a missing tail: 2 of 4
    #   "b a" / "b a a"     an extra word: 2 of 3
    #   "c b a" / "x c b a" shifted by one: nothing lines up, 0 of 4
    #   "a" / ""            nothing predicted: 0 of 1
    # Mean (1 + 1/3 + 1/2 + 2/3 + 0 + 0) / 6 = 2.5 / 6.
    targets = ["c b a", "c b a", "d c b a", "b a", "c b a", "a"]
    predictions = ["c b a", "c a b", "d c", "b a a", "x c b a", ""]
    score = metrics.position_accuracy(targets, predictions)["position_accuracy"]
    assert score == pytest.approx(100 * 2.5 / 6)
    assert metrics.accuracy(targets, predictions)["accuracy"] == pytest.approx(100 / 6)


def test_position_accuracy_splits_on_any_whitespace_and_matches_empty_to_empty():
    # Words, not characters: extra spaces change nothing; two empty strings agree (1 of 1).
    assert metrics.position_accuracy(["a  b", ""], [" a b ", ""]) == {"position_accuracy": 100.0}
    # Case matters, as in exact match: "A" is not "a" (1 of 2).
    assert metrics.position_accuracy(["a b"], ["A b"]) == {"position_accuracy": 50.0}


def test_matthews_binary():
    # tp=2 fn=1 tn=1 fp=1: (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6.
    score = metrics.matthews_corrcoef([1, 1, 1, 0, 0], [1, 1, 0, 0, 1])["matthews_corrcoef"]
    assert score == pytest.approx(100 / 6)


def test_matthews_counts_invalid_prediction_as_its_own_class():
    # Labels -1, 0, 1; correct c=3 of s=4; true counts t=(0, 2, 2), predicted p=(1, 2, 1).
    # (c*s - p.t) / sqrt((s^2 - p.p)(s^2 - t.t)) = (12 - 6) / sqrt((16 - 6)(16 - 8)) = 6 / sqrt(80).
    score = metrics.matthews_corrcoef([1, 1, 0, 0], [1, -1, 0, 0])["matthews_corrcoef"]
    assert score == pytest.approx(100 * 6 / math.sqrt(80))


def test_matthews_constant_prediction_is_zero():
    assert metrics.matthews_corrcoef([1, 0, 1], [1, 1, 1]) == {"matthews_corrcoef": 0.0}


def test_f1_binary():
    # tp=2 fp=1 fn=1: precision = recall = 2/3, F1 = 2/3.
    assert metrics.f1([1, 1, 0, 0, 1], [1, 0, 1, 0, 1])["f1"] == pytest.approx(200 / 3)


def test_f1_invalid_prediction_is_wrong_either_way():
    # target 1 / pred 1: tp; target 1 / pred -1: fn; target 0 / pred -1: fp.  2*1 / (2 + 1 + 1).
    assert metrics.f1([1, 1, 0], [1, -1, -1])["f1"] == pytest.approx(50.0)


def test_pearson_and_spearman():
    # Deviations (-1, 0, 1) and (-1, 1, 0): covariance 1, variances 2 and 2, r = 1/2; the values
    # are their own ranks, so Spearman is 1/2 too.
    targets, predictions = [1, 2, 3], [1, 3, 2]
    assert metrics.pearson_corrcoef(targets, predictions)["pearson_corrcoef"] == pytest.approx(50.0)
    spearman = metrics.spearman_corrcoef(targets, predictions)["spearman_corrcoef"]
    assert spearman == pytest.approx(50.0)


def test_spearman_sees_only_order():
    # y = x^2 keeps the order (rho = 1); Pearson: deviations (-1.5, -.5, .5, 1.5) and
    # (-6.5, -3.5, 1.5, 8.5), r = 25 / sqrt(5 * 129).
    x, y = [1, 2, 3, 4], [1, 4, 9, 16]
    assert metrics.spearman_corrcoef(x, y)["spearman_corrcoef"] == pytest.approx(100.0)
    pearson = metrics.pearson_corrcoef(x, y)["pearson_corrcoef"]
    assert pearson == pytest.approx(100 * 25 / math.sqrt(645))


def test_squad_normalisation():
    # lowercase -> "the  cat's hat!", drop punctuation -> "the  cats hat", drop articles, squeeze.
    assert metrics.normalize_squad_answer("The  Cat's hat!") == "cats hat"
    assert metrics.normalize_squad_answer("An apple, a theory") == "apple theory"


def test_squad_em_and_f1_take_the_best_gold_answer():
    targets = [["the Eiffel Tower", "Eiffel Tower in Paris"], ["carbon monoxide"]]
    predictions = ["Eiffel tower", "monoxide gas"]
    # Example 1 matches gold 1 exactly (EM 1, F1 1). Example 2: EM 0; 1 common token,
    # precision 1/2, recall 1/2, F1 1/2.  EM = 50, F1 = (1 + 0.5) / 2 = 75.
    scores = metrics.squad(targets, predictions)
    assert scores["em"] == pytest.approx(50.0)
    assert scores["f1"] == pytest.approx(75.0)


def test_bleu_modified_precisions():
    # hyp "the cat sat on the mat" vs ref "the cat sat on a mat", both 6 tokens (BP = 1):
    # 1-grams 5/6 ("the" clipped to 1), 2-grams 3/5, 3-grams 2/4, 4-grams 1/3.
    # BLEU = (5/6 * 3/5 * 1/2 * 1/3) ** (1/4) = (1/12) ** (1/4).
    score = metrics.bleu([["the cat sat on a mat"]], ["the cat sat on the mat"])["bleu"]
    assert score == pytest.approx(100 * (1 / 12) ** 0.25, abs=1e-6)


def test_bleu_brevity_penalty_and_multiple_references():
    # 5 of 6 reference tokens, all n-grams right: BP = exp(1 - 6/5).
    score = metrics.bleu([["the cat sat on a mat"]], ["the cat sat on a"])["bleu"]
    assert score == pytest.approx(100 * math.exp(-0.2), abs=1e-6)
    # A second reference that matches exactly makes every n-gram count.
    both = metrics.bleu([["a dog ran", "the cat sat on the mat"]], ["the cat sat on the mat"])
    assert both["bleu"] == pytest.approx(100.0)


def test_bleu_rejects_ragged_references():
    with pytest.raises(ValueError, match="same number"):
        metrics.bleu([["a b c"], ["a b", "c d"]], ["a b c", "a b"])


def test_rouge():
    # target "the cat sat on the mat", prediction "the cat lay on the mat" (6 tokens each):
    # unigrams in common the x2, cat, on, mat = 5 -> F = 5/6; bigrams in common
    # "the cat", "on the", "the mat" of 5 -> 3/5; LCS "the cat on the mat" = 5 -> 5/6.
    scores = metrics.rouge(["the cat sat on the mat"], ["the cat lay on the mat"])
    assert scores["rouge1"] == pytest.approx(500 / 6)
    assert scores["rouge2"] == pytest.approx(60.0)
    assert scores["rougeLsum"] == pytest.approx(500 / 6)


def test_rouge_stemmer_is_optional():
    # "cats"/"cat" only match once Porter-stemmed.
    assert metrics.rouge(["cats sat"], ["cat sat"])["rouge1"] == pytest.approx(50.0)
    stemmed = metrics.rouge(["cats sat"], ["cat sat"], use_stemmer=True)
    assert stemmed["rouge1"] == pytest.approx(100.0)


@pytest.mark.parametrize(
    "module, call",
    [
        ("sacrebleu", lambda: metrics.bleu([["a"]], ["a"])),
        ("rouge_score.rouge_scorer", lambda: metrics.rouge(["a"], ["a"])),
    ],
)
def test_missing_optional_package_says_how_to_install(monkeypatch, module, call):
    monkeypatch.setitem(sys.modules, module, None)  # makes the import fail
    with pytest.raises(ImportError, match=r"pip install t5x-lite\[metrics\]"):
        call()


def test_length_mismatch_and_empty_input_are_rejected():
    with pytest.raises(ValueError, match="2 targets and 1 predictions"):
        metrics.accuracy([0, 1], [0])
    with pytest.raises(ValueError, match="empty"):
        metrics.f1([], [])


def test_get_metric_lists_known_names():
    assert metrics.get_metric("squad").multi_reference
    with pytest.raises(ValueError, match="unknown metric 'bleu4'.*accuracy.*spearman_corrcoef"):
        metrics.get_metric("bleu4")
