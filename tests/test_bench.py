"""`t5x-lite bench` reports what issue #4 asks for: one JSON object with tokens/s, step time,
MFU, compile time and the config it ran. Nothing here checks a speed (benchmarks, not tests);
it checks that every number is there, is consistent with the others and is JSON."""
import json
import platform
import subprocess
import sys

import jax
import pytest

from t5x_lite import accounting, bench, compilation_cache, presets
from t5x_lite.config import ConfigError
from tiny_configs import tiny_train_config
from xla_env import user_env


def test_bench_command_prints_one_consistent_json_object(tmp_path):
    """`t5x-lite bench --preset tiny --json`, shrunk by overrides to run in seconds, in a fresh
    process on one CPU device: one JSON object whose numbers agree with each other and with
    the accounting module, for the config the overrides made. Its compile time is measured:
    it neither loads from nor writes to the commands' persistent compilation cache."""
    # One CPU device, as on a laptop, with a user's environment (the commands' own compilation
    # cache) and XLA's freed host memory kept (`host_memory`).
    env = user_env(1, str(tmp_path), T5X_LITE_RETAIN_HOST_MEMORY="1")
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
    # The median of 2 timed calls, and the spread it comes from.
    fastest, slowest = result["step_ms_range"]
    assert result["timed_calls"] == 2 and fastest <= result["step_ms"] <= slowest
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
    # Steps queued back to back are timed on an accelerator only: a CPU is its own host.
    assert result["pipelined_step_ms"] is None and result["pipelined_mfu"] is None
    assert result["compile_s"] > 0 and result["corruption_ms"] > 0
    assert 0 < result["init_compile_s"] < result["init_s"]
    assert result["devices"] == "1 x cpu"
    # Asked for, the CLI keeps XLA's freed host memory wherever glibc lets it.
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert result["host_memory_retained"] is glibc
    assert result["peak_memory_gib"] is None  # JAX keeps no memory statistics for a CPU
    # XLA's own account of the step's buffers, on any backend: at least the parameters and
    # AdamW's two moments (3 x 4 bytes x 3.1 M parameters), far below a GiB.
    params = accounting.param_count(config.model)
    assert 12 * params / 2**30 < result["program_memory_gib"] < 1
    assert "torch" not in result
    assert not (tmp_path / compilation_cache.DEFAULT_DIR).exists()


def test_pipelined_timing_queues_every_call_and_waits_once_at_the_end(monkeypatch):
    """`bench.pipelined_seconds`: the warm-up call is waited on alone, then `steps` calls go
    out without a wait between them, and the last result is waited on; the time is per call."""
    events = []
    monkeypatch.setattr(bench.jax, "block_until_ready",
                        lambda value: events.append(("wait", value)) or value)
    clock = iter([10.0, 13.0])
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    calls = iter(range(4))
    seconds = bench.pipelined_seconds(lambda: events.append(("call",)) or next(calls), steps=3)
    assert events == [("call",), ("wait", 0), ("call",), ("call",), ("call",), ("wait", 3)]
    assert seconds == pytest.approx(1.0)


def test_torch_comparison_needs_the_like_for_like_model():
    config = tiny_train_config(mesh=(1, 1))  # Adafactor: PyTorch has no T5 Adafactor in core
    with pytest.raises(ValueError, match="train.optimizer='adamw'"):
        bench.torch_t5_train_step(config)


def test_bench_refuses_a_step_no_run_could_train_before_compiling(monkeypatch):
    """The attention weights dropped on a kernel that forms none failed inside the trace."""
    config = tiny_train_config(mesh=(1, 1))
    config.model.update(dropout_rate=0.1, attention_impl="xla")
    monkeypatch.setattr(bench, "jax_train_step", lambda config: pytest.fail("compiled"))
    with pytest.raises(ConfigError, match="^model.attention_impl='xla' never forms the attention"):
        bench.run_benchmarks(config, steps=1, warmup=0)


def test_decode_benchmark_refuses_an_architecture_that_does_not_decode_token_by_token():
    config = tiny_train_config("encoder_only", mesh=(1, 1))
    with pytest.raises(ConfigError, match="model.arch='encoder_only' does not do"):
        bench.decode_benchmark(config, new_tokens=6, steps=1, warmup=0)


