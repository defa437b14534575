"""Sweeps: the experiment grids, a tiny sweep end to end, kill-and-rerun, failures, bad input."""
import dataclasses
import fcntl
import json
import re
import os
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from t5x_lite import (accounting, architectures, cli, grid, launchers, noise_lengths,
                      objective_registry, report, results, sweep, sweep_plan, sweep_point,
                      sweep_workdir, train)
from t5x_lite.checkpointing import newest_step
from t5x_lite.config import ConfigError
from t5x_lite.data import tasks
from t5x_lite.preemption import Preempted
from t5x_lite.saved_config import BATCH_LAYOUT_FILE, CHECKPOINTS_DIR

from compile_events import cold_program_cache

# A three-point sweep of tiny models: two encoder-decoder points of one parameter structure
# (so they must share one compiled pre-train step) around a point that fails when it runs: its
# vocabulary file is no SentencePiece model, which (unlike a missing file or corpus, refused at
# expansion) only the run finds out.
TINY_EXPERIMENT = '''
from tiny_configs import tiny_sweep_config

GRID = (
    dict(point="denoising", row="Encoder-decoder", objective="Denoising",
         overrides={"objective.name": "span_corruption"}),
    # A run that diverges (loss NaN at its first check): a failure no check before the run
    # can see.
    dict(point="broken", row="Enc-dec, shared", objective="Denoising",
         overrides={"train.learning_rate": 1e30}),
    dict(point="prefix_lm", row="Encoder-decoder", objective="LM",
         overrides={"objective.name": "prefix_lm"}),
)


def get_config(preset):
    return tiny_sweep_config(preset)
'''
# The contract's record fields (s2 contract, section 4).
RECORD_FIELDS = {
    "experiment", "preset", "point", "row", "objective", "config_hash", "seed", "task", "params",
    "params_label", "cost_label", "pretrain_steps", "pretrain_tokens", "finetune_steps", "wall_s",
    "compile_s", "compiles", "pretrain_loss", "pretrain_curve", "held_out_loss",
    "held_out_token_accuracy", "held_out_examples", "held_out_curve", "metrics", "status", "error",
}
# The paper's row labels, copied from the contract.
PAPER_ROWS = {
    "table2": ["Encoder-decoder", "Enc-dec, shared", "Enc-dec, 6 layers", "Language model",
               "Prefix LM"] * 2,
    "table4": ["Prefix language modeling", "BERT-style", "Deshuffling"],
    "table5": ["BERT-style", "MASS-style", "Replace corrupted spans", "Drop corrupted tokens"],
    "table6": ["10%", "15%", "25%", "50%"],
    "table7": ["i.i.d.", "2", "3", "5", "10"],
}
# The objective of each row (Table 2: of its Denoising rows); i.i.d. corruption is the
# paper's baseline, span_corruption draws T5's random spans.
ROW_OBJECTIVES = {
    "table2": ["iid_denoising"] * 5,
    "table4": ["prefix_lm", "bert_style", "deshuffling"],
    "table5": ["bert_style", "mass_style", "iid_denoising", "drop_corrupted_tokens"],
    "table6": ["iid_denoising"] * 4,
    "table7": ["iid_denoising"] + ["span_corruption"] * 4,
}


def _without_timing(records):
    return sorted(
        ({k: v for k, v in r.items() if k not in sweep_point.TIMING_FIELDS} for r in records),
        key=lambda r: (r["point"], r["seed"], r["task"]),
    )


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    path = tmp_path_factory.mktemp("experiments") / "tiny_grid.py"
    path.write_text(TINY_EXPERIMENT)
    return str(path)


@pytest.fixture(scope="module")
def uninterrupted(experiment, tmp_path_factory):
    """(workdir, records) of the tiny sweep run once, start to end, in this process, on a cold
    program cache: its compile counts do not depend on what ran before it."""
    workdir = tmp_path_factory.mktemp("sweep")
    with cold_program_cache():
        return workdir, sweep.run_sweep(experiment, "demo", str(workdir))


# Table 7 at demo warns of its rows that pre-train alike; tests/test_identical_rows.py checks it.
@pytest.mark.filterwarnings("ignore:table7 --preset demo.*will give the same records")
@pytest.mark.parametrize("experiment_name", sorted(PAPER_ROWS))
def test_grids_have_the_paper_rows_and_one_layout_per_family(experiment_name):
    for preset in ("demo", "paper"):
        points = grid.expand(experiment_name, preset)
        assert [p.row for p in points] == PAPER_ROWS[experiment_name]
        assert [p.config.objective.name for p in points if p.objective in (None, "Denoising")] \
            == ROW_OBJECTIVES[experiment_name]
        assert len({p.point for p in points}) == len(points)
        layouts = {}
        for point in points:
            family = point.layout.family
            assert layouts.setdefault(family, point.layout) == point.layout
            assert point.config.objective.inputs_length <= point.layout.inputs_length
    if experiment_name == "table2":
        objective_names = {(p.config.model.arch, p.objective): p.config.objective.name
                           for p in points}
        assert objective_names[("encoder_decoder", "LM")] == "prefix_lm"
        assert objective_names[("language_model", "LM")] == "lm"
        assert objective_names[("prefix_lm", "LM")] == "prefix_lm"
        assert objective_names[("language_model", "Denoising")] == "iid_denoising"
        paper = {p.point: sweep_point.base_record(p) for p in points}
        assert paper["encoder_decoder/denoising"]["params_label"] == "2P"
        assert paper["encoder_decoder_half/lm"]["cost_label"] == "M/2"
        assert {record["grid_rows"] for record in paper.values()} == {10}  # 5 archs x 2 objectives


@pytest.mark.parametrize("preset, sentinels", [("demo", 100), ("tiny", 100), ("paper", 156)])
def test_table6_rows_share_the_sentinels_the_50_percent_row_needs(preset, sentinels):
    points = grid.expand("table6", preset)
    needed = noise_lengths.iid_lengths("iid_denoising", points[-1].config.objective.inputs_length,
                                       0.5).num_sentinels
    assert {p.config.model.num_sentinels for p in points} == {max(100, needed)} == {sentinels}
    assert {p.layout.num_sentinels for p in points} == {sentinels}


def test_a_train_seed_override_is_refused_naming_sweep_seeds():
    """Each point's seed is one of sweep.seeds: --config.train.seed changed no point, silently."""
    with pytest.raises(ConfigError, match=r"^train.seed=5 would change no point: .* pass "
                                          r"--config.sweep.seeds=\"\(5,\)\" instead "
                                          r"\(preview: --seed\)$"):
        grid.expand("table6", "demo", ["--config.train.seed=5"])


def test_overrides_apply_to_every_point_and_the_rows_win():
    points = grid.expand("table6", "demo", ["--config.train.steps=70"])
    assert {p.config.train.steps for p in points} == {70}
    assert [p.config.objective.noise_density for p in points] == [0.10, 0.15, 0.25, 0.50]
    # Every Table 6 row sets its corruption rate: an override of it would change no point, and
    # is refused before anything runs, naming the rows' values, however bad the value itself.
    for value in ("0.9", "7"):
        with pytest.raises(ConfigError, match=(
                rf"^objective.noise_density={float(value)} would change no point of table6: "
                r"every row sets objective.noise_density itself \(0.1, 0.15, 0.25, 0.5\)")):
            grid.expand("table6", "demo", [f"objective.noise_density={value}"])
    # Only Table 2's denoising rows set the rate: an override reaches the LM rows, and a
    # warning names the rows that keep their own.
    with pytest.warns(UserWarning, match=r"objective.noise_density=0.3 applies only to the "
                      r"points of table2 that do not set .*; encoder_decoder/denoising, "):
        points = grid.expand("table2", "demo", ["objective.noise_density=0.3"])
    assert {p.point.split("/")[1]: p.config.objective.noise_density for p in points} == {
        "denoising": 0.15, "lm": 0.3}


def test_point_index_runs_one_point(experiment, tmp_path, capsys):
    records = sweep.run_sweep(experiment, "demo", str(tmp_path), point_index=1)
    assert [(r["point"], r["status"]) for r in records] == [("broken", "failed")]
    assert len((tmp_path / results.RESULTS_FILE).read_text().splitlines()) == 1
    assert re.search(r"^sweep: 1 of 1 runs done, 0 left; \d+s elapsed$", capsys.readouterr().err,
                     re.MULTILINE)


def test_the_progress_line_estimates_the_time_left_from_the_steps_left():
    # 2 runs of 100 steps took 20 s: 0.1 s a step, so 300 + 50 steps left take 35 s.
    assert sweep.progress_line([100, 100], [300, 50], 20.0) == (
        "sweep: 2 of 4 runs done, 2 left; 20s elapsed, about 35s left")
    assert sweep.progress_line([10], [10] * 40, 185.0) == (
        "sweep: 1 of 41 runs done, 40 left; 3m 05s elapsed, about 2h 03m left")
    assert sweep.progress_line([100], [], 7.4) == "sweep: 1 of 1 runs done, 0 left; 7s elapsed"
    # A resumed sweep counts the runs finished before it; its rate is its own.
    assert sweep.progress_line([100], [100], 10.0, earlier=4) == (
        "sweep: 5 of 6 runs done (4 before this run), 1 left; 10s elapsed, about 10s left")


