"""Presets that read real data: the corpus follows data.data_root, missing text stops a run
before any work, the corpus is in every sweep record, and the `cpu` preset's sweep."""
import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

from t5x_lite import presets, sweep, train
from t5x_lite.config import ConfigError
from t5x_lite.data import pipeline, tasks

REPO = Path(__file__).resolve().parent.parent
DATA_ROOT_PRESETS = ("small", "cpu")


def write_pretrain_text(root: Path) -> None:
    """One part file of two blank-line separated documents, laid out like shared/data."""
    (root / "pretrain" / "wiki").mkdir(parents=True)
    (root / "pretrain" / "wiki" / "part-000.txt").write_text("Title one\nText.\n\nTitle two\n")


@pytest.mark.parametrize("name", DATA_ROOT_PRESETS)
def test_missing_pretrain_text_stops_a_run_before_any_work(name, tmp_path):
    config = presets.get_preset(name)
    config.data.update(data_root=str(tmp_path), data_dir=str(tmp_path / "cache"))
    message = (f"data.corpus='{tmp_path}/pretrain/\\*/part-\\*.txt' matches no file: the "
               f"pre-training text under data.data_root='{tmp_path}' is missing")
    with pytest.raises(ConfigError, match=message):
        train.train(config, tmp_path / "run")
    # Nothing was written: no workdir, no vocabulary or tokens in the cache.
    assert sorted(os.listdir(tmp_path)) == []


def test_train_command_names_the_missing_path_in_one_line(tmp_path):
    """`t5x-lite train --preset small` with a data root that lacks the text: one line, exit 1."""
    run = subprocess.run(
        [sys.executable, "-m", "t5x_lite.cli", "train", "--preset", "small",
         f"--workdir={tmp_path / 'run'}", f"--config.data.data_root={tmp_path}"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last == (f"t5x-lite train: invalid config: data.corpus='{tmp_path}/pretrain/*/"
                    f"part-*.txt' matches no file: the pre-training text under "
                    f"data.data_root='{tmp_path}' is missing")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", DATA_ROOT_PRESETS)
def test_the_corpus_follows_a_data_root_override(name, tmp_path):
    write_pretrain_text(tmp_path)
    config = presets.sweep_preset(name)
    sweep.apply_overrides(config, {"data.data_root": str(tmp_path)})
    assert config.data.corpus == f"{tmp_path}/{presets.PRETRAIN_TEXT}"
    assert pipeline.describe_corpus(config) == f"{config.data.corpus} (1 files, 0.0 MB)"
    # The local tasks read the same root.
    assert config.data.data_root == str(tmp_path)
    # Setting the corpus itself replaces the link.
    config.data.corpus = "python_docs"
    config.data.data_root = "/elsewhere"
    assert config.data.corpus == "python_docs"


def test_presets_without_a_data_root_keep_the_built_in_corpus():
    for name in ("tiny", "demo", "paper"):
        data = presets.sweep_preset(name).data
        assert (data.corpus, data.data_root) == ("python_docs", ""), name


def test_the_preset_corpus_is_the_shared_english_text(monkeypatch, shared_data):
    shared_data("pretrain")  # skips (fails under CI=true) without ../shared/data
    monkeypatch.chdir(REPO)  # the presets' data root is relative to a checkout beside shared/
    assert os.path.samefile(presets.SHARED_DATA_ROOT, shared_data())
    for name in DATA_ROOT_PRESETS:
        config = presets.get_preset(name)
        paths = glob.glob(config.data.corpus)
        # SOURCES.md: enwiki_sample part-000..016 and enwikinews_sample part-000..004.
        assert sorted({Path(p).parent.name for p in paths}) == ["enwiki_sample",
                                                                 "enwikinews_sample"]
        assert len(paths) == 22
        assert pipeline.describe_corpus(config).startswith(f"{config.data.corpus} (22 files, ")


def test_every_sweep_record_names_its_corpus():
    points = sweep.expand("table2", "cpu", ["data.data_root=/data"])
    assert {sweep._base_record(p)["corpus"] for p in points} == {"/data/pretrain/*/part-*.txt"}
    tiny = sweep.expand("table2", "tiny")[0]
    assert sweep._base_record(tiny)["corpus"] == "python_docs"


def test_the_cpu_sweep_covers_table2_three_seeds_and_three_kinds_of_task():
    points = sweep.expand("table2", "cpu")
    assert len(points) == 30
    assert sorted({p.seed for p in points}) == [0, 1, 2]
    config = points[0].config
    # Single-sentence classification, a sentence pair, and generation.
    kinds = {task: tasks.get_task(task).metric_names for task in config.sweep.tasks}
    assert kinds == {"local_glue_sst2": ("accuracy",),
                     "local_glue_stsb": ("pearson_corrcoef", "spearman_corrcoef"),
                     "local_multi30k_ende": ("bleu",)}
    assert config.data.corpus == f"{presets.SHARED_DATA_ROOT}/{presets.PRETRAIN_TEXT}"
