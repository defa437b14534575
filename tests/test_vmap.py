"""Vectorised pre-training: K points in one vmapped step equal K sequential runs.

Three tiny encoder-decoder points (two corruption rates with different seeds, and prefix LM)
pre-train 3 steps each through `train.train`, then together through `train.train_vmapped`;
the losses per step and the final parameters agree to float32 tolerance.
"""
import json
import shutil

import jax
import numpy as np
import pytest

from t5x_lite import checkpointing, objectives, partitioning, train, train_state, train_step
from t5x_lite.config import ConfigError
from compile_events import cold_program_cache
from tiny_configs import tiny_train_config

STEPS = 3
# (objective, noise density, seed): what a vectorised sweep may vary within one chunk.
POINTS = (("span_corruption", 0.15, 0), ("span_corruption", 0.5, 1), ("prefix_lm", 0.15, 0))


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghij"), rng.integers(2, 6))) for _ in range(300)]
    (corpus / "docs.txt").write_text(
        "\n\n".join(" ".join(rng.choice(words, 40)) for _ in range(100)))
    data_dir = tmp_path_factory.mktemp("data")
    configs = []
    for name, rate, seed in POINTS:
        config = tiny_train_config(mesh=(1, 1), log_every=1)
        config.train.steps = STEPS
        config.model.update(vocab_size=200, num_sentinels=40)
        config.objective.update(name=name, noise_density=rate)
        config.train.seed = seed
        config.data.update(corpus=str(corpus / "*.txt"), data_dir=str(data_dir))
        config.checkpoint.update(every=2, keep=1)
        config.train.update(eval_every=2, eval_batches=1)
        configs.append(config)
    return configs


@pytest.fixture(scope="module")
def layout(configs):
    return objectives.layout_for([c.objective for c in configs], "encoder_decoder", 200, 40)


def _losses(workdir):
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def _final_params(config, workdir):
    mesh = partitioning.make_mesh(config.mesh)
    abstract = train_state.abstract_state(config, mesh).params
    return jax.device_get(checkpointing.restore_params_only(workdir / "checkpoints", abstract))


@pytest.fixture(scope="module")
def sequential(configs, layout, tmp_path_factory):
    workdirs = [tmp_path_factory.mktemp(f"sequential{k}") for k in range(len(configs))]
    for config, workdir in zip(configs, workdirs):
        train.train(config, workdir, progress=False, layout=layout)
    return workdirs


@pytest.fixture(scope="module")
def vmapped(configs, layout, tmp_path_factory):
    workdirs = [tmp_path_factory.mktemp(f"vmapped{k}") for k in range(len(configs))]
    # A cold program cache: the chunk's step compiles here even if another test (e.g. the
    # restart below) ran this chunk first.
    with cold_program_cache():
        summaries = train.train_vmapped(configs, workdirs, layout=layout, progress=False)
    return workdirs, summaries


def test_vmapped_pretraining_equals_sequential_runs(configs, sequential, vmapped):
    workdirs, summaries = vmapped
    for config, alone, together, summary in zip(configs, sequential, workdirs, summaries):
        np.testing.assert_allclose(_losses(together), _losses(alone), rtol=1e-5)
        assert summary["step"] == STEPS and summary["loss"] == _losses(together)[-1]
        # Two programs that sum in other orders: Adam's m / sqrt(v) amplifies the last bits of
        # a small gradient (jax 0.10.2: at most 3.0e-6 on parameters of order 1).
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
                     _final_params(config, together), _final_params(config, alone))
        # Each point's held-out text and noise are its own run's: its seed's and objective's.
        held_out = [[(r["step"], r["loss"]) for r in map(json.loads, lines)]
                    for lines in ((w / "eval.jsonl").read_text().splitlines()
                                  for w in (together, alone))]
        assert [step for step, _ in held_out[0]] == [step for step, _ in held_out[1]] == \
            [2, STEPS]  # every eval_every steps and at the last
        np.testing.assert_allclose([loss for _, loss in held_out[0]],
                                   [loss for _, loss in held_out[1]], rtol=1e-5)
        assert summary["held_out_loss"] == held_out[0][-1][1]
    # The points really differ: different objectives and seeds give different losses.
    assert len({round(_losses(w)[0], 4) for w in workdirs}) == len(configs)