def test_sweep_end_to_end(uninterrupted):
    workdir, records = uninterrupted
    assert [(r["point"], r["status"]) for r in records] == [
        ("denoising", "ok"), ("broken", "failed"), ("prefix_lm", "ok")]
    for record in records:
        assert RECORD_FIELDS <= record.keys()
        assert (record["experiment"], record["preset"], record["task"]) == (
            "tiny_grid", "demo", "builtin_reverse")
    ok = [r for r in records if r["status"] == "ok"]
    for record in ok:
        metric_names = tasks.get_task("builtin_reverse").metric_names
        assert set(record["metrics"]) == set(metric_names)
        assert all(0.0 <= value <= 100.0 for value in record["metrics"].values())
        assert [step for step, _ in record["pretrain_curve"]] == [2, 4, 6]
        assert record["pretrain_loss"] == record["pretrain_curve"][-1][1]
        assert record["error"] is None
        # The demo preset evaluates held-out text (at the last step here): its last record.
        held_out = json.loads((workdir / "points" / record["point"] / "seed0" / "pretrain" /
                               "eval.jsonl").read_text().splitlines()[-1])
        assert (held_out["step"], held_out["task"]) == (6, "held_out")
        assert record["held_out_loss"] == held_out["loss"] > 0
        assert record["held_out_token_accuracy"] == held_out["token_accuracy"]
        assert record["held_out_curve"] == [[6, held_out["loss"]]]
        assert record["held_out_examples"] == held_out["examples"]
    # Two objectives (denoising, prefix LM) ask different things of the same text.
    assert len({r["held_out_examples"] for r in ok}) == 2
    lines = (workdir / "results.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == records


def test_points_of_one_structure_share_one_compiled_pretrain_step(uninterrupted):
    _, records = uninterrupted
    compiles = {r["point"]: r["compiles"] for r in records if r["status"] == "ok"}
    assert compiles == {"denoising": 1, "prefix_lm": 0}
    # The same, as JAX's compile events count it: the second point compiled nothing.
    assert {r["point"]: r["train_step_compiles"] for r in records
            if r["status"] == "ok"} == {"denoising": 1, "prefix_lm": 0}


UL2_EXPERIMENT = '''
from tiny_configs import tiny_sweep_config

GRID = (dict(point="ul2", row="UL2", overrides={"objective.name": "ul2"}),)


def get_config(preset):
    config = tiny_sweep_config(preset)
    config.train.batch_size = 8
    return config
'''


def test_a_ul2_run_whose_batches_mix_denoisers_records_one_train_step_compile(tmp_path):
    """Every example of a UL2 batch draws its own denoiser, and one compiled step serves them
    all: the point's record counts exactly one compilation of the pre-training step (from
    JAX's compile events), while its batches, re-derived from the run's step keys, mix kinds."""
    from t5x_lite import objectives, train_state, ul2

    path = tmp_path / "ul2_grid.py"
    path.write_text(UL2_EXPERIMENT)
    point, = grid.expand(str(path), "demo")
    layout, train = point.layout, point.config.train
    kinds_per_step = [
        {layout.denoisers[i].kind for i in np.asarray(ul2.choose(
            objectives.example_draws(batch_key, train.batch_size, layout)[:, 2, 0],
            layout.denoisers))}
        for batch_key, _ in (train_state.batch_and_dropout_keys(train_state.step_key(train.seed),
                                                               step)
                             for step in range(train.steps))]
    assert all(len(kinds) >= 2 for kinds in kinds_per_step), kinds_per_step
    with cold_program_cache():
        record, = sweep.run_sweep(str(path), "demo", str(tmp_path / "sweep"))
    assert record["status"] == "ok", record["error"]
    assert record["train_step_compiles"] == 1


GLUE_EXPERIMENT = '''
from tiny_configs import tiny_sweep_config

GRID = (dict(point="denoising", row="Encoder-decoder", objective="Denoising",
             overrides={"objective.name": "span_corruption"}),)


def get_config(preset):
    config = tiny_sweep_config(preset)
    config.sweep.tasks = ("glue_test_reverse", "builtin_module", "glue_test_module")
    config.sweep.glue_as_one_task = True  # as the small and paper presets have it
    return config
'''


def test_finetune_runs_put_glue_s_tasks_in_one_run_at_the_first_s_place():
    names = ("squad", "glue_cola", "wmt_ende", "local_glue_rte", "glue_mnli")
    assert grid.finetune_runs(names, True) == (
        ("squad",), ("glue_cola", "local_glue_rte", "glue_mnli"), ("wmt_ende",))
    assert grid.finetune_runs(names, False) == tuple((name,) for name in names)


def test_glue_s_tasks_fine_tune_as_one_task_and_each_gets_its_own_record(tmp_path):
    """The paper's GLUE protocol (`sweep.glue_as_one_task`): one fine-tuning run on the mixture
    of the GLUE tasks, validated on each, each task's record from its own best validation; any
    other task is fine-tuned alone."""
    import dataclasses

    path = tmp_path / "glue_grid.py"
    path.write_text(GLUE_EXPERIMENT)
    names = ("reverse", "module", "sort")
    for name in names:  # built-in tasks under GLUE names
        tasks.TASKS[f"glue_test_{name}"] = dataclasses.replace(
            tasks.TASKS[f"builtin_{name}"], name=f"glue_test_{name}")
    try:
        plan = sweep_plan.render(sweep_plan.plan_sweep(str(path), "demo", str(tmp_path / "w")))
        records = sweep.run_sweep(str(path), "demo", str(tmp_path / "w"))
        apart = sweep_plan.plan_sweep(str(path), "demo", str(tmp_path / "apart"),
                                      ["sweep.glue_as_one_task=False"])
        # It changes what the points compute: not the same sweep as the finished one, whose
        # value (set by its experiment here) resumes it, given or not.
        with pytest.raises(ConfigError, match="holds a different sweep .*glue_as_one_task: True "
                                              "there, False now.*glue_as_one_task=True to resume"):
            sweep_plan.plan_sweep(str(path), "demo", str(tmp_path / "w"),
                                  ["sweep.glue_as_one_task=False"])
        assert sweep_plan.plan_sweep(str(path), "demo", str(tmp_path / "w"),
                                     ["sweep.glue_as_one_task=True"]).workdir_state == "same"
        # A GLUE task added later would join the run its recorded GLUE tasks were made without.
        with pytest.raises(ConfigError, match="holds a record of glue_test_reverse for point "
                                              "'denoising' .* fine-tuned with glue_test_reverse "
                                              r"\+ glue_test_module; sweep.tasks now fine-tunes "
                                              r"it with glue_test_reverse \+ glue_test_module "
                                              r"\+ glue_test_sort"):
            sweep_plan.plan_sweep(str(path), "demo", str(tmp_path / "w"), [
                "sweep.tasks=('glue_test_reverse', 'builtin_module', 'glue_test_module', "
                "'glue_test_sort')"])
    finally:
        for name in names:
            del tasks.TASKS[f"glue_test_{name}"]
    assert ("fine-tuned on 3 tasks (glue_test_reverse, builtin_module, glue_test_module) in 2 "
            "fine-tuning runs of 4 steps (glue_test_reverse + glue_test_module as one task, as "
            "the paper fine-tunes GLUE)") in plan
    assert apart.finetune_runs == (("glue_test_reverse",), ("builtin_module",),
                                   ("glue_test_module",))
    assert [(r["task"], r["status"], r["finetune_tasks"]) for r in records] == [
        ("glue_test_reverse", "ok", ["glue_test_reverse", "glue_test_module"]),
        ("builtin_module", "ok", ["builtin_module"]),
        ("glue_test_module", "ok", ["glue_test_reverse", "glue_test_module"])]
    point = tmp_path / "w" / "points" / "denoising" / "seed0"
    assert sorted(p.name for p in (point / "finetune").iterdir()) == [
        "builtin_module", "glue_test_reverse+glue_test_module"]
    # One run validated both GLUE tasks; each record holds its task's best validation.
    validations = [json.loads(line) for line in
                   (point / "finetune" / "glue_test_reverse+glue_test_module" /
                    "eval.jsonl").read_text().splitlines()]
    for record in records[::2]:
        own = [v for v in validations if v["task"] == record["task"]]
        assert own and record["metrics"] in [v["metrics"] for v in own]
    assert records[0]["wall_s"] == records[2]["wall_s"] != records[1]["wall_s"]


def test_a_workdir_swept_before_glue_as_one_task_existed_resumes_only_as_it_ran(tmp_path,
                                                                                 experiment):
    """A sweep.json without the field was written by a sweep that fine-tuned every task
    alone: a preset that now fine-tunes GLUE's tasks as one does not resume it unless told."""
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / sweep_workdir.SWEEP_FILE).write_text(json.dumps(
        {"experiment": "tiny_grid", "preset": "demo", "overrides": []}))
    assert sweep_plan.plan_sweep(experiment, "demo", str(workdir)).workdir_state == "same"
    with pytest.raises(TypeError, match="a tuple of task names"):  # not joined letter by letter
        grid.expand(experiment, "demo")[0].finetune_directory(workdir, "builtin_reverse")
    with pytest.raises(ConfigError, match="glue_as_one_task: False there, True now.*pass "
                                          "--config.sweep.glue_as_one_task=False to resume"):
        sweep_plan.plan_sweep(experiment, "demo", str(workdir),
                              ["sweep.glue_as_one_task=True"])


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(uninterrupted):
    _, records = uninterrupted
    broken = next(r for r in records if r["point"] == "broken")
    assert broken["error"].startswith("FloatingPointError: loss is nan at step ")
    assert broken["metrics"] == {}
    assert records[-1]["status"] == "ok"  # the point after it still ran


def test_what_this_machine_lacks_stops_the_sweep_before_it_starts(experiment, tmp_path):
    """A mesh larger than the devices, a task's data missing from data.data_dir, a vocabulary
    path that is not a file, an empty corpus, a corpus too small for the steps: each passed the
    sweep's checks, then failed every point (the data after its pre-training), the sweep ending
    with status 0."""
    cases = (
        (["mesh.shape=(16, 1)"], ConfigError, r"mesh.shape=\(16, 1\) needs 16 devices"),
        ([f"data.data_dir={tmp_path / 'empty'}", "sweep.tasks=('glue_cola',)"],
         FileNotFoundError, r"^sweep.tasks has 'glue_cola': split='train' of TFDS dataset "
                            r"'glue/cola' is not in data_dir="),
        (["data.vocab=/nonexistent/vocab.model"], ConfigError,
         r"point 'denoising': data.vocab='/nonexistent/vocab.model' is not a file"),
        # A corpus without text; more steps than the corpus holds apart from the held-out
        # text: these failed each point as it started, its failed record kept for good.
        ([f"data.corpus={tmp_path / 'empty.txt'}"], ConfigError,
         r"point 'denoising': the train split of .*empty\.txt holds no records"),
        (["train.steps=100000", "train.eval_every=3"], ConfigError,
         r"point 'denoising': train.steps=100000 x train.batch_size=4 chunks and "
         r"train.eval_batches=\d+ held-out batches need more than the corpus's"),
    )
    (tmp_path / "empty.txt").write_text("")
    for overrides, error, message in cases:
        workdir = tmp_path / "sweep"
        with pytest.raises(error, match=message):
            sweep.run_sweep(experiment, "demo", str(workdir), overrides=overrides)
        assert not workdir.exists(), overrides


def test_rerun_skips_finished_points(experiment, uninterrupted):
    workdir, records = uninterrupted
    before = (workdir / "results.jsonl").read_text()
    assert sweep.run_sweep(experiment, "demo", str(workdir)) == records
    assert (workdir / "results.jsonl").read_text() == before


def _first_record_lost(workdir, copy):
    """`copy`: the finished sweep `workdir` with its first record lost (the line and the saved
    task record), as if that fine-tuning had not finished. Returns (the original lines, the
    lost record, the path of its saved task record)."""
    shutil.copytree(workdir, copy)
    lines = (copy / results.RESULTS_FILE).read_text().splitlines()
    first = json.loads(lines[0])
    (copy / results.RESULTS_FILE).write_text("\n".join(lines[1:]) + "\n")
    saved = copy / "points" / first["point"] / "seed0" / "records" / f"{first['task']}.json"
    saved.unlink()
    return lines, first, saved


def _nothing_recorded_then_resumed(experiment, copy, lines, records):
    """The stopped sweep in `copy` recorded nothing more, and running it again completes it
    to the uninterrupted sweep's `records`."""
    assert (copy / results.RESULTS_FILE).read_text().splitlines() == lines[1:]
    assert _without_timing(sweep.run_sweep(experiment, "demo", str(copy))) == \
        _without_timing(records)


