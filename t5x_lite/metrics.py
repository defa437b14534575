"""Task metrics as the T5 paper reports them, on a 0-100 scale.

Every metric takes `(targets, predictions)` (equal-length sequences, already post-processed:
class ids, floats or strings) and returns a dict of named scores, so a task can list several and
merge the dicts. Names and conventions follow T5's `t5/evaluation/metrics.py`:

  accuracy             accuracy                      SST-2, MNLI, QNLI, RTE, WNLI
  position_accuracy    words in the right position   the built-in word tasks (not the paper's)
  matthews_corrcoef    Matthews correlation          CoLA
  f1                   binary F1 (positive class 1)  MRPC, QQP (with accuracy)
  pearson_corrcoef     Pearson r                     STS-B (with spearman_corrcoef)
  spearman_corrcoef    Spearman rho
  squad                exact match `em` and token `f1`, max over gold answers      SQuAD
  bleu                 corpus BLEU (sacrebleu)       WMT
  rouge                rouge1, rouge2, rougeLsum F-measures (rouge-score)          CNN/DM

The paper's ablation tables show ROUGE-2-F for CNN/DM and exact match for SQuAD; its final table
also lists ROUGE-1/L and SQuAD F1.

`sacrebleu` and `rouge-score` are optional (`pip install t5x-lite[metrics]`) and imported only when
BLEU or ROUGE is computed. Neither downloads anything at run time: rouge-score's stemmer is NLTK's
rule-based Porter stemmer, and NLTK data is only needed for sentence splitting, which we leave off.
"""
from __future__ import annotations

import collections
import importlib
import re
import string
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import scipy.stats

Scores = dict[str, float]


def _check_lengths(targets: Sequence[Any], predictions: Sequence[Any]) -> None:
    if len(targets) != len(predictions):
        raise ValueError(
            f"targets and predictions must have the same length, got {len(targets)} targets "
            f"and {len(predictions)} predictions"
        )
    if not targets:
        raise ValueError("targets and predictions are empty; a metric needs at least one example")


def accuracy(targets: Sequence[Any], predictions: Sequence[Any]) -> Scores:
    """Percentage of predictions equal to their target."""
    _check_lengths(targets, predictions)
    hits = [t == p for t, p in zip(targets, predictions)]
    return {"accuracy": 100.0 * float(np.mean(hits))}


def position_accuracy(targets: Sequence[str], predictions: Sequence[str]) -> Scores:
    """Percentage of words in the right position, averaged over examples: a graded exact match.

    Words are the whitespace-separated tokens. An example scores the number of positions i
    where the prediction's i-th word is the target's i-th word, over the number of words of the
    longer of the two, so a missing or an extra word costs like a wrong one (and a shifted
    sequence matches only up to the shift). Two empty strings match fully. Not a metric of the
    paper: it grades the built-in word tasks, where a tiny model rarely gets a whole sequence.
    """
    _check_lengths(targets, predictions)
    scores = []
    for target, prediction in zip(targets, predictions):
        target_words, predicted_words = target.split(), prediction.split()
        longer = max(len(target_words), len(predicted_words))
        hits = sum(t == p for t, p in zip(target_words, predicted_words))
        scores.append(hits / longer if longer else 1.0)
    return {"position_accuracy": 100.0 * float(np.mean(scores))}


def matthews_corrcoef(targets: Sequence[int], predictions: Sequence[int]) -> Scores:
    """Matthews correlation x 100 over all labels seen (the multiclass form sklearn computes).

    An invalid prediction (-1 from post-processing) is just one more class, so it counts as wrong.
    A constant target or prediction column gives 0, not NaN, as in sklearn.
    """
    _check_lengths(targets, predictions)
    labels = sorted(set(targets) | set(predictions))
    index = {label: i for i, label in enumerate(labels)}
    confusion = np.zeros((len(labels), len(labels)), dtype=np.float64)
    for t, p in zip(targets, predictions):
        confusion[index[t], index[p]] += 1
    total = confusion.sum()
    correct = np.trace(confusion)
    true_counts, pred_counts = confusion.sum(axis=1), confusion.sum(axis=0)
    numerator = correct * total - pred_counts @ true_counts
    denominator = np.sqrt(
        (total**2 - pred_counts @ pred_counts) * (total**2 - true_counts @ true_counts)
    )
    return {"matthews_corrcoef": 0.0 if denominator == 0 else 100.0 * numerator / denominator}


def f1(targets: Sequence[int], predictions: Sequence[int]) -> Scores:
    """Binary F1 x 100 for the positive class 1; a prediction other than 0 or 1 counts as wrong."""
    _check_lengths(targets, predictions)
    # An invalid prediction is a miss: a false negative on a positive target, a false positive
    # on a negative one (T5's `f1_score_with_invalid`).
    true_pos = sum(t == 1 and p == 1 for t, p in zip(targets, predictions))
    false_pos = sum(t != 1 and p != 0 for t, p in zip(targets, predictions))
    false_neg = sum(t == 1 and p != 1 for t, p in zip(targets, predictions))
    denominator = 2 * true_pos + false_pos + false_neg
    return {"f1": 0.0 if denominator == 0 else 100.0 * 2 * true_pos / denominator}