@pytest.mark.parametrize("arch", ["encoder_decoder", "prefix_lm", "language_model"])
def test_cached_decoding_emits_the_tokens_of_recomputation(arch):
    """What `bench --decode`'s speed-up stands on: the key/value-cached greedy loop emits, row by
    row, the tokens of re-running the whole decoder at every step (a random model, 6 tokens)."""
    config = tiny_train_config(arch, mesh=(1, 1))
    config.train.batch_size = 3
    result = bench.decode_benchmark(config, new_tokens=6, steps=1, warmup=0)
    assert result["tokens_match"] is True
    assert (result["arch"], result["batch_size"], result["new_tokens"]) == (arch, 3, 6)
    assert 1 <= result["cached_steps"] <= 6
    assert result["speedup"] == pytest.approx(result["recompute_s"] / result["cached_s"])
    assert result["timed_calls"] == 1
    assert result["cached_ms_range"] == [result["cached_s"] * 1e3] * 2


def test_the_decode_benchmark_s_token_check_catches_a_baseline_that_differs(monkeypatch):
    """`tokens_match` compares the two loops' tokens: a re-computation off in one token fails."""
    config = tiny_train_config("encoder_decoder", mesh=(1, 1))
    config.train.batch_size = 3
    recompute = bench.greedy_by_recomputation
    monkeypatch.setattr(bench, "greedy_by_recomputation",
                        lambda *args: recompute(*args).at[1, 0].add(1))
    result = bench.decode_benchmark(config, new_tokens=6, steps=1, warmup=0)
    assert result["tokens_match"] is False


def test_torch_comparison_and_pipeline_timing_at_toy_size():
    """`bench --compare_torch --pipeline` on a toy model: the PyTorch T5 has exactly our model's
    parameters (counted on both built models), and the ratios are the times' ratios."""
    import numpy as np
    from flax import nnx

    from t5x_lite.models import build_model

    config = tiny_train_config(mesh=(1, 1))
    config.train.update(optimizer="adamw", batch_size=2)
    torch_model = bench.torch_t5(config)[0]
    ours = nnx.state(build_model(config.model, nnx.Rngs(0)), nnx.Param)
    ours_count = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(ours))
    assert sum(p.numel() for p in torch_model.parameters()) == ours_count

    result = bench.run_benchmarks(config, steps=1, warmup=0, compare_torch=True, pipeline=True)
    assert (result["torch"]["dtype"], result["torch"]["device"]) == ("float32", "cpu")
    assert result["torch"]["step_ms_range"] == [result["torch"]["step_ms"]] * 2  # one call
    assert result["speedup_vs_torch"] == pytest.approx(
        result["torch"]["step_ms"] / result["step_ms"])
    assert result["torch"]["tokens_per_second"] == pytest.approx(
        result["tokens_per_second"] / result["speedup_vs_torch"])
    assert result["pipeline_batch_ms"] > 0
    assert result["pipeline_speedup_vs_step"] == pytest.approx(
        result["step_ms"] / result["pipeline_batch_ms"])


def test_the_torch_comparison_refuses_a_step_it_would_not_match():
    """PyTorch's T5 step runs float32 on the CPU: a bfloat16 step was timed against it and
    its ratio reported as a speed-up."""
    config = tiny_train_config(mesh=(1, 1))
    config.train.update(optimizer="adamw", batch_size=2)
    config.model.dtype = "bfloat16"
    with pytest.raises(ConfigError, match=r"^--compare_torch needs .*model.dtype='float32' on "
                                          r"the CPU .*model.dtype='bfloat16' on cpu$"):
        bench.run_benchmarks(config, steps=1, warmup=0, compare_torch=True)


def test_a_corpus_the_pipeline_cannot_read_stops_bench_before_anything_compiles(tmp_path,
                                                                               monkeypatch):
    """`bench --pipeline` read its corpus last, after building, compiling and timing the step
    (minutes at the paper preset) only to fail there."""
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00 not text \x80")
    config = tiny_train_config(mesh=(1, 1))
    config.data.update(corpus=str(tmp_path / "binary.txt"), data_dir=str(tmp_path / "data"))
    monkeypatch.setattr(bench, "jax_train_step",
                        lambda config: pytest.fail("the step was built before the corpus read"))
    with pytest.raises(ConfigError, match="holds no records"):
        bench.run_benchmarks(config, steps=1, warmup=0, pipeline=True)