def test_a_preempted_point_records_nothing_and_stops_the_sweep(experiment, uninterrupted,
                                                              tmp_path, monkeypatch):
    """Preempted in pre-training or in fine-tuning, a point has not failed: the sweep stops with
    `Preempted` (the preempted exit status), records nothing for it, and a re-run resumes it."""
    from t5x_lite import finetune, train

    def preempted(*args, **kwargs):
        raise Preempted(3, ["a workdir"], "SIGTERM")

    with monkeypatch.context() as patch:
        patch.setattr(train, "train", preempted)
        with pytest.raises(Preempted):
            sweep.run_sweep(experiment, "demo", str(tmp_path / "fresh"))
    assert results.ResultsFile(tmp_path / "fresh").records() == []

    # The first point's record lost, as if its fine-tuning had not finished yet.
    copy, records = tmp_path / "sweep", uninterrupted[1]
    lines, first, saved = _first_record_lost(uninterrupted[0], copy)
    with monkeypatch.context() as patch:
        patch.setattr(finetune, "finetune", preempted)
        with pytest.raises(Preempted):
            sweep.run_sweep(experiment, "demo", str(copy))
    assert not saved.exists()
    _nothing_recorded_then_resumed(experiment, copy, lines, records)


def test_a_signal_between_a_point_s_runs_stops_the_sweep_as_preempted(
        experiment, uninterrupted, tmp_path, monkeypatch, capsys):
    """SIGTERM outside a run's loop (here as the pre-training's metrics are read, before
    fine-tuning) killed the sweep with status 143, which the SLURM script does not requeue,
    and one that came as a run ended was ignored until the sweep ended. The point now stops
    before its next stage as preempted, saying so (it exited 75 without a word), records
    nothing, and a re-run completes it."""
    real = sweep_point._pretrain_history

    def signalled(*args):
        os.kill(os.getpid(), signal.SIGTERM)  # taken by the point's watch, no run's
        return real(*args)

    copy, records = tmp_path / "sweep", uninterrupted[1]
    lines, first, _ = _first_record_lost(uninterrupted[0], copy)
    with monkeypatch.context() as patch:
        patch.setattr(sweep_point, "_pretrain_history", signalled)
        with pytest.raises(Preempted) as stop:
            sweep.run_sweep(experiment, "demo", str(copy))
    assert (stop.value.cause, stop.value.code) == ("SIGTERM", 75)
    assert f"SIGTERM at step {stop.value.step}: stopping with exit status 75 once the " \
        f"checkpoints of {copy / 'points' / first['point']}" in capsys.readouterr().err
    _nothing_recorded_then_resumed(experiment, copy, lines, records)


class _Killed(Exception):
    """What SIGTERM's default action (the process killed, status 143) stands for in a test."""


def test_a_signal_in_a_later_stage_stops_the_sweep_before_the_next_point(
        experiment, uninterrupted, tmp_path, capsys):
    """SIGTERM as a later stage (the held-out loss, zero-shot scores added to finished
    points) amended a point: ignored to the last point, exit 0, or killed with 143. Now the
    point's records are kept and the sweep stops before the next as preempted."""
    points = [p for p in grid.expand(experiment, "demo") if p.point != "broken"]
    latest = {results.record_key(r): r for r in uninterrupted[1] if r["point"] != "broken"}
    amended = []

    def signalled(point, workdir, records):
        amended.append(point.point)
        os.kill(os.getpid(), signal.SIGTERM)  # as the first point is amended
        return {record["task"]: {"added": 1} for record in records}

    stage = sweep_point.LaterStage("a field", lambda config: True, lambda record: True, signalled,
                             lambda fields: "1")
    file = results.ResultsFile(tmp_path)
    with sweep.PreemptionWatch() as watch, pytest.raises(Preempted) as stop:
        sweep_point.add_to_finished(points, latest, tmp_path, file, stage, watch)
    assert (stop.value.step, stop.value.cause, stop.value.code) == (None, "SIGTERM", 75)
    assert amended == ["denoising"]
    assert [(r["point"], r["added"]) for r in file.records()] == [("denoising", 1)]
    assert f"SIGTERM: stopping with exit status 75 before the next run of {tmp_path}" in (
        capsys.readouterr().err)


def test_a_signal_between_points_stops_the_sweep_before_the_next_point(
        experiment, uninterrupted, tmp_path, monkeypatch):
    """SIGTERM as the sweep's own process appends a finished point's records, outside every
    point's watch, killed the sweep with status 143 (not requeued by the SLURM script). The
    point's records are now written, the sweep stops as preempted before the next point, and
    a re-run completes it."""
    copy, records = tmp_path / "sweep", uninterrupted[1]
    shutil.copytree(uninterrupted[0], copy)
    lines = (copy / results.RESULTS_FILE).read_text().splitlines()
    lost = {}  # point -> the index of its first record's line, lost with its saved record
    for index, line in enumerate(lines):
        record = json.loads(line)
        if record["point"] in ("denoising", "prefix_lm") and record["point"] not in lost:
            lost[record["point"]] = index
            (copy / "points" / record["point"] / "seed0" / "records"
             / f"{record['task']}.json").unlink()
    kept = [line for index, line in enumerate(lines) if index not in lost.values()]
    (copy / results.RESULTS_FILE).write_text("\n".join(kept) + "\n")
    real_append = results.ResultsFile.append

    def signalled(self, record):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_append(self, record)

    def killed(signum, frame):
        raise _Killed

    previous = signal.signal(signal.SIGTERM, killed)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(results.ResultsFile, "append", signalled)
            with pytest.raises(Preempted) as stop:
                sweep.run_sweep(experiment, "demo", str(copy))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (stop.value.cause, stop.value.code) == ("SIGTERM", 75)
    after = (copy / results.RESULTS_FILE).read_text().splitlines()
    assert after[:-1] == kept  # the first point's record, and nothing of the next point's
    appended, original = json.loads(after[-1]), json.loads(lines[lost["denoising"]])
    assert (appended["point"], appended["task"]) == (original["point"], original["task"])
    assert _without_timing(sweep.run_sweep(experiment, "demo", str(copy))) == \
        _without_timing(records)


def test_a_signal_during_the_start_up_stops_the_sweep_before_its_first_run(
        experiment, tmp_path, monkeypatch, capsys):
    """SIGTERM while the sweep loads every point's data (minutes on a first run), before any
    point's watch: killed with status 143, which the SLURM script does not requeue. Now it
    stops as preempted before the first run, having run nothing."""
    loaded = []

    def signalled(points):
        loaded.extend(points)
        os.kill(os.getpid(), signal.SIGTERM)

    def killed(signum, frame):
        raise _Killed

    monkeypatch.setattr(sweep, "_require_pretraining_data", signalled)
    previous = signal.signal(signal.SIGTERM, killed)
    try:
        with pytest.raises(Preempted) as stop:
            sweep.run_sweep(experiment, "demo", str(tmp_path / "sweep"))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (stop.value.step, stop.value.cause, stop.value.code) == (None, "SIGTERM", 75)
    assert loaded and not (tmp_path / "sweep" / "points").exists()
    assert not (tmp_path / "sweep" / results.RESULTS_FILE).exists()
    assert "SIGTERM: stopping with exit status 75 before the next run" in capsys.readouterr().err


def test_a_point_another_process_is_running_stops_the_second_sweep(experiment, uninterrupted,
                                                                   tmp_path):
    """The same sweep started twice in one workdir: both wrote one checkpoint folder at once
    (orbax errors), both appended the point's records, and a later 'failed' line hid an 'ok'
    one. The second now stops with one line, recording nothing, while the first holds the
    point's lock."""
    copy, records = tmp_path / "sweep", uninterrupted[1]
    lines, first, _ = _first_record_lost(uninterrupted[0], copy)
    lock = copy / "points" / first["point"] / "seed0" / sweep_workdir.LOCK_FILE
    with open(lock, "a") as other:  # as the first sweep's process holds it
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(SystemExit) as stopped:
            cli.main(["t5x-lite", "sweep", experiment, "--preset", "demo", "--workdir",
                      str(copy)])
    assert str(stopped.value.code) == (
        f"t5x-lite sweep: point {first['point']!r} (seed 0) is being run by another process in "
        f"{copy} (it holds {lock}); two sweeps in one workdir would write one checkpoint "
        "folder at once: let the other finish, or stop it")
    _nothing_recorded_then_resumed(experiment, copy, lines, records)  # the lock released


def test_a_full_disk_stops_the_sweep_and_records_nothing_for_the_point(
        experiment, uninterrupted, tmp_path, monkeypatch):
    """A point stopped by the machine (here a full disk while fine-tuning, as orbax reports
    it) has no result: it was recorded as failed, and re-runs, which skip recorded points,
    never retried it; a full disk failed every later point in turn. The sweep now stops with
    one line, records nothing for the point, and a re-run completes it."""
    from t5x_lite import finetune

    def disk_full(*args, **kwargs):
        raise ValueError("RESOURCE_EXHAUSTED: Error writing \"params\" in OCDBT database: "
                         "No space left on device [os_error_code='28']")

    copy, records = tmp_path / "sweep", uninterrupted[1]
    lines, first, saved = _first_record_lost(uninterrupted[0], copy)
    with monkeypatch.context() as patch:
        patch.setattr(finetune, "finetune", disk_full)
        with pytest.raises(SystemExit) as stopped:
            cli.main(["t5x-lite", "sweep", experiment, "--preset", "demo", "--workdir",
                      str(copy)])
    assert str(stopped.value.code) == (
        f"t5x-lite sweep: {first['point']} (seed 0) {first['task']} stopped: ValueError: "
        "RESOURCE_EXHAUSTED: Error writing \"params\" in OCDBT database: No space left on "
        "device [os_error_code='28']; the machine's fault, not the point's, so it is not "
        "recorded and the sweep stops (finished points are); fix it and re-run the same command")
    assert not saved.exists()
    _nothing_recorded_then_resumed(experiment, copy, lines, records)


def test_more_seeds_extend_a_finished_sweep_and_other_overrides_are_refused(
        experiment, uninterrupted, tmp_path):
    # Adding a seed resumes the sweep: the finished records stay, only the new seed's runs are
    # added (point_index 3 is the broken row's seed 1, which fails fast at run time).
    workdir, records = uninterrupted
    copy = tmp_path / "sweep"
    shutil.copytree(workdir, copy)
    before = (copy / "results.jsonl").read_text().splitlines()
    added = sweep.run_sweep(experiment, "demo", str(copy), overrides=["sweep.seeds=(0, 1)"],
                            point_index=3)
    assert [(r["point"], r["seed"], r["status"]) for r in added] == [("broken", 1, "failed")]
    after = (copy / "results.jsonl").read_text().splitlines()
    assert after[:len(before)] == before and len(after) == len(before) + 1
    # Named field by field, not as the two lists of overrides.
    with pytest.raises(ConfigError, match=r"holds a different sweep \(overrides: train.steps "
                                          r"unset there, 7 now\); use another --workdir"):
        sweep.run_sweep(experiment, "demo", str(copy), overrides=["train.steps=7"])
    # The held-out evaluation's cadence only observes: the same sweep, nothing run again.
    again = sweep.run_sweep(experiment, "demo", str(copy),
                            overrides=["train.eval_every=3", "train.eval_batches=2"])
    assert (copy / "results.jsonl").read_text().splitlines() == after
    assert len(again) == len(before)


