"""A tiny training run killed with SIGKILL at a seeded random step and resumed ends bit-identical
to an uninterrupted run: same final train state, same loss at every step either run logged.

Each run is a child process (`python tests/test_resume.py DATA_DIR WORKDIR KILL_AT`) on a
2-device mesh. The killed child SIGKILLs itself when the loop asks for batch KILL_AT, i.e. after
update KILL_AT ran but before it was logged or saved, possibly while an asynchronous checkpoint
write is in flight. KILL_AT > 2 * EVERY, so at least one checkpoint is complete by then (orbax
finishes a save before it starts the next). The children share JAX's persistent compilation
cache, so only the first one compiles the train step.
"""
import json
import os
import pathlib
import random
import signal
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from t5x_lite.config import default_config

STEPS, EVERY = 12, 3
REPO = pathlib.Path(__file__).resolve().parents[1]


def tiny_config(data_dir: pathlib.Path) -> ml_collections.ConfigDict:
    config = default_config()
    config.model.update(d_model=32, d_ff=64, num_heads=4, d_kv=8, num_layers=2, vocab_size=160,
                        num_sentinels=32, dropout_rate=0.0)
    config.objective.update(inputs_length=32, targets_length=None)
    config.train.update(batch_size=8, steps=STEPS, optimizer="adamw", schedule="constant",
                        learning_rate=1e-2, warmup_steps=1, log_every=STEPS)
    config.mesh.shape = (2, 1)
    config.data.update(corpus=str(data_dir / "corpus" / "*.txt"), data_dir=str(data_dir / "cache"))
    config.checkpoint.update(every=EVERY, keep=STEPS)
    return config


def write_corpus(data_dir: pathlib.Path) -> None:
    """Made-up words, varied enough for a 128-piece SentencePiece vocabulary."""
    rng = random.Random(0)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 7))) for _ in range(300)]
    (data_dir / "corpus").mkdir(parents=True)
    for i in range(4):
        lines = (" ".join(rng.choices(words, k=12)) for _ in range(60))
        (data_dir / "corpus" / f"{i}.txt").write_text("\n".join(lines) + "\n")


def run_child(data_dir: pathlib.Path, workdir: pathlib.Path, kill_at: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_COMPILATION_CACHE_DIR": str(data_dir / "jax_cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    return subprocess.run([sys.executable, __file__, str(data_dir), str(workdir), str(kill_at)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def losses(workdir: pathlib.Path) -> list[tuple[int, float]]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [(record["step"], record["loss"]) for record in map(json.loads, lines)]


def final_state(config: ml_collections.ConfigDict, workdir: pathlib.Path):
    from t5x_lite import partitioning, train_step
    from t5x_lite.checkpointing import Checkpointer

    mesh = partitioning.make_mesh(config.mesh, jax.devices()[:2])
    with Checkpointer(workdir / "checkpoints", every=EVERY, keep=STEPS, config=config) as ckpt:
        assert ckpt.latest_step() == STEPS
        return jax.device_get(ckpt.restore(train_step.abstract_state(config, mesh)))


@pytest.mark.slow  # three training processes; the first compiles the train step
def test_killed_and_resumed_run_matches_an_uninterrupted_one(tmp_path):
    data_dir = tmp_path / "data"
    write_corpus(data_dir)
    kill_at = random.Random(4).randint(2 * EVERY + 1, STEPS - 1)

    reference = run_child(data_dir, tmp_path / "reference", kill_at=-1)
    assert reference.returncode == 0, reference.stderr[-3000:]

    killed = run_child(data_dir, tmp_path / "resumed", kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert [step for step, _ in losses(tmp_path / "resumed")] == list(range(1, kill_at))

    resumed = run_child(data_dir, tmp_path / "resumed", kill_at=-1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads(resumed.stdout.splitlines()[-1])
    # Resumed from the newest checkpoint that was complete when the kill came.
    newest_started = (kill_at - 1) // EVERY * EVERY
    assert summary["start_step"] in (newest_started - EVERY, newest_started)
    assert summary["step"] == STEPS

    # Every step logged by either attempt (some twice) has the reference's exact loss.
    expected = dict(losses(tmp_path / "reference"))
    assert sorted(expected) == list(range(1, STEPS + 1))
    for step, loss in losses(tmp_path / "resumed"):
        assert loss == expected[step], f"step {step}"

    config = tiny_config(data_dir)
    want, got = final_state(config, tmp_path / "reference"), final_state(config, tmp_path / "resumed")
    assert int(got.step) == STEPS
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))


def _child_main(data_dir: str, workdir: str, kill_at: int) -> None:
    from t5x_lite import train
    from t5x_lite.data.pipeline import PretrainData

    if kill_at >= 0:
        fetch = PretrainData.batch

        def batch_or_die(self: PretrainData, step: int) -> np.ndarray:
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return fetch(self, step)

        PretrainData.batch = batch_or_die
    summary = train.train(tiny_config(pathlib.Path(data_dir)), workdir, progress=False)
    print(json.dumps(summary))


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
