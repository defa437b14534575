"""A tiny training run killed with SIGKILL at a seeded random step, then preempted with SIGTERM a
few steps after resuming, and resumed again ends bit-identical to an uninterrupted run: same
final train state, same loss at every step any run logged. The preempted run saves the step it
reached and exits with `PREEMPTED_EXIT_STATUS`, not 0.

Each run is a child process (`python tests/test_resume.py DATA_DIR WORKDIR [KILL|TERM AT]`):
`t5x-lite train --config=tests/test_resume.py:DATA_DIR` on a 2-device mesh. A child sends
itself the signal when the loop asks for batch AT, i.e. after update AT ran but before it was
logged (SIGKILL: possibly while an asynchronous checkpoint write is in flight) or before the
loop looked for a signal (SIGTERM). KILL_AT > 2 * EVERY, so at least one checkpoint is complete
by then (orbax finishes a save before it starts the next); TERM_AT is no save step, so its
checkpoint is the preemption's. The children share the session's persistent compilation cache
(xla_env.py), so only the first one compiles the train step.
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
from xla_env import child_env

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


def get_config(data_dir: str) -> ml_collections.ConfigDict:
    """The children's config, as `--config=tests/test_resume.py:DATA_DIR` reads it."""
    return tiny_config(pathlib.Path(data_dir))


def run_child(data_dir: pathlib.Path, workdir: pathlib.Path, stop: str = "",
              at: int = -1) -> subprocess.CompletedProcess:
    env = child_env(2)
    command = [sys.executable, __file__, str(data_dir), str(workdir)]
    return subprocess.run(command + ([stop, str(at)] if stop else []), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def losses(workdir: pathlib.Path) -> list[tuple[int, float]]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [(record["step"], record["loss"]) for record in map(json.loads, lines)]


def newest_checkpoint(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> int | None:
    from t5x_lite.checkpointing import Checkpointer

    with Checkpointer(workdir / "checkpoints", every=EVERY, keep=STEPS, config=config) as ckpt:
        return ckpt.latest_step()


def final_state(config: ml_collections.ConfigDict, workdir: pathlib.Path):
    from t5x_lite import partitioning, train_state
    from t5x_lite.checkpointing import Checkpointer

    mesh = partitioning.make_mesh(config.mesh, jax.devices()[:2])
    with Checkpointer(workdir / "checkpoints", every=EVERY, keep=STEPS, config=config) as ckpt:
        assert ckpt.latest_step() == STEPS
        return jax.device_get(ckpt.restore(train_state.abstract_state(config, mesh)))


@pytest.mark.slow  # four training processes; the first compiles the train step
def test_killed_and_preempted_run_resumes_to_match_an_uninterrupted_one(tmp_path):
    from t5x_lite.preemption import PREEMPTED_EXIT_STATUS

    data_dir = tmp_path / "data"
    write_corpus(data_dir)
    config = tiny_config(data_dir)
    kill_at = random.Random(4).randint(2 * EVERY + 1, STEPS - 2)
    term_at = next(step for step in range(kill_at + 1, STEPS) if step % EVERY)

    reference = run_child(data_dir, tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr[-3000:]

    killed = run_child(data_dir, tmp_path / "resumed", "KILL", kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    # The kill comes as the loop makes the batch of step kill_at + 1, having queued step
    # kill_at; the loop records a step while the next one runs, so step kill_at - 1 is on
    # record only if a checkpoint at it had its loss read first.
    logged = kill_at - 1 if (kill_at - 1) % EVERY == 0 else kill_at - 2
    assert [step for step, _ in losses(tmp_path / "resumed")] == list(range(1, logged + 1))
    # The newest checkpoint that was complete when the kill came is what a resume starts from.
    newest_started = (kill_at - 1) // EVERY * EVERY
    assert newest_checkpoint(config, tmp_path / "resumed") in (newest_started - EVERY,
                                                               newest_started)

    preempted = run_child(data_dir, tmp_path / "resumed", "TERM", term_at)
    assert preempted.returncode == PREEMPTED_EXIT_STATUS, preempted.stderr[-3000:]
    assert f"SIGTERM at step {term_at}: stopping with exit status" in preempted.stderr
    assert newest_checkpoint(config, tmp_path / "resumed") == term_at
    assert [step for step, _ in losses(tmp_path / "resumed")] == list(range(1, term_at + 1))

    resumed = run_child(data_dir, tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # It says so (only a sweep's pre-training did).
    assert f"resuming at step {term_at} of {STEPS}, its newest checkpoint" in resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["start_step"] == term_at and summary["step"] == STEPS

    # Every step logged by any attempt (some twice) has the reference's exact loss.
    expected = dict(losses(tmp_path / "reference"))
    assert sorted(expected) == list(range(1, STEPS + 1))
    for step, loss in losses(tmp_path / "resumed"):
        assert loss == expected[step], f"step {step}"

    want, got = final_state(config, tmp_path / "reference"), final_state(config, tmp_path / "resumed")
    assert int(got.step) == STEPS
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))


def _child_main(data_dir: str, workdir: str, stop: str = "", at: str = "-1") -> None:
    """`t5x-lite train` of the children's config, sending itself SIG`stop` (KILL or TERM)
    when the loop asks for batch `at`."""
    from t5x_lite import cli
    from t5x_lite.data.pipeline import PretrainData

    if stop:
        fetch, signum = PretrainData.batch, getattr(signal, f"SIG{stop}")

        def batch_or_signal(self: PretrainData, step: int) -> np.ndarray:
            if step == int(at):
                os.kill(os.getpid(), signum)
            return fetch(self, step)

        PretrainData.batch = batch_or_signal
    cli.main(["t5x-lite", "train", f"--config={__file__}:{data_dir}", f"--workdir={workdir}"])


if __name__ == "__main__":
    _child_main(*sys.argv[1:])