def test_switching_the_held_out_loss_on_scores_finished_points_without_training_them(
        experiment, uninterrupted, tmp_path):
    # A point swept without the evaluation, then the same sweep with it (the demo preset's
    # eval_every): its final checkpoint is scored, its records are appended again with the
    # held-out fields, and they equal those of the sweep that had it on from the start.
    _, records = uninterrupted
    workdir = tmp_path / "sweep"
    plain = sweep.run_sweep(experiment, "demo", str(workdir), overrides=["train.eval_every=0"],
                            point_index=0)
    assert [(r["point"], r["held_out_loss"]) for r in plain] == [("denoising", None)]
    lines = (workdir / "results.jsonl").read_text().splitlines()
    metrics = (workdir / "points" / "denoising" / "seed0" / "pretrain" / "metrics.jsonl")
    trained = metrics.read_text()
    amended = sweep.run_sweep(experiment, "demo", str(workdir), point_index=0)
    assert metrics.read_text() == trained  # no step trained again
    after = (workdir / "results.jsonl").read_text().splitlines()
    assert after[:len(lines)] == lines and len(after) == len(lines) + 1
    fields = ("held_out_loss", "held_out_token_accuracy", "held_out_examples", "held_out_curve")
    expected = next(r for r in records if r["point"] == "denoising")
    assert [{f: r[f] for f in fields} for r in amended] == [{f: expected[f] for f in fields}]
    assert amended[0]["metrics"] == plain[0]["metrics"]  # fine-tuning not run again
    saved = json.loads((workdir / "points" / "denoising" / "seed0" / "records" /
                        "builtin_reverse.json").read_text())
    assert saved["held_out_loss"] == expected["held_out_loss"]
    # Run once more: nothing lacks it now.
    sweep.run_sweep(experiment, "demo", str(workdir), point_index=0)
    assert (workdir / "results.jsonl").read_text().splitlines() == after


def test_a_fault_in_a_point_s_record_fields_stops_the_sweep_before_any_run(
        experiment, tmp_path, monkeypatch):
    # The points' labels cannot be computed: no point may pre-train first and then be lost.
    def broken(model, *lengths):
        raise ValueError("no FLOP count for this model")

    monkeypatch.setattr(sweep_point.accounting, "table2_columns", broken)
    with pytest.raises(ValueError, match="no FLOP count"):
        sweep.run_sweep(experiment, "demo", str(tmp_path))
    assert not (tmp_path / "points").exists()
    assert not (tmp_path / results.RESULTS_FILE).exists() or \
        not (tmp_path / results.RESULTS_FILE).read_text()


@pytest.mark.parametrize("overrides, launcher, message", [
    (["--config.mesh.shape=(4,1)", "--config.finetune.batch_size=6"], None,
     r"^finetune.batch_size=6 must be divisible by the batch-sharding mesh size \(4\)"),
    (["--config.mesh.shape=(4,1)", "--config.train.batch_size=6"], None,
     r"^train.batch_size=6 must be divisible by the batch-sharding mesh size \(4\)"),
    # A parallel worker holds one CPU device of its own: a mesh of two does not fit it.
    (["--config.mesh.shape=(2,1)"], lambda: launchers.LocalParallelLauncher(2, gpus=[]),
     r"^mesh.shape=\(2, 1\) needs 2 devices"),
    # Three GPUs shared by two workers: one holds two, whose mesh splits the batch in two.
    (["--config.mesh.shape=(-1,1)", "--config.finetune.batch_size=3"],
     lambda: launchers.LocalParallelLauncher(2, gpus=["0", "1", "2"]),
     r"^finetune.batch_size=3 must be divisible by the batch-sharding mesh size \(2\)"),
])
def test_a_batch_the_points_mesh_cannot_split_stops_the_sweep_before_it_claims_the_workdir(
        experiment, tmp_path, overrides, launcher, message):
    """Each point would pre-train to its end and then fail (or fail at once), recorded as
    failed for good, in a workdir then claimed with the bad value: refused before any of it."""
    with pytest.raises(ConfigError, match=message):
        sweep.run_sweep(experiment, "demo", str(tmp_path / "sweep"), overrides=overrides,
                        launcher=launcher() if launcher else None)
    assert not (tmp_path / "sweep" / sweep_workdir.SWEEP_FILE).exists()
    assert not (tmp_path / "sweep" / "points").exists()


def test_the_same_overrides_reordered_or_repeated_resume_the_same_sweep(experiment, tmp_path):
    """A workdir's sweep is its overrides as they act: the last value per field, whatever the
    order; another value, or one more override (even of a field's own value), is another
    sweep. A workdir claimed before (overrides as given, a repeat among them, and a
    train.seed, which changed no point and is refused now) resumes too."""
    def identity(*overrides):
        points = grid.expand(experiment, "demo", list(overrides))
        return sweep_workdir.sweep_identity(experiment, points, list(overrides))

    given = ("--config.train.steps=8", "--config.finetune.steps=2")
    sweep_workdir.claim_workdir(tmp_path, identity(*given))
    assert json.loads((tmp_path / sweep_workdir.SWEEP_FILE).read_text())["overrides"] == [
        ["finetune.steps", 2], ["train.steps", 8]]
    for same in (given[::-1], ("--config.train.steps=3", *given)):
        assert sweep_workdir.check_workdir(tmp_path, identity(*same)) == "same", same
    for other in (("--config.train.steps=9", given[1]),
                  (*given, "--config.train.batch_size=4")):  # the tiny grid's own batch size
        with pytest.raises(ConfigError, match="holds a different sweep"):
            sweep_workdir.check_workdir(tmp_path, identity(*other))
    saved = json.loads((tmp_path / sweep_workdir.SWEEP_FILE).read_text())
    saved["overrides"] = [["train.steps", 3], ["train.steps", 8], ["finetune.steps", 2],
                          ["train.seed", 3]]
    (tmp_path / sweep_workdir.SWEEP_FILE).write_text(json.dumps(saved))
    assert sweep_workdir.check_workdir(tmp_path, identity(*given)) == "same"


def test_records_of_a_changed_config_are_refused_not_skipped(experiment, uninterrupted,
                                                            tmp_path):
    # A record written before a grid row changed (e.g. its objective) must not pass for a
    # finished run of the new row: the sweep stops, naming the point, before running anything.
    workdir, records = uninterrupted
    copy = tmp_path / "sweep"
    shutil.copytree(workdir, copy)
    lines = (copy / "results.jsonl").read_text().splitlines()
    stale = json.loads(lines[0])
    stale["config_hash"] = "0" * 16
    (copy / "results.jsonl").write_text("\n".join([json.dumps(stale), *lines[1:]]) + "\n")
    folder = copy / "points" / stale["point"] / "seed0"
    with pytest.raises(ConfigError, match=f"records of 1 of the sweep's 3 runs made with another "
                       f"config \\(point '{stale['point']}', seed 0: .* delete the lines of "
                       f"{stale['point']} \\(seed 0\\) in results.jsonl and its folder {folder} "
                       "to run them again"):
        sweep.run_sweep(experiment, "demo", str(copy))

    # Its lines deleted as told, but not its folder: the folder's work is refused too, before
    # anything runs (the pre-training failed on its checkpoints, recorded as a failed point).
    (copy / "results.jsonl").write_text("".join(
        line + "\n" for line in lines if json.loads(line)["point"] != stale["point"]))
    kept = (copy / "results.jsonl").read_text()
    saved = folder / "pretrain" / "checkpoints" / "config.json"
    original = saved.read_text()
    changed = json.loads(original)
    changed["objective"]["noise_density"] = 0.25
    saved.write_text(json.dumps(changed))
    refusal = (rf"^{folder} holds point '{stale['point']}' \(seed 0\) run with another config "
               r"\(its pre-training's objective.noise_density: saved 0.25 != now 0.15\); delete "
               r"that folder to run the point again")
    with pytest.raises(ConfigError, match=refusal):
        sweep.run_sweep(experiment, "demo", str(copy))
    with pytest.raises(ConfigError, match=refusal):  # a dry run says so too, not "resumes"
        sweep_plan.plan_sweep(experiment, "demo", str(copy))
    saved.write_text(original)
    record_file = next((folder / "records").glob("*.json"))
    record = json.loads(record_file.read_text())
    record_file.write_text(json.dumps({**record, "config_hash": "0" * 16}))
    with pytest.raises(ConfigError, match=f"its {record_file.stem} record's config_hash 0{{16}}"):
        sweep.run_sweep(experiment, "demo", str(copy))
    assert (copy / "results.jsonl").read_text() == kept  # nothing ran


def test_records_and_folders_of_examples_read_otherwise_are_refused(experiment, uninterrupted,
                                                                    tmp_path):
    """Work made while a point's examples read other raw text (its objective's raw tokens, or
    the layout its grid shares) hashes alike, but must not pass for the point's: a finished
    record's pretrain_tokens, a folder's batch layout and a saved task record are checked
    before anything runs."""
    workdir, _ = uninterrupted
    copy = tmp_path / "sweep"
    shutil.copytree(workdir, copy)
    lines = (copy / "results.jsonl").read_text().splitlines()
    stale = json.loads(lines[0])
    tokens = stale["pretrain_tokens"]
    stale["pretrain_tokens"] = tokens * 2
    (copy / "results.jsonl").write_text("\n".join([json.dumps(stale), *lines[1:]]) + "\n")
    folder = copy / "points" / stale["point"] / "seed0"
    with pytest.raises(ConfigError, match=(
            f"record of point '{stale['point']}' \\(seed 0\\) whose pre-training read "
            f"{tokens * 2} raw tokens and would read {tokens} now .* delete that point's lines "
            f"and its folder {folder} to run it again")):
        sweep.run_sweep(experiment, "demo", str(copy))

    (copy / "results.jsonl").write_text("".join(
        line + "\n" for line in lines if json.loads(line)["point"] != stale["point"]))
    kept = (copy / "results.jsonl").read_text()
    saved = folder / "pretrain" / "checkpoints" / BATCH_LAYOUT_FILE
    original = json.loads(saved.read_text())
    saved.write_text(json.dumps({**original, "raw_length": original["raw_length"] + 1}))
    # Its pre-training finished: nothing of it is read again (fine-tuning takes its final
    # parameters), so the other layout stands; with steps left, it is refused.
    sweep_workdir.require_current_folders(
        [p for p in grid.expand(experiment, "demo") if p.point == stale["point"]], copy)
    newest = newest_step(folder / "pretrain" / "checkpoints")
    shutil.rmtree(folder / "pretrain" / "checkpoints" / str(newest))
    refusal = (rf"^{folder} holds point '{stale['point']}' \(seed 0\) run with another config "
               rf"\(its pre-training's examples' raw_length: saved {original['raw_length'] + 1} "
               rf"!= now {original['raw_length']}\); delete that folder")
    with pytest.raises(ConfigError, match=refusal):
        sweep.run_sweep(experiment, "demo", str(copy))
    with pytest.raises(ConfigError, match=refusal):
        sweep_plan.plan_sweep(experiment, "demo", str(copy))
    saved.write_text(json.dumps(original))
    record_file = next((folder / "records").glob("*.json"))
    record = json.loads(record_file.read_text())
    record_file.write_text(json.dumps({**record, "pretrain_tokens": tokens * 2}))
    with pytest.raises(ConfigError, match=f"its {record_file.stem} record's pre-training read "
                                          f"{tokens * 2} raw tokens and would read {tokens} now"):
        sweep.run_sweep(experiment, "demo", str(copy))
    assert (copy / "results.jsonl").read_text() == kept  # nothing ran