def pearson_corrcoef(targets: Sequence[float], predictions: Sequence[float]) -> Scores:
    """Pearson correlation x 100 (NaN when either side is constant)."""
    _check_lengths(targets, predictions)
    return {"pearson_corrcoef": 100.0 * float(scipy.stats.pearsonr(targets, predictions)[0])}


def spearman_corrcoef(targets: Sequence[float], predictions: Sequence[float]) -> Scores:
    """Spearman rank correlation x 100 (ties share average ranks; NaN if a side is constant)."""
    _check_lengths(targets, predictions)
    return {"spearman_corrcoef": 100.0 * float(scipy.stats.spearmanr(targets, predictions)[0])}


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_squad_answer(text: str) -> str:
    """The official SQuAD v1.1 answer normalisation: lowercase, drop ASCII punctuation and the
    articles a/an/the, and collapse whitespace."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _token_f1(gold: str, prediction: str) -> float:
    gold_tokens, pred_tokens = gold.split(), prediction.split()
    common = sum((collections.Counter(gold_tokens) & collections.Counter(pred_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad(targets: Sequence[Sequence[str]], predictions: Sequence[str]) -> Scores:
    """SQuAD exact match `em` and token `f1` x 100; each prediction scores its best gold answer."""
    _check_lengths(targets, predictions)
    em, f1_scores = [], []
    for golds, prediction in zip(targets, predictions):
        if not golds:
            raise ValueError("squad: every example needs at least one gold answer, got none")
        golds = [normalize_squad_answer(g) for g in golds]
        prediction = normalize_squad_answer(prediction)
        em.append(max(float(g == prediction) for g in golds))
        f1_scores.append(max(_token_f1(g, prediction) for g in golds))
    return {"em": 100.0 * float(np.mean(em)), "f1": 100.0 * float(np.mean(f1_scores))}


def _import_optional(module: str, package: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"this metric needs the optional package {package!r}; install it with "
            "`pip install t5x-lite[metrics]`"
        ) from error


def bleu(
    targets: Sequence[Sequence[str]], predictions: Sequence[str], tokenize: str = "intl"
) -> Scores:
    """Corpus BLEU from sacrebleu with the paper's settings: exponential smoothing, cased, and
    the 'intl' tokeniser (the paper: "SacreBLEU v1.3.0 with 'exp' smoothing and 'intl'
    tokenization"; pass tokenize='13a' for sacrebleu's default). `targets[i]` holds every
    reference for example i; all examples must have the same number of references."""
    _check_lengths(targets, predictions)
    sacrebleu = _import_optional("sacrebleu", "sacrebleu")
    num_refs = {len(refs) for refs in targets}
    if len(num_refs) != 1 or 0 in num_refs:
        raise ValueError("bleu: every example needs the same number (>= 1) of references, "
                         f"got {sorted(num_refs)}")
    # sacrebleu wants one stream per reference position, not one list per example.
    streams = [list(stream) for stream in zip(*targets)]
    result = sacrebleu.corpus_bleu(
        list(predictions), streams, smooth_method="exp", lowercase=False, tokenize=tokenize
    )
    return {"bleu": float(result.score)}


def rouge(targets: Sequence[str], predictions: Sequence[str], use_stemmer: bool = False) -> Scores:
    """Mean ROUGE-1, ROUGE-2 and ROUGE-Lsum F-measures x 100 from rouge-score.

    As T5: no stemmer by default, and " . " becomes " .\\n" so ROUGE-Lsum sees sentence breaks.
    T5 reports the median of a bootstrap resample; we report the plain mean, which that median
    estimates, so results are deterministic.
    """
    _check_lengths(targets, predictions)
    rouge_scorer = _import_optional("rouge_score.rouge_scorer", "rouge-score")
    keys = ("rouge1", "rouge2", "rougeLsum")
    scorer = rouge_scorer.RougeScorer(list(keys), use_stemmer=use_stemmer)
    totals = dict.fromkeys(keys, 0.0)
    for target, prediction in zip(targets, predictions):
        scores = scorer.score(target.replace(" . ", " .\n"), prediction.replace(" . ", " .\n"))
        for key in keys:
            totals[key] += scores[key].fmeasure
    return {key: 100.0 * total / len(targets) for key, total in totals.items()}


class Metric(NamedTuple):
    """A metric function and whether its targets are lists of references (one list per example)."""

    fn: Callable[..., Scores]
    multi_reference: bool


METRICS: dict[str, Metric] = {
    "accuracy": Metric(accuracy, False),
    "position_accuracy": Metric(position_accuracy, False),
    "matthews_corrcoef": Metric(matthews_corrcoef, False),
    "f1": Metric(f1, False),
    "pearson_corrcoef": Metric(pearson_corrcoef, False),
    "spearman_corrcoef": Metric(spearman_corrcoef, False),
    "squad": Metric(squad, True),
    "bleu": Metric(bleu, True),
    "rouge": Metric(rouge, False),
}


def get_metric(name: str) -> Metric:
    """Look a metric up by name; the error lists the known names."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; known metrics: {', '.join(sorted(METRICS))}")
    return METRICS[name]