def test_the_chunk_compiles_one_step(vmapped):
    for workdir in vmapped[0]:
        lines = (workdir / "metrics.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert [r["compiles"] for r in records] == [1] * STEPS  # counted from the first step
        assert records[0]["compile_s"] > 0 and all(r["compile_s"] == 0 for r in records[1:])


def test_a_finished_chunk_is_not_trained_again(configs, layout, vmapped):
    workdirs, _ = vmapped
    before = [_losses(w) for w in workdirs]
    summaries = train.train_vmapped(configs, workdirs, layout=layout, progress=False)
    assert [s["start_step"] for s in summaries] == [STEPS] * len(configs)
    assert [_losses(w) for w in workdirs] == before


def test_points_at_different_steps_restart_together(configs, layout, sequential, tmp_path):
    workdirs = [tmp_path / f"point{k}" for k in range(len(configs))]
    train.train(configs[0], workdirs[0], steps=2, progress=False, layout=layout)
    with pytest.warns(UserWarning, match="at different steps; pre-training all of them again"):
        train.train_vmapped(configs, workdirs, layout=layout, progress=False)
    for alone, together in zip(sequential, workdirs):
        np.testing.assert_allclose(_losses(together), _losses(alone), rtol=1e-5)


def test_a_point_whose_newest_checkpoint_is_unreadable_resumes_the_chunk_where_all_can(
        configs, layout, sequential, tmp_path):
    """One point falling back past a damaged newest step (set aside) while the others restore
    theirs: the chunk trains on from the step it fell back to where every point holds it, else
    from step 0, as points saved apart do. It raised, and a sweep recorded every point of the
    chunk as failed for good."""
    kept = [config.copy_and_resolve_references() for config in configs]
    for config in kept:
        config.checkpoint.keep = 2  # steps 2 and 3: a step to fall back to
    for lost_by_another, resumed_from in ((False, 2), (True, 0)):
        workdirs = [tmp_path / f"{resumed_from}_point{k}" for k in range(len(kept))]
        train.train_vmapped(kept, workdirs, layout=layout, progress=False)
        (workdirs[1] / "checkpoints" / str(STEPS) / "default" / "manifest.ocdbt").unlink()
        if lost_by_another:  # the step point 1 falls back to is gone from point 0
            shutil.rmtree(workdirs[0] / "checkpoints" / str(STEPS - 1))
        with pytest.warns(UserWarning, match=r"restored different steps \[3, 2, 3\] \(an "
                          r"unreadable checkpoint was set aside\); pre-training all of them on "
                          rf"from step {resumed_from}"):
            summaries = train.train_vmapped(kept, workdirs, layout=layout, progress=False)
        assert [s["start_step"] for s in summaries] == [resumed_from] * len(kept)
        for alone, together in zip(sequential, workdirs):
            np.testing.assert_allclose(_losses(together), _losses(alone), rtol=1e-5)
        assert (workdirs[1] / "checkpoints" / "unreadable").is_dir()


def test_configs_that_cannot_share_a_step_are_rejected(configs, layout, tmp_path):
    other = configs[1].copy_and_resolve_references()
    other.model.d_ff = 128
    other.train.learning_rate = 0.5
    with pytest.raises(ConfigError, match=r"configs\[1\] differs from configs\[0\] in "
                                          r"model.d_ff, train.learning_rate; points"):
        train.train_vmapped([configs[0], other], [tmp_path / "a", tmp_path / "b"],
                            layout=layout)
    with pytest.raises(ConfigError, match="got 2 configs but 1 workdirs"):
        train.train_vmapped(configs[:2], [tmp_path / "a"], layout=layout)
    assert not (tmp_path / "a").exists()  # refused before anything ran


def test_stacked_specs_keep_the_fields_all_points_share_as_scalars(configs):
    spec = train_step.stack_specs([objectives.spec_from_config(c.objective) for c in configs])
    np.testing.assert_array_equal(spec.objective, [0, 0, objectives.objective_id("prefix_lm")])
    np.testing.assert_allclose(spec.noise_density, [0.15, 0.5, 0.15])
    assert np.ndim(spec.mean_noise_span_length) == 0  # shared: a real branch, not a select
    assert np.ndim(spec.random_token_fraction) == 0


def test_the_vmap_benchmark_times_both_ways_and_says_what_each_program_needs(benchmark_script):
    """benchmarks/vmap_throughput.py (the accelerator check's vmap parts) at toy size: K points
    timed both ways, the vmapped program's memory holding K points' states and activations
    where the sequential one holds one point's, and both ways' first update of each point
    agreeing."""
    vmap_throughput = benchmark_script("vmap_throughput")
    result = vmap_throughput.vmap_benchmark(
        "table6", "demo", steps=1, warmup=0, points=2,
        overrides=("sweep.seeds=(0, 1)", "data.corpus=python_docs", "train.batch_size=8"))
    assert result["K"] == 2 and len(result["points"]) == 2
    assert result["speedup"] == pytest.approx(
        result["sequential_s_per_update"] / result["vmapped_s_per_update"])
    memory = result["memory_gib"]
    assert 1.5 * memory["sequential"] < memory["vmapped"] < 2.5 * memory["sequential"]
    # The two ways compute the same first update of each point (float32 here).
    losses = result["first_update_losses"]
    assert len(losses["sequential"]) == 2 and losses["sequential"][0] > 1.0
    np.testing.assert_allclose(losses["vmapped"], losses["sequential"], rtol=1e-5)
    assert result["first_update_loss_difference"] <= 1e-5 * max(losses["sequential"])