def test_work_made_under_an_earlier_definition_of_its_objective_is_refused(
        experiment, uninterrupted, tmp_path, monkeypatch):
    """A change to how an objective corrupts text that no config field shows (UL2's S split,
    BART's sentence ends on 2026-12-05) is a line in its record's `changes`; records and
    pre-trainings made before it, finished ones too, are refused, and a record or a
    batch_layout.json from before revisions were recorded reads as revision 1 and the
    current revision respectively."""
    workdir, records = uninterrupted
    revisions = {"denoising": 1, "broken": 1, "prefix_lm": 2}  # prefix_lm: one document each
    assert {(r["point"], r[objective_registry.REVISION_FIELD]) for r in records} == set(
        revisions.items())
    copy = tmp_path / "sweep"
    shutil.copytree(workdir, copy)
    name = "span_corruption"  # the 'denoising' point's objective
    monkeypatch.setitem(objective_registry._REGISTRY, name, dataclasses.replace(
        objective_registry.get(name), changes=("2026-12-06: spans drawn otherwise",)))
    lines = [json.loads(line) for line in (copy / "results.jsonl").read_text().splitlines()]
    # A record from before revisions were recorded lacks the field: revision 1.
    for line in lines:
        if line["point"] == "denoising":
            line.pop(objective_registry.REVISION_FIELD)
    (copy / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    folder = copy / "points" / "denoising" / "seed0"
    with pytest.raises(ConfigError, match=(
            "record of point 'denoising' \\(seed 0\\) whose pre-training used revision 1 of "
            f"objective '{name}', which is at revision 2 now \\(2026-12-06: spans drawn "
            f"otherwise\\); use a new --workdir, or delete that point's lines and its folder "
            f"{folder} to run it again")):
        sweep.run_sweep(experiment, "demo", str(copy))

    kept = [line for line in lines if line["point"] != "denoising"]
    (copy / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in kept))
    points = [p for p in grid.expand(experiment, "demo") if p.point == "denoising"]
    # Its pre-training finished, but on the earlier definition: not the point's pre-training.
    with pytest.raises(ConfigError, match=(
            "its pre-training's examples' objective_revision: saved 1 != now 2\\); delete "
            "that folder")):
        sweep_workdir.require_current_folders(points, copy)
    # A batch_layout.json from before revisions were recorded reads as revision 1, as records
    # do (it was not compared, and a prefix_lm pre-training made before its document segments
    # resumed on them).
    saved = folder / "pretrain" / "checkpoints" / BATCH_LAYOUT_FILE
    layout = json.loads(saved.read_text())
    layout.pop(objective_registry.REVISION_FIELD)
    saved.write_text(json.dumps(layout))
    shutil.rmtree(folder / "records")
    with pytest.raises(ConfigError, match=(
            "its pre-training's examples' objective_revision: saved 1 != now 2\\); delete "
            "that folder")):
        sweep_workdir.require_current_folders(points, copy)
    layout[objective_registry.REVISION_FIELD] = 2  # as the current definition wrote it
    saved.write_text(json.dumps(layout))
    sweep_workdir.require_current_folders(points, copy)
    # Under the definition it was made with, the whole workdir is current again.
    monkeypatch.undo()
    sweep_workdir.require_current(lines, grid.expand(experiment, "demo"), copy / "results.jsonl")
    # A record of a newer t5x_lite's definition is said to be one.
    newer = [{**line, objective_registry.REVISION_FIELD: 2} for line in lines
             if line["point"] == "denoising"]
    with pytest.raises(ConfigError, match=f"used revision 2 of objective '{name}', which this "
                                          "t5x_lite knows only up to revision 1"):
        sweep_workdir.require_current(newer, grid.expand(experiment, "demo"),
                                      copy / "results.jsonl")


def test_work_made_under_another_definition_of_its_architecture_is_refused(
        experiment, uninterrupted, tmp_path, monkeypatch):
    """A config names its architecture only by `model.arch`; a researcher who edits their
    record (here the decoder's position buckets, which leave the parameters as they are, so a
    restore would succeed) gets their finished records refused, not counted as done, and
    their pre-trainings refused, not resumed or fine-tuned under the new network."""
    workdir, records = uninterrupted
    before = architectures.get("encoder_decoder")
    assert {r[architectures.DEFINITION_FIELD] for r in records} == {before.definition}
    encoder, decoder = before.stacks
    monkeypatch.setitem(architectures._REGISTRY, "encoder_decoder", dataclasses.replace(
        before, stacks=(encoder, dataclasses.replace(decoder, bidirectional=True))))
    now = architectures.get("encoder_decoder").definition
    points = grid.expand(experiment, "demo")
    with pytest.raises(ConfigError, match=(
            "record of point 'denoising' \\(seed 0\\) whose pre-training ran "
            "model.arch='encoder_decoder' as it was registered then, 'encoder_decoder: encoder "
            ".*bidirectional=False.*', and would run '.*bidirectional=True.*' now \\(its record "
            "changed\\); use a new --workdir")):
        sweep_workdir.require_current(records, points, workdir / "results.jsonl")
    copy = tmp_path / "sweep"
    shutil.copytree(workdir, copy)
    shutil.rmtree(copy / "points" / "denoising" / "seed0" / "records")
    denoising = [p for p in points if p.point == "denoising"]
    with pytest.raises(ConfigError, match=(
            f"its pre-training's examples' {architectures.DEFINITION_FIELD}: saved "
            f"'{re.escape(before.definition)}' != now '{re.escape(now)}'")):
        sweep_workdir.require_current_folders(denoising, copy)
    monkeypatch.undo()
    sweep_workdir.require_current(records, grid.expand(experiment, "demo"),
                                  workdir / "results.jsonl")
    sweep_workdir.require_current_folders(denoising, copy)


def test_records_of_another_config_are_refused_all_at_once_naming_what_changed(
        experiment, uninterrupted):
    """An experiment file's defaults edited after its sweep ran: every run made with the
    other config is named in one refusal, with the first's changed field from its
    pre-training's saved config (it named the first run alone, without the field: a round of
    deletions per run)."""
    workdir, records = uninterrupted
    changed = grid.expand(experiment, "demo", ["model.mlp=gated-gelu"])
    with pytest.raises(ConfigError, match=(
            f"^{re.escape(str(workdir / 'results.jsonl'))} holds records of 3 of the sweep's 3 "
            "runs made with another config \\(point 'denoising', seed 0: config_hash "
            "[0-9a-f]{16}, now [0-9a-f]{16}\\): the grid or its defaults changed since "
            "\\(denoising's pre-training: model.mlp: saved 'relu' != now 'gated-gelu'\\); use a "
            "new --workdir, or delete the lines of denoising \\(seed 0\\), broken \\(seed 0\\), "
            "prefix_lm \\(seed 0\\) in results.jsonl and their folders")):
        sweep_workdir.require_current(records, changed, workdir / "results.jsonl")
    # A parameter-neutral model field is named too (config_differences skips them unless
    # asked: the refusal named no field).
    changed = grid.expand(experiment, "demo", ["model.dropout_rate=0.1"])
    with pytest.raises(ConfigError, match="\\(denoising's pre-training: model.attention_dropout: "
                                          "saved False != now True; model.dropout_rate: saved "
                                          "0.0 != now 0.1\\)"):
        sweep_workdir.require_current(records, changed, workdir / "results.jsonl")


def test_a_sweep_and_a_training_run_keep_out_of_each_other_s_folders(experiment, uninterrupted):
    """`train` into a sweep's workdir wrote its checkpoints among the sweep's points, a sweep
    into a training run's folder its points beside the run's checkpoints, and `report` of a
    training run's folder advised running a sweep there: each is refused in one line naming
    what the folder holds, before anything is written; `report --against` itself too."""
    workdir, _ = uninterrupted
    point = grid.expand(experiment, "demo")[0]
    with pytest.raises(ConfigError, match=rf"^{workdir} holds a sweep \(sweep.json\); a "
                       r"pre-training run there would overwrite or mix with it: give another "
                       r"--workdir$"):
        train.train(point.config, workdir, progress=False)
    assert not (workdir / "checkpoints").exists()
    pretrain = point.pretrain_directory(workdir)
    with pytest.raises(ConfigError, match=rf"{pretrain} holds a pre-training run \(checkpoints/"
                       r"batch_layout.json\); a sweep there would overwrite or mix with it"):
        sweep.run_sweep(experiment, "demo", str(pretrain))
    assert not (pretrain / sweep_workdir.SWEEP_FILE).exists()
    with pytest.raises(FileNotFoundError, match=(
            rf"^{pretrain} holds a pre-training run \(checkpoints/batch_layout.json\), not a "
            rf"sweep; `t5x-lite eval --checkpoint {pretrain}` scores it$")):
        report.report(str(pretrain))
    with pytest.raises(ConfigError, match=rf"^--against {workdir}/ is the reported sweep's own "
                                          r"workdir: compare it with another sweep's$"):
        report.report(str(workdir), against=f"{workdir}/")


