"""`t5x-lite bench` reports what issue #4 asks for: one JSON object with tokens/s, step time,
MFU, compile time and the config it ran. Nothing here checks a speed (benchmarks, not tests);
it checks that every number is there, is consistent with the others and is JSON."""
import json
import os
import platform
import subprocess
import sys

import pytest

from t5x_lite import accounting, bench, presets
from tiny_configs import tiny_train_config


def test_bench_command_prints_one_consistent_json_object():
    """`t5x-lite bench --preset tiny --json`, shrunk by overrides to run in seconds, in a fresh
    process on one CPU device: one JSON object whose numbers agree with each other and with
    the accounting module, for the config the overrides made."""
    # One CPU device, as on a laptop; with XLA's freed host memory kept (`host_memory`).
    env = {**os.environ, "XLA_FLAGS": "", "T5X_LITE_RETAIN_HOST_MEMORY": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "t5x_lite.cli", "bench", "--preset", "tiny", "--json",
         "--bench_steps", "2", "--config.model.num_layers=1", "--config.model.d_ff=256",
         "--config.train.batch_size=2"],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)

    config = presets.tiny()
    config.model.update(num_layers=1, d_ff=256)
    config.train.batch_size = 2
    assert result["config"]["model"] == config.model.to_dict()
    assert result["config"]["train"]["batch_size"] == 2
    layout, step_s = result["layout"], result["step_ms"] / 1e3
    tokens = 2 * (layout["inputs_length"] + layout["targets_length"])
    assert result["tokens_per_second"] == pytest.approx(tokens / step_s)
    flops = 2 * accounting.train_flops_per_example(
        config.model, layout["inputs_length"], layout["targets_length"])
    assert result["tflops_per_second"] == pytest.approx(flops / step_s / 1e12)
    # On a CPU the yardstick is the matmul timed in the same loop as the step.
    assert result["peak_source"].startswith("fastest of the 1024x1024 matmuls")
    assert result["mfu"] == pytest.approx(
        result["tflops_per_second"] / result["peak_tflops_per_second"])
    assert 0 < result["mfu"] < 1
    assert result["compile_s"] > 0 and result["corruption_ms"] > 0
    assert result["devices"] == "1 x cpu"
    # Asked for, the CLI keeps XLA's freed host memory wherever glibc lets it.
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert result["host_memory_retained"] is glibc
    assert "torch" not in result


def test_torch_comparison_needs_the_like_for_like_model():
    config = tiny_train_config(mesh=(1, 1))  # Adafactor: PyTorch has no T5 Adafactor in core
    with pytest.raises(ValueError, match="train.optimizer='adamw'"):
        bench.torch_t5_train_step(config)