def test_a_failed_task_stands_when_its_point_runs_again_until_its_line_is_deleted(
        experiment, uninterrupted, tmp_path, monkeypatch):
    """A point run again for a task added to sweep.tasks fine-tunes only that task: it ran its
    failed task too, whose record the sweep then dropped (results.jsonl kept "failed" while the
    log and the saved record said "ok"). Deleting the failed line retries the task."""
    from t5x_lite import finetune

    workdir, _ = uninterrupted
    copy = tmp_path / "sweep"
    shutil.copytree(workdir, copy)
    lines = [json.loads(line) for line in (copy / "results.jsonl").read_text().splitlines()]
    first = next(r for r in lines if r["point"] == "denoising")
    # As if its fine-tuning had failed: a failed line, no saved record.
    failed = {**first, "metrics": {}, "status": "failed", "error": "RuntimeError: flaky"}
    (copy / "results.jsonl").write_text("".join(
        json.dumps(failed if r is first else r) + "\n" for r in lines))
    saved = copy / "points" / "denoising" / "seed0" / "records" / "builtin_reverse.json"
    saved.unlink()
    calls = []

    def fake_finetune(config, workdir, **kwargs):
        (task,) = config.finetune.tasks
        calls.append(task)
        return {"scores": {task: {"accuracy": 1.0}}, "wall_s": 0.0, "compile_s": 0.0,
                "compiles": 0}

    monkeypatch.setattr(finetune, "finetune", fake_finetune)
    both = ["sweep.tasks=('builtin_reverse', 'builtin_module')"]
    records = sweep.run_sweep(experiment, "demo", str(copy), overrides=both, point_index=0)
    assert calls == ["builtin_module"]
    assert [(r["task"], r["status"]) for r in records] == [
        ("builtin_reverse", "failed"), ("builtin_module", "ok")]
    assert json.loads(saved.read_text())["status"] == "failed"  # as results.jsonl says
    # Its line deleted, the task runs again.
    kept = [line for line in (copy / "results.jsonl").read_text().splitlines()
            if json.loads(line)["status"] != "failed" or json.loads(line)["point"] != "denoising"]
    (copy / "results.jsonl").write_text("".join(line + "\n" for line in kept))
    records = sweep.run_sweep(experiment, "demo", str(copy), overrides=both, point_index=0)
    assert calls == ["builtin_module", "builtin_reverse"]
    assert sorted((r["task"], r["status"]) for r in records) == [
        ("builtin_module", "ok"), ("builtin_reverse", "ok")]


def test_killed_sweep_resumes_to_the_same_records(experiment, uninterrupted, tmp_path,
                                                  capsys):
    """SIGKILL the sweep in the middle of its first point's pre-training, re-run it: the
    records equal an uninterrupted sweep's (timing aside), none duplicated or lost."""
    script = (f"from t5x_lite import sweep; "
              f"sweep.run_sweep({experiment!r}, 'demo', {str(tmp_path)!r})")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, cwd=Path(__file__).parent.parent,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})
    metrics = tmp_path / "points" / "denoising" / "seed0" / "pretrain" / "metrics.jsonl"
    try:
        # Waits for the event (three logged steps), not for a time; the deadline is only a
        # hang guard, generous enough that a loaded machine cannot trip it.
        deadline = time.monotonic() + 600
        while not (metrics.exists() and metrics.read_text().count("\n") >= 3):
            assert child.poll() is None, "the sweep ended before it could be killed"
            assert time.monotonic() < deadline, "hung: no third pre-training step in 600 s"
            time.sleep(0.02)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    results_path = tmp_path / results.RESULTS_FILE
    # Killed before the end.
    assert not results_path.exists() or results_path.read_text().count("\n") < 3
    saved = newest_step(metrics.parent / CHECKPOINTS_DIR)
    capsys.readouterr()
    records = sweep.run_sweep(experiment, "demo", str(tmp_path))
    assert _without_timing(records) == _without_timing(uninterrupted[1])
    # The log says where the point resumed (without a progress bar, nothing else did).
    first = next(line for line in capsys.readouterr().err.splitlines()
                 if "denoising (seed 0): pre-training" in line)
    assert first.endswith("" if saved is None else f", resuming at step {saved}")
    assert ("resuming" in first) == (saved is not None)
    assert len(results_path.read_text().splitlines()) == len(records) == 3


def _assert_close(ours, theirs, path="record"):
    """Equal JSON data, floats to float32 training tolerance."""
    if isinstance(ours, float) and isinstance(theirs, float):
        assert ours == pytest.approx(theirs, rel=1e-4, abs=1e-6), path
    elif isinstance(ours, dict) and isinstance(theirs, dict):
        assert ours.keys() == theirs.keys(), path
        for key in ours:
            _assert_close(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(ours, list) and isinstance(theirs, list):
        assert len(ours) == len(theirs), path
        for index, (a, b) in enumerate(zip(ours, theirs)):
            _assert_close(a, b, f"{path}[{index}]")
    else:
        assert ours == theirs, path


def test_vmapped_sweep_gives_the_records_of_the_sequential_one(experiment, uninterrupted,
                                                               tmp_path, capsys):
    """vmap=2: the two encoder-decoder points pre-train in one vmapped step (compiled once
    for the pair); the broken point (another learning rate: another program) cannot join them
    and runs alone."""
    points = grid.expand(experiment, "demo")
    assert [[p.point for p in chunk] for chunk in sweep.vmap_chunks(points, 2)] == [
        ["denoising", "prefix_lm"], ["broken"]]
    # In a workdir where only one of the pair's pre-training finished, they go apart: together,
    # both pre-trained again from step 0 (their checkpoints at different steps), the finished
    # one's thrown away.
    workdir = tmp_path / "partly_done"
    shutil.copytree(uninterrupted[0], workdir)
    shutil.rmtree(workdir / "points" / "prefix_lm" / "seed0" / "pretrain" / "checkpoints")
    assert [[p.point for p in chunk] for chunk in sweep.vmap_chunks(points, 2, workdir)] == [
        ["denoising"], ["broken"], ["prefix_lm"]]
    lines = (workdir / results.RESULTS_FILE).read_text().splitlines()  # the pair to run again
    (workdir / results.RESULTS_FILE).write_text("".join(
        line + "\n" for line in lines if json.loads(line)["point"] == "broken"))
    for point in ("denoising", "prefix_lm"):
        shutil.rmtree(workdir / "points" / point / "seed0" / "records")
    assert sweep_plan.plan_sweep(experiment, "demo", str(workdir), vmap=2).vmap_groups == (
        (0,), (2,))
    capsys.readouterr()
    with cold_program_cache():  # the pair's step compiles here, whatever ran before
        records = sweep.run_sweep(experiment, "demo", str(tmp_path), vmap=2)
    # One progress line per chunk, after all its runs (the pair's first line counted one of
    # them done and the other's time as to come).
    assert re.findall(r"^sweep: (\d) of 3 runs done", capsys.readouterr().err, re.M) == ["2", "3"]
    _assert_close(_without_timing(records), _without_timing(uninterrupted[1]))
    assert {r["compiles"] for r in records if r["status"] == "ok"} == {1}
    assert {r["train_step_compiles"] for r in records if r["status"] == "ok"} == {1}
    assert len((tmp_path / results.RESULTS_FILE).read_text().splitlines()) == 3
    # A re-run finds every point done.
    assert sweep.run_sweep(experiment, "demo", str(tmp_path), vmap=2) == records


def test_only_process_zero_writes_the_sweeps_files(experiment, tmp_path, monkeypatch):
    """Every process of a multi-process run runs the sweep; the others write nothing."""
    results_path = tmp_path / results.RESULTS_FILE
    results_path.write_text('{"point": "cut sho')  # a partial line only process 0 may cut
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    with pytest.warns(UserWarning, match="line 1: skipping a partly written last line"):
        records = sweep.run_sweep(experiment, "demo", str(tmp_path), point_index=1)
    assert records == []  # read back from results.jsonl, which only process 0 writes
    assert results_path.read_text() == '{"point": "cut sho'
    assert not list(tmp_path.rglob("*.json"))  # neither sweep.json nor a saved record


def test_bad_inputs(tmp_path, experiment):
    with pytest.raises(ConfigError, match="experiment='table3' does not exist.*table2, table4"):
        grid.expand("table3", "tiny")
    with pytest.raises(ConfigError, match="preset='huge' does not exist.*tiny, small, paper, demo"):
        grid.expand("table2", "huge")
    no_grid = tmp_path / "no_grid.py"
    no_grid.write_text("def get_config(preset):\n    return None\n")
    with pytest.raises(ConfigError, match="no_grid.py defines no grid"):
        grid.expand(str(no_grid), "tiny")
    with pytest.raises(ConfigError, match="no field 'model.depth'"):
        grid.expand("table4", "tiny", ["model.depth=3"])
    with pytest.raises(ConfigError, match="override 'train.steps' must look like"):
        grid.expand("table4", "tiny", ["train.steps"])
    with pytest.raises(ConfigError, match="train.steps='many'"):
        grid.expand("table4", "tiny", ["train.steps=many"])
    with pytest.raises(ConfigError, match="table4 point 'prefix_lm'.*unknown task 'glue_nope'"):
        grid.expand("table4", "tiny", ["sweep.tasks=('glue_nope',)"])
    for vmap in (0, 1.5, True):
        with pytest.raises(ConfigError, match=f"vmap={vmap!r} must be an integer >= 1"):
            sweep.run_sweep("table4", "demo", str(tmp_path / "a"), vmap=vmap)
    ray = object.__new__(launchers.RayLauncher)  # unconnected: refused before it is used
    with pytest.raises(ConfigError, match="vmap=2 needs the local or parallel launcher"):
        sweep.run_sweep("table4", "demo", str(tmp_path / "a"), vmap=2, launcher=ray)
    with pytest.raises(ConfigError, match=r"point_index=3 must be in \[0, 3\)"):
        sweep.run_sweep("table4", "demo", str(tmp_path / "a"), point_index=3)
    # From Python: a point index as a string, overrides as one string (TypeErrors before).
    with pytest.raises(ConfigError, match=r"point_index='0' must be in \[0, 3\)"):
        sweep.run_sweep("table4", "demo", str(tmp_path / "a"), point_index="0")
    points = grid.expand("table4", "demo")
    assert sweep.select_point(points, np.int64(2)) == [points[2]]  # e.g. from an array job's table
    with pytest.raises(ConfigError, match=r"overrides='--config.train.steps=2' must be a list "
                                          r"of 'field=value' strings"):
        sweep.run_sweep("table4", "demo", str(tmp_path / "a"), overrides="--config.train.steps=2")
    # A workdir of another sweep is refused before anything runs.
    other = tmp_path / "other"
    other.mkdir()
    (other / sweep_workdir.SWEEP_FILE).write_text(
        json.dumps({"experiment": "table6", "preset": "demo", "overrides": []}))
    with pytest.raises(ConfigError, match="holds a different sweep.*experiment: 'table6' there"):
        sweep.run_sweep("table4", "demo", str(other))
    assert not (other / results.RESULTS_FILE).exists()


# ------------------------------------------------------------------------- compute-matched sweeps


def _hand_train_flops(model, li, lt):
    """Training FLOPs of one example, written out from accounting's documented count (2 per
    multiply-add, training = 3 x forward): per layer the q, k, v, o projections, scores and
    weighted values of each attention and the ReLU MLP's two matmuls; the logits at every
    decoder position."""
    d, inner, v, layers = model.d_model, model.num_heads * model.d_kv, model.vocab_size, \
        model.num_layers

    def attention(q, kv):
        return 2 * d * inner * (2 * q + 2 * kv) + 2 * 2 * q * kv * inner

    def mlp(n):
        return 2 * 2 * d * model.d_ff * n

    assert model.mlp == "relu"
    if model.arch in ("language_model", "prefix_lm"):  # one sequence of inputs + targets
        n = li + lt
        return 3 * (layers * (attention(n, n) + mlp(n)) + 2 * d * v * n)
    depth = layers // 2 if model.arch == "encoder_decoder_half" else layers
    encoder = depth * (attention(li, li) + mlp(li))
    decoder = depth * (attention(lt, lt) + attention(lt, li) + mlp(lt))
    return 3 * (encoder + decoder + 2 * d * v * lt)


def _hand_cost(point, kind):
    """A step's cost in the budget's unit, from the point's rows (its layout), by hand."""
    batch, layout = point.config.train.batch_size, point.layout
    if kind == "tokens":
        return batch * (layout.inputs_length + layout.targets_length)
    return batch * _hand_train_flops(point.config.model, layout.inputs_length,
                                     layout.targets_length)


@pytest.mark.parametrize("kind", ["flops", "tokens"])
def test_table2_points_spend_the_reference_budget(kind):
    configured = {p.point: p.config for p in grid.expand("table2", "demo")}
    points = grid.expand("table2", "demo", [f"sweep.budget={kind}"])
    reference = points[0]
    budget = configured[reference.point].train.steps * _hand_cost(reference, kind)
    for point in points:
        cost, train = _hand_cost(point, kind), point.config.train
        assert abs(train.steps * cost - budget) <= cost / 2, point.point  # the nearest step
        before = configured[point.point].train
        assert train.warmup_steps == max(1, round(before.warmup_steps * train.steps
                                                  / before.steps))
        record = sweep_point.base_record(point)
        assert record["pretrain_steps"] == train.steps
        assert (record["budget"], record["budget_reference"]) == (kind, reference.point)
        assert record["pretrain_flops"] == pytest.approx(
            train.steps * _hand_cost(point, "flops"), rel=1e-12)
        assert record["tokens_per_step"] == _hand_cost(point, "tokens")
    assert points[0].config.train.steps == configured[points[0].point].train.steps
    steps = {p.point: p.config.train.steps for p in points}
    # Each point is charged for its own objective's rows, not the family's widest: the
    # language model's 32 positions, the prefix LM's 32 + 32 (they shared 64 before).
    lengths = {p.point: (p.layout.inputs_length, p.layout.targets_length) for p in points}
    assert (lengths["language_model/lm"], lengths["prefix_lm/lm"]) == ((0, 32), (32, 32))
    assert steps["language_model/lm"] > steps["prefix_lm/lm"]
    if kind == "flops":  # the 6-layer encoder-decoder costs less per step than the 12-layer
        assert steps["encoder_decoder_half/lm"] > steps["encoder_decoder/lm"]
    else:  # row positions alone: the model does not count
        assert steps["encoder_decoder_half/lm"] == steps["encoder_decoder/lm"]


def test_the_budget_reference_can_be_any_grid_point():
    points = grid.expand("table2", "demo", ["sweep.budget=flops",
                                             "sweep.budget_reference=language_model/lm"])
    reference = next(p for p in points if p.point == "language_model/lm")
    assert reference.config.train.steps == 200
    budget = 200 * _hand_cost(reference, "flops")
    for point in points:
        cost = _hand_cost(point, "flops")
        assert abs(point.config.train.steps * cost - budget) <= cost / 2
    # The language model's 32-position rows cost less than the encoder-decoder's 32 + 28.
    assert points[0].config.train.steps < 200


BATCH_GRID = '''
from tiny_configs import tiny_sweep_config

GRID = tuple(dict(point=f"batch{batch}", row=f"Batch {batch}", objective="Denoising",
                  overrides={"train.batch_size": batch}) for batch in (4, 8, 6, 16))


def get_config(preset):
    return tiny_sweep_config(preset)
'''


def test_a_tokens_budget_gives_bigger_batches_fewer_steps(tmp_path):
    path = tmp_path / "batch_grid.py"
    path.write_text(BATCH_GRID)
    # Batch 16 rounds 7.5 steps to 8, 1.07x the budget: said, beyond 5 %.
    with pytest.warns(UserWarning, match=r"point 'batch16' spends 1.07x the sweep.budget="
                                         r"'tokens' budget in its 8 steps") as caught:
        points = grid.expand(str(path), "demo", ["sweep.budget=tokens", "train.steps=30",
                                                  "train.warmup_steps=10"])
    assert sum("spends" in str(w.message) for w in caught) == 1
    # 30 steps of batch 4 read 120 rows; the others read as many, to the nearest step, and
    # warm up for the same share of their steps.
    assert [p.config.train.steps for p in points] == [30, 15, 20, 8]
    assert [p.config.train.warmup_steps for p in points] == [10, 5, 7, 3]
    # A warm-up scaled below one step keeps one.
    points = grid.expand(str(path), "demo", ["sweep.budget=tokens", "train.steps=30",
                                              "train.warmup_steps=1"])
    assert [p.config.train.warmup_steps for p in points] == [1, 1, 1, 1]


def test_a_matched_budget_keeps_rsqrt_s_warm_up_and_refuses_rows_that_set_their_steps(tmp_path):
    """rsqrt's warm-up sets its peak rate, lr / sqrt(warm-up): scaled with the steps, it gave
    a point given more steps a lower peak (T5 fixes it at 10^4 "in all of our experiments").
    A row's own train.steps (T5's Table 13 "4x steps") was overwritten without a word."""
    path = tmp_path / "batch_grid.py"
    path.write_text(BATCH_GRID)
    points = grid.expand(str(path), "demo", ["sweep.budget=tokens", "train.steps=30",
                                              "train.warmup_steps=10", "train.schedule=rsqrt"])
    assert [p.config.train.steps for p in points] == [30, 15, 20, 8]
    assert [p.config.train.warmup_steps for p in points] == [10, 10, 10, 10]
    steps_rows = tmp_path / "steps_rows.py"
    steps_rows.write_text(BATCH_GRID.replace('overrides={"train.batch_size": batch}',
                                             'overrides={"train.batch_size": batch, '
                                             '"train.steps": 10 * batch}'))
    with pytest.raises(ConfigError, match=r"^steps_rows rows 'batch8', 'batch6', 'batch16' set "
                                          r"train.steps, which a matched sweep.budget derives "
                                          r"for every point from the reference 'batch4'"):
        grid.expand(str(steps_rows), "demo", ["sweep.budget=flops"])
    assert [p.config.train.steps for p in grid.expand(str(steps_rows), "demo")] == [
        40, 80, 60, 160]  # the steps budget keeps them


ROWS_GRID = '''
from tiny_configs import tiny_sweep_config

ROWS = {{"ref": ("encoder_decoder", "span_corruption"), "lm": ("language_model", "lm"),
        "plm": ("prefix_lm", "prefix_lm"), "plm_wide": ("prefix_lm", "prefix_lm")}}
WIDER = {{"plm_wide": {{"objective.targets_length": 96}}}}
GRID = tuple(dict(point=point, row=point, objective="x",
                  overrides={{"model.arch": ROWS[point][0], "objective.name": ROWS[point][1],
                              **WIDER.get(point, {{}})}})
             for point in {points!r})


def get_config(preset):
    return tiny_sweep_config(preset)
'''


def test_a_matched_point_s_steps_do_not_depend_on_the_grid_s_other_rows(tmp_path):
    """Each point was charged for its family's widest rows: a prefix LM row joining the grid
    padded the language model's 32-position rows to 64 and halved its steps; a row of the same
    objective with wider targets of its own widened the other's."""
    steps = {}
    for name, points in (("alone", ("ref", "lm", "plm")),
                         ("beside", ("ref", "lm", "plm", "plm_wide"))):
        path = tmp_path / f"{name}.py"
        path.write_text(ROWS_GRID.format(points=points))
        steps[name] = {p.point: p.config.train.steps
                       for p in grid.expand(str(path), "demo", ["sweep.budget=flops"])}
    assert steps["alone"]["lm"] == steps["beside"]["lm"]
    assert steps["alone"]["plm"] == steps["beside"]["plm"] > steps["beside"]["plm_wide"]
    assert steps["beside"]["lm"] > steps["beside"]["plm"]
    alone = tmp_path / "lm_alone.py"
    alone.write_text(ROWS_GRID.format(points=("ref", "lm")))
    assert {p.point: p.config.train.steps for p in grid.expand(
        str(alone), "demo", ["sweep.budget=flops"])}["lm"] == steps["alone"]["lm"]


def test_a_steps_budget_leaves_the_configs_and_records_as_they_were():
    default = grid.expand("table2", "demo")
    explicit = grid.expand("table2", "demo", ["sweep.budget=steps"])
    assert [p.config.to_dict() for p in explicit] == [p.config.to_dict() for p in default]
    assert {p.config.train.steps for p in default} == {200}
    assert all(p.budget is None for p in explicit)
    record = sweep_point.base_record(explicit[3])
    assert not {"budget", "flops_per_step", "pretrain_flops"} & record.keys()
    assert RECORD_FIELDS - {"task", "wall_s", "compile_s", "compiles", "metrics", "status",
                            "error"} <= record.keys()


def test_bad_budgets_fail_at_expansion_before_any_other_check(tmp_path):
    from t5x_lite import cli

    # The corpus is missing too; the budget is what the one-line error names.
    for override, field, allowed in (
            ("sweep.budget=joules", "sweep.budget='joules'", "steps, tokens, flops"),
            ("sweep.budget=FLOPS", "sweep.budget='FLOPS'", "steps, tokens, flops"),
            ("sweep.budget_reference=nope", "sweep.budget_reference='nope'",
             "encoder_decoder/denoising, encoder_decoder_shared/denoising")):
        with pytest.raises(ConfigError) as error:
            grid.expand("table2", "demo", [override, "data.corpus=/nonexistent/*.txt"])
        message = str(error.value)
        assert "\n" not in message
        assert message.startswith(f"{field} is not allowed; choose one of {allowed}")
    # A reference without a matched budget was ignored without a word.
    with pytest.raises(ConfigError, match=r"^sweep.budget_reference='prefix_lm/lm' is read only "
                                          r"by a matched budget: set sweep.budget to 'tokens' "
                                          r"or 'flops'"):
        grid.expand("table2", "demo", ["sweep.budget=steps", "sweep.budget_reference=prefix_lm/lm"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "sweep", "table2", "--preset=demo", f"--workdir={tmp_path}",
                  "--config.sweep.budget=joules"])
    assert str(exit_info.value.code) == (
        "t5x-lite sweep: invalid config: sweep.budget='joules' is not allowed; choose one of "
        "steps, tokens, flops")
    assert not list(tmp_path.iterdir())  # nothing written


BUDGET_EXPERIMENT = '''
from tiny_configs import tiny_sweep_config

# Two points of one model and layout whose steps differ in cost by their batch sizes.
GRID = (
    dict(point="denoising", row="Encoder-decoder", objective="Denoising",
         overrides={"objective.name": "span_corruption", "train.batch_size": 4}),
    dict(point="prefix_lm", row="Encoder-decoder", objective="LM",
         overrides={"objective.name": "prefix_lm", "train.batch_size": 8}),
)


def get_config(preset):
    return tiny_sweep_config(preset)
'''


def test_a_flops_matched_sweep_records_and_reports_its_compute(tmp_path):
    from t5x_lite import report

    path = tmp_path / "budget_grid.py"
    path.write_text(BUDGET_EXPERIMENT)
    workdir = tmp_path / "sweep"
    overrides = ["sweep.budget=flops"]
    points = {p.point: p for p in grid.expand(str(path), "demo", overrides)}
    first, second = points["denoising"], points["prefix_lm"]
    budget = 6 * _hand_cost(first, "flops")  # the first point's 6 configured steps
    derived = round(budget / _hand_cost(second, "flops"))
    assert 1 <= derived < 6  # twice the batch, so more FLOPs per step
    records = sweep.run_sweep(str(path), "demo", str(workdir), overrides=overrides)
    by_point = {r["point"]: r for r in records}
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert [r["pretrain_steps"] for r in records] == [6, derived]
    for name, record in by_point.items():
        assert record["pretrain_curve"][-1][0] == record["pretrain_steps"]  # trained that long
        assert record["budget"] == "flops" and record["budget_reference"] == "denoising"
        assert record["budget_total"] == pytest.approx(budget, rel=1e-12)
        assert record["flops_per_step"] == pytest.approx(_hand_cost(points[name], "flops"),
                                                         rel=1e-12)
        assert record["pretrain_flops"] == pytest.approx(
            record["pretrain_steps"] * record["flops_per_step"], rel=1e-12)
        assert record["loss_tokens_per_step"] > 0
    # Resuming derives the same steps: every point is found finished.
    assert sweep.run_sweep(str(path), "demo", str(workdir), overrides=overrides) == records
    # The same workdir under another budget is another sweep.
    with pytest.raises(ConfigError, match="holds a different sweep.*sweep.budget"):
        sweep.run_sweep(str(path), "demo", str(workdir), overrides=["sweep.budget=tokens"])
    text = report.report(str(workdir)).text
    assert "compute-matched: sweep.budget=flops" in text
    compute = text[text.index("Pre-training compute per point"):]
    for name, record in by_point.items():
        line = next(line for line in compute.splitlines()
                    if line.startswith(f"{record['row']}  ") and record["objective"] in line)
        assert line.split()[-6:] == [
            str(record["pretrain_steps"]), f"{record['flops_per_step']:.4g}",
            str(record["tokens_per_step"]), f"{record['loss_tokens_per_step']:.1f}",
            f"{record['pretrain_flops']:.4g}",
            f"{record['pretrain_flops'] / record['budget_total']:.3f}"]
    assert (workdir / "report" / "compute.csv").read_text().count("\n") == 3


# ---------------------------------------------------------------------------------------------
# Dry runs (t5x_lite.sweep_plan)


def test_a_dry_run_lists_the_runs_it_would_make_and_writes_nothing(experiment, tmp_path,
                                                                  capsys):
    workdir = tmp_path / "new"
    cli.main(["t5x-lite", "sweep", experiment, "--preset", "demo", "--workdir", str(workdir),
              "--dry_run"])
    out = capsys.readouterr().out
    assert not workdir.exists()
    assert out.startswith(f"Dry run of sweep tiny_grid --preset demo --workdir {workdir} (a new "
                          "workdir): nothing is trained, compiled or written.\n3 runs ")
    rows = {line.split()[1]: line.split() for line in out.splitlines()
            if re.match(r"\d+  ", line)}
    assert list(rows) == ["denoising", "broken", "prefix_lm"]
    assert all(row[-2:] == ["to", "run"] for row in rows.values())
    plan = sweep_plan.plan_sweep(experiment, "demo", str(workdir))
    points = grid.expand(experiment, "demo")
    for run, point in zip(plan.runs, points):
        assert (run.index, run.point, run.seed, run.steps) == (
            point.index, point.point, point.seed, point.config.train.steps)
        assert run.flops_per_step == grid.StepCost.of(point.config, point.layout).flops
    assert "Left to run: 3 pre-trainings (18 steps," in out

    # A job array's one point: the plan of that point alone; one past the grid is an error.
    cli.main(["t5x-lite", "sweep", experiment, "--preset", "demo", "--workdir", str(workdir),
              "--dry_run", "--point_index", "1"])
    out = capsys.readouterr().out
    assert out.startswith(f"Dry run of sweep tiny_grid --preset demo --workdir {workdir} "
                          "--point_index 1 (a new workdir): nothing is trained, compiled or "
                          "written.\n1 run ")
    assert [line.split()[1] for line in out.splitlines() if re.match(r"\d+  ", line)] == [
        "broken"]
    with pytest.raises(SystemExit, match=r"point_index=3 must be in \[0, 3\)"):
        cli.main(["t5x-lite", "sweep", experiment, "--preset", "demo", "--workdir",
                  str(workdir), "--dry_run", "--point_index", "3"])
    assert not workdir.exists()


def test_table2_s_dry_run_counts_the_four_programs_its_sweep_compiles():
    """README: "all of Table 2 compiles four: three encoder-decoders and one for both
    decoder-only architectures"."""
    plan = sweep_plan.plan_sweep("table2", "demo", "/nonexistent/t5x_lite_plan")
    programs = {run.point: run.program for run in plan.runs}
    assert plan.programs == 4
    assert programs["language_model/lm"] == programs["prefix_lm/denoising"] == 4
    assert len({programs[f"{arch}/lm"] for arch in (
        "encoder_decoder", "encoder_decoder_shared", "encoder_decoder_half")}) == 3
    assert all(programs[p.replace("/lm", "/denoising")] == n
               for p, n in programs.items() if p.endswith("/lm"))
    grouped = sweep_plan.plan_sweep("table2", "demo", "/nonexistent/t5x_lite_plan", vmap=4)
    assert grouped.vmap_groups == ((0, 5), (1, 6), (2, 7), (3, 4, 8, 9))
    # README's sizing of the paper preset: 2^19 steps of 128 rows of 511 corpus tokens (+ EOS:
    # the paper's 2^35 tokens a run) for each of the 10 runs.
    plan = sweep_plan.plan_sweep("table2", "paper", "/nonexistent/t5x_lite_plan")
    assert {(run.steps, run.corpus_tokens) for run in plan.runs} == {(2**19, 2**19 * 128 * 511)}
    assert plan.programs == 4
    # The paper fine-tunes GLUE's tasks as one task: six fine-tuning runs a point, not 13.
    glue = ("glue_cola", "glue_sst2", "glue_mrpc", "glue_stsb", "glue_qqp", "glue_mnli",
            "glue_qnli", "glue_rte")
    assert plan.finetune_runs == (glue, ("cnn_dailymail",), ("squad",), ("wmt_ende",),
                                  ("wmt_enfr",), ("wmt_enro",))
    assert f"in 6 fine-tuning runs of 262,144 steps ({' + '.join(glue)} as one task" in (
        sweep_plan.render(plan))
    # Each at T5's targets length for its tasks: GLUE's 84, CNN/DM's 512, SQuAD's 97, WMT's 512.
    model = grid.expand("table2", "paper")[0].config.model
    assert plan.runs[0].finetune_flops == pytest.approx(2**18 * 128 * sum(
        accounting.train_flops_per_example(model, 512, length)
        for length in (84, 512, 97, 512, 512, 512)))
    # The total from the hand FLOP count (4.76e20 in the README), the tokens as above.
    flops = sum(point.config.train.steps * _hand_cost(point, "flops")
                for point in grid.expand("table2", "paper"))
    total = f"{flops:.3g}".replace("e+", "e")  # as the plan writes it
    assert (f"In all: {total} pre-training FLOPs (3 x forward matmuls, attention and "
            f"logits included), {10 * 2**19 * 128 * 511 / 1e9:.0f}G corpus tokens read,"
            ) in sweep_plan.render(plan)


def test_a_dry_run_of_a_started_sweep_says_what_is_done_and_what_resumes(
        experiment, uninterrupted, tmp_path, capsys):
    workdir, records = uninterrupted
    copy = tmp_path / "sweep"
    shutil.copytree(workdir, copy)
    # prefix_lm's record is lost and its pre-training stopped at step 4 of 6.
    lines = (copy / "results.jsonl").read_text().splitlines()
    (copy / "results.jsonl").write_text(
        "".join(line + "\n" for line in lines if json.loads(line)["point"] != "prefix_lm"))
    checkpoints = copy / "points" / "prefix_lm" / "seed0" / "pretrain" / "checkpoints"
    for path in checkpoints.iterdir():
        if path.name.isdigit():
            shutil.rmtree(path)
    (checkpoints / "4").mkdir()
    (checkpoints / "6.orbax-checkpoint-tmp-1").mkdir()  # a save cut short: not a step
    plan = sweep_plan.plan_sweep(experiment, "demo", str(copy))
    assert [(run.point, run.status) for run in plan.runs] == [
        ("denoising", "done"), ("broken", "done"), ("prefix_lm", "resumes at step 4")]
    text = sweep_plan.render(plan)
    assert "(resumed)" in text
    assert re.search(r"Left to run: 1 pre-training \(2 steps, \S+ FLOPs\) and 1 fine-tuning "
                     r"\(\d+ steps, \S+ FLOPs\); 2 of 3 runs done\.", text)
    (checkpoints / "6").mkdir()
    assert sweep_plan.plan_sweep(experiment, "demo", str(copy)).runs[2].status == (
        "pre-trained, 1 task left")
    # A stage a re-run gives finished records: the held-out loss that a record lacks.
    lines = (copy / "results.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert first["point"] == "denoising"
    (copy / "results.jsonl").write_text("\n".join(
        [json.dumps({**first, "held_out_loss": None}), *lines[1:]]) + "\n")
    plan = sweep_plan.plan_sweep(experiment, "demo", str(copy))
    assert [run.status for run in plan.runs[:2]] == ["done; adds held-out loss", "done"]
    assert ("Then held-out loss added to the finished records of 1 run, from their "
            "checkpoints (nothing is trained again).") in sweep_plan.render(plan)
    # A dry run checks the workdir as the sweep does, in one line.
    with pytest.raises(SystemExit, match=r"^t5x-lite sweep: invalid config: workdir .* holds a "
                                         r"different sweep \(overrides: .*\)"):
        cli.main(["t5x-lite", "sweep", experiment, "--preset", "demo", "--workdir", str(copy),
                  "--dry_run", "--config.train.learning_rate=0.5"])
    with pytest.raises(ConfigError, match=r"vmap=0 must be an integer >= 1"):
        sweep_plan.plan_sweep(experiment, "demo", str(copy), vmap=0)
