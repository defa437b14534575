"""Benchmarks behind `t5x-lite bench`: train-step speed, MFU, on-device corruption cost, the
same step in PyTorch (Hugging Face transformers T5) measured in the same process, and cached
decoding against re-computation (`decode_benchmark`).

Timings are taken here and nowhere else: tests never time anything. Every number is the
median over `steps` timed calls after `warmup` untimed ones, with the device synchronised
around each call. On a CPU, MFU is measured against the fastest `accounting.cpu_matmul` of
those timed in turns with the step (`_PeakMatmul`), so the step and its yardstick see the same
stretch of the machine's drifting speed. Raw tokens are random real-token ids: the step's
cost does not depend on their values, and the pipeline's own speed is measured separately
(`pipeline_batches`).
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from flax import nnx

from t5x_lite import (accounting, architectures, batch_format, compile_events, convert, decoding,
                      export, host_memory, loop, objectives, partitioning, programs,
                      train_state, train_step)
from t5x_lite.config import EOS_ID, NUM_RESERVED_IDS, ConfigError, sentinel_id
from t5x_lite.models import build_model, make_masks
from t5x_lite.settings import Settings, require_trainable


def report_phase(what: str, seconds: float) -> None:
    """One progress line on stderr, 'bench: WHAT in S s': set-up before the first timed step
    takes minutes at T5-base on an accelerator, and a run cut off there shows how far it got."""
    print(f"bench: {what} in {seconds:.1f} s", file=sys.stderr, flush=True)


def seconds_in_turns(*fns: Callable[[], Any], steps: int, warmup: int) -> list[list[float]]:
    """The `steps` wall times of each of `fns` after `warmup` untimed calls, each call waited
    on, timed in turns (f1, f2, f1, f2, ...) so that drift in the machine's speed during the
    run affects every one of them alike."""
    for fn in fns:
        for _ in range(warmup):
            jax.block_until_ready(fn())
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(steps):
        for fn, fn_times in zip(fns, times):
            start = time.perf_counter()
            jax.block_until_ready(fn())
            fn_times.append(time.perf_counter() - start)
    return times


def median_seconds(*fns: Callable[[], Any], steps: int, warmup: int) -> list[float]:
    """The median of each of `fns`' `seconds_in_turns`."""
    return [statistics.median(t) for t in seconds_in_turns(*fns, steps=steps, warmup=warmup)]


def range_ms(times: Sequence[float]) -> list[float]:
    """[fastest, slowest] of timed calls, in milliseconds: the spread a median comes from
    (one run cannot tell a change within it from noise)."""
    return [min(times) * 1e3, max(times) * 1e3]


def pipelined_seconds(fn: Callable[[], Any], steps: int) -> float:
    """Wall time per call of `fn` called `steps` times back to back with one wait at the end:
    the host queues call N + 1 while the device runs call N, as the training loop does
    (`loop.run_loop` reads a step's metrics one step late), so the host's dispatch work (~10 ms
    a step at T5-base's 1,031 state arrays) overlaps the device's instead of adding to it.
    `median_seconds` waits on every call: the step time with dispatch included."""
    jax.block_until_ready(fn())  # nothing of the warm-up left in the queue
    start = time.perf_counter()
    for _ in range(steps):
        result = fn()
    jax.block_until_ready(result)
    return (time.perf_counter() - start) / steps


class _PeakMatmul:
    """A closure for `median_seconds` that times `repeats` CPU peak matmuls per call and
    keeps every time: `peak` is the FLOP/s of the fastest, the one least disturbed."""

    def __init__(self, dtype: Any, repeats: int = 5):
        self.matmul, self.flops = accounting.cpu_matmul(dtype)
        self.repeats = repeats
        self.seconds: list[float] = []

    def __call__(self) -> None:
        for _ in range(self.repeats):
            start = time.perf_counter()
            self.matmul().block_until_ready()
            self.seconds.append(time.perf_counter() - start)

    @property
    def peak(self) -> float:
        return self.flops / min(self.seconds)


def random_raw_tokens(config: ml_collections.ConfigDict, raw_length: int, seed: int = 0) -> np.ndarray:
    """int32 [batch_size, raw_length] of ids from the real-token range (no pad, no sentinel)."""
    high = sentinel_id(config.model.vocab_size, config.model.num_sentinels - 1)
    return np.random.default_rng(seed).integers(
        NUM_RESERVED_IDS, high, (config.train.batch_size, raw_length), dtype=np.int32)


def _layout(config: ml_collections.ConfigDict) -> objectives.BatchLayout:
    """The config's layout, reading sentences off its vocabulary if its objective needs them."""
    layout = objectives.layout_from_config(config)
    if not layout.reads_sentences:
        return layout
    from t5x_lite.data.pipeline import layout_with_vocabulary  # imports TFDS: only if needed

    return layout_with_vocabulary(layout, config)


def jax_train_step(config: ml_collections.ConfigDict) -> tuple[Callable[[], Any], dict[str, Any]]:
    """A closure running one jitted train step (corruption included) on all local devices,
    already compiled, and facts about it: its mesh, compile times, devices and layout."""
    mesh = partitioning.make_mesh(config.mesh)
    layout = _layout(config)
    step = train_step.make_train_step(config, layout, mesh)
    spec = objectives.spec_from_config(config.objective)
    raw = random_raw_tokens(config, layout.raw_length)
    rng = train_state.step_key(config.train.seed)
    with compile_events.compile_seconds() as init_compiles:
        start = time.perf_counter()
        state = jax.block_until_ready(train_state.init_state(config, mesh))
        init_s = time.perf_counter() - start
    report_phase(f"initial state built ({sum(init_compiles):.1f} s of it compiling)", init_s)
    start = time.perf_counter()
    state, _ = step(state, raw, spec, rng)
    jax.block_until_ready(state)
    first_call_s = time.perf_counter() - start
    report_phase("train step compiled and run once", first_call_s)

    def run() -> Any:
        nonlocal state
        state, metrics = step(state, raw, spec, rng)
        return metrics

    info = {
        "mesh": mesh,
        "init_s": init_s,
        "init_compile_s": sum(init_compiles),
        "compile_s": step.program.compile_seconds,
        "first_call_s": first_call_s,
        "program_memory_gib": program_memory_gib(step),
        "devices": f"{mesh.devices.size} x {mesh.devices.flat[0].device_kind}",
        "layout": {"raw_length": layout.raw_length, "inputs_length": layout.inputs_length,
                   "targets_length": layout.targets_length},
    }
    return run, info


def corruption_only(config: ml_collections.ConfigDict) -> Callable[[], Any]:
    """A closure running `objectives.corrupt` on one global batch, jitted on its own."""
    layout = _layout(config)
    spec = objectives.spec_from_config(config.objective)
    raw = jnp.asarray(random_raw_tokens(config, layout.raw_length))
    corrupt = jax.jit(lambda raw, spec, key: objectives.corrupt(raw, spec, key, layout))
    key = jax.random.key(0)
    return lambda: corrupt(raw, spec, key)


def require_torch_comparable(config: ml_collections.ConfigDict) -> None:
    """A `ConfigError` unless the PyTorch T5 step can be the same step as `config`'s (see
    `torch_t5`: float32 on the CPU, so a bfloat16 step, or one on an accelerator, would be
    timed against other work)."""
    platform = jax.default_backend()
    if (config.model.arch != convert.HF_T5_ARCH or config.train.optimizer != "adamw"
            or config.model.dtype != "float32" or platform != "cpu"):
        raise ConfigError(
            f"--compare_torch needs model.arch={convert.HF_T5_ARCH!r}, "
            f"train.optimizer='adamw' and model.dtype='float32' on the CPU (the PyTorch T5 "
            f"step it times); this run has model.arch={config.model.arch!r}, "
            f"train.optimizer={config.train.optimizer!r}, model.dtype={config.model.dtype!r} "
            f"on {platform}")


def torch_t5(config: ml_collections.ConfigDict) -> tuple[Any, Any, Any, Any]:
    """The Hugging Face PyTorch T5 of the same size as `config.model` in train mode, its AdamW,
    and one batch of random input ids and labels: (model, optimizer, inputs, labels).

    Only encoder-decoder models with AdamW compare like for like (HF T5 has no decoder-only
    variant and PyTorch has no Adafactor with T5's settings in core). Uses every CPU core.
    """
    import torch
    import transformers

    model_cfg = Settings.from_config(config).model
    layout = objectives.layout_from_config(config)
    require_torch_comparable(config)
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    # The config `t5x-lite export` writes for this model (one mapping of our fields to HF's).
    depths = {stack.role: stack.num_layers(model_cfg)
              for stack in architectures.get(model_cfg.arch).stacks}
    hf_config = transformers.T5Config(**export.hf_t5_config(model_cfg, depths))
    model = transformers.T5ForConditionalGeneration(hf_config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.learning_rate, weight_decay=0.0)
    rng = np.random.default_rng(0)
    high = sentinel_id(model_cfg.vocab_size, model_cfg.num_sentinels - 1)
    batch = config.train.batch_size
    inputs = torch.from_numpy(rng.integers(NUM_RESERVED_IDS, high, (batch, layout.inputs_length)))
    labels = torch.from_numpy(rng.integers(NUM_RESERVED_IDS, high, (batch, layout.targets_length)))
    return model, optimizer, inputs, labels


def torch_t5_train_step(config: ml_collections.ConfigDict) -> Callable[[], None]:
    """One AdamW step of `torch_t5(config)`'s model on its batch."""
    model, optimizer, inputs, labels = torch_t5(config)

    def run() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=inputs, labels=labels).loss.backward()
        optimizer.step()

    return run


def pipeline_batches(config: ml_collections.ConfigDict) -> Callable[[], float]:
    """The real input pipeline, built now (vocabulary trained or cached, the corpus read, so a
    corpus it cannot read stops `bench` before anything compiles), and a function that times
    it: seconds per host batch over 200 batches."""
    from t5x_lite.data.pipeline import pretrain_data_from_config, seconds_per_batch

    _, data = pretrain_data_from_config(config, objectives.layout_from_config(config).raw_length)
    return lambda: seconds_per_batch(data, num_batches=200)


def _gib(size: int | None) -> float | None:
    return None if size is None else size / 2**30


def program_memory_gib(step: train_step.TrainStep) -> float | None:
    """`programs.program_memory_bytes` of the program the step's latest call ran, in GiB."""
    return _gib(programs.program_memory_bytes(step.program.last_executable))


def peak_device_memory_gib() -> float | None:
    """The first local device's peak bytes in use so far, in GiB; None where JAX keeps no
    memory statistics (CPU)."""
    stats = jax.local_devices()[0].memory_stats() or {}
    return _gib(stats.get("peak_bytes_in_use"))


def run_benchmarks(config: ml_collections.ConfigDict, *, steps: int = 10, warmup: int = 2,
                   compare_torch: bool = False, pipeline: bool = False) -> dict[str, Any]:
    """Everything `t5x-lite bench` reports, as one JSON-able dict.

    The train step, corruption alone, on a CPU the peak matmul, and (with `compare_torch`) the
    PyTorch step are timed in turns within one loop, each call waited on, so their ratios
    (speed-up, MFU) hold even when the machine's speed drifts. On an accelerator the train step
    is also timed back to back (`pipelined_seconds`, as training runs it): `pipelined_step_ms`,
    `pipelined_mfu`.
    """
    # A bad value, or a model no run could train, is a ConfigError before anything compiles.
    require_trainable(Settings.from_config(config).model)
    if compare_torch:
        require_torch_comparable(config)
    time_pipeline = pipeline_batches(config) if pipeline else None
    jax_run, info = jax_train_step(config)
    mesh = info["mesh"]
    on_cpu = mesh.devices.flat[0].platform == "cpu"
    runs = {"step": jax_run, "corruption": corruption_only(config)}
    if on_cpu:
        runs["peak_matmul"] = _PeakMatmul(jnp.dtype(config.model.dtype))  # no vendor table
    if compare_torch:
        started = time.perf_counter()
        runs["torch"] = torch_t5_train_step(config)
        report_phase("PyTorch's step built", time.perf_counter() - started)
    # Every call waited on, in turns: at a large preset, minutes with nothing else to show.
    print(f"bench: timing {', '.join(runs)} in turns, {warmup} + {steps} calls each",
          file=sys.stderr, flush=True)
    times = dict(zip(runs, seconds_in_turns(*runs.values(), steps=steps, warmup=warmup)))
    seconds = {name: statistics.median(t) for name, t in times.items()}
    step_s, corrupt_s = seconds["step"], seconds["corruption"]
    # Back to back only on an accelerator: on a CPU the host is the device (XLA:CPU also runs
    # slower with steps queued), so there is nothing to overlap.
    pipelined_s = None if on_cpu else pipelined_seconds(jax_run, steps)
    peak = runs["peak_matmul"].peak if "peak_matmul" in runs else None
    layout = objectives.layout_from_config(config)
    throughput = loop.Throughput.of(config, (layout.inputs_length, layout.targets_length), mesh,
                                    peak=peak)
    speed = throughput(step_s)
    result = {
        "tokens_per_second": speed["tokens_per_s"],
        "step_ms": step_s * 1e3,
        "step_ms_range": range_ms(times["step"]),  # of the `timed_calls` the median is of
        "timed_calls": steps,
        "tflops_per_second": speed["tflops_per_s"],
        "peak_tflops_per_second": None if throughput.peak is None else throughput.peak / 1e12,
        "mfu": speed["mfu"],
        # Steps queued back to back, as the training loop runs them (None on a CPU).
        "pipelined_step_ms": None if pipelined_s is None else pipelined_s * 1e3,
        "pipelined_mfu": None if pipelined_s is None else throughput(pipelined_s)["mfu"],
        "peak_source": ("fastest of the 1024x1024 matmuls timed in turns with the step"
                        if "peak_matmul" in runs else "vendor table"),
        "init_s": info["init_s"],  # building the initial state, compile included
        "init_compile_s": info["init_compile_s"],  # of which XLA's compiler
        "compile_s": info["compile_s"],
        "first_call_s": info["first_call_s"],
        "devices": info["devices"],
        "host_memory_retained": host_memory.retained,  # see `host_memory`
        "peak_memory_gib": peak_device_memory_gib(),  # after the timed steps
        # What XLA's buffer assignment gives the step on each device (any backend, a CPU too).
        "program_memory_gib": info["program_memory_gib"],
        "layout": info["layout"],
        "corruption_ms": corrupt_s * 1e3,
        "corruption_share_of_step": corrupt_s / step_s,
    }
    if compare_torch:
        import torch

        torch_s = seconds["torch"]
        result["torch"] = {"tokens_per_second": throughput.tokens_per_step / torch_s,
                           "step_ms": torch_s * 1e3, "step_ms_range": range_ms(times["torch"]),
                           "version": torch.__version__, "threads": torch.get_num_threads(),
                           "dtype": "float32", "device": "cpu"}
        result["speedup_vs_torch"] = torch_s / step_s
    if time_pipeline is not None:
        batch_s = time_pipeline()
        result["pipeline_batch_ms"] = batch_s * 1e3
        result["pipeline_speedup_vs_step"] = step_s / batch_s
    result["config"] = config.to_dict()
    return result


def greedy_by_recomputation(model: nnx.Module, inputs: jax.Array, new_tokens: int,
                            arch: str) -> jax.Array:
    """The baseline without a cache: each step runs the whole model (encoder included) on a
    fixed-length buffer of the sequence so far and takes the argmax (never the pad id, as
    `decoding.decode`) at the newest position. Runs all `new_tokens` steps, EOS or not.
    Returns int32 `[B, new_tokens]`; call it under jit."""
    batch_size = inputs.shape[0]
    if architectures.get(arch).family == "encoder_decoder":
        batch = {"encoder_input_tokens": inputs,
                 "decoder_input_tokens": jnp.zeros((batch_size, new_tokens), jnp.int32)}
        start = jnp.zeros(batch_size, jnp.int32)
    else:  # [0, inputs..., generated...] with the prompt as inputs_mask, as in training
        start = jnp.sum(inputs > 0, axis=1, dtype=jnp.int32)
        batch = batch_format.decoder_only_prompt(inputs, room=new_tokens + 1)
    rows = jnp.arange(batch_size)

    def step(t, state):
        batch, generated = state
        logits = model(batch, make_masks(batch, arch))[rows, start + t]
        token = 1 + jnp.argmax(logits[:, 1:], axis=-1).astype(jnp.int32)
        # Fed at the next position (dropped after the last step: the buffer ends there).
        fed = batch["decoder_input_tokens"].at[rows, start + t + 1].set(token, mode="drop")
        return {**batch, "decoder_input_tokens": fed}, generated.at[:, t].set(token)

    generated = jnp.zeros((batch_size, new_tokens), jnp.int32)
    return jax.lax.fori_loop(0, new_tokens, step, (batch, generated))[1]


def decode_benchmark(config: ml_collections.ConfigDict, new_tokens: int = 64, *,
                     steps: int = 3, warmup: int = 1) -> dict[str, Any]:
    """Seconds to greedily decode `new_tokens` tokens for `train.batch_size` rows of
    `objective.inputs_length` random input tokens on a randomly initialised
    `config.model`, with the key/value cache (`decoding.decode`) and by re-computation
    (`greedy_by_recomputation`), timed in turns.

    The cached loop stops once every row has emitted EOS; `cached_steps` says how many steps
    it ran (a random model rarely emits EOS), and `tokens_match` that both agree up to each
    row's EOS.
    """
    settings = Settings.from_config(config)  # a bad value is a ConfigError before any array
    arch = settings.model.arch
    if batch_format.in_place(architectures.get(arch).family):
        raise ConfigError(f"bench --decode times token-by-token decoding, which "
                          f"model.arch={arch!r} does not do (it fills its mask slots in one "
                          "forward pass); choose an encoder-decoder or decoder-only arch")
    model = build_model(settings.model, nnx.Rngs(settings.train.seed))
    # No EOS in the inputs: a random decoder-only model tends to repeat the last input token.
    inputs = jnp.asarray(random_raw_tokens(config, settings.objective.inputs_length, seed=1))

    def cached() -> jax.Array:
        return decoding.decode(model, inputs, max_length=new_tokens, arch=arch).tokens

    graphdef, state = nnx.split(model)
    baseline = jax.jit(lambda state, inputs: greedy_by_recomputation(
        nnx.merge(graphdef, state), inputs, new_tokens, arch))
    start = time.perf_counter()
    recomputed = np.asarray(baseline(state, inputs))
    recompute_compile_s = time.perf_counter() - start
    start = time.perf_counter()
    tokens = np.asarray(cached())
    cached_compile_s = time.perf_counter() - start

    cached_times, recompute_times = seconds_in_turns(
        cached, lambda: baseline(state, inputs), steps=steps, warmup=warmup)
    cached_s, recompute_s = map(statistics.median, (cached_times, recompute_times))
    ended = tokens == EOS_ID
    lengths = np.where(ended.any(axis=1), ended.argmax(axis=1) + 1, new_tokens)
    return {
        "arch": arch,
        "batch_size": int(inputs.shape[0]),
        "inputs_length": int(inputs.shape[1]),
        "new_tokens": new_tokens,
        "cached_s": cached_s,
        "recompute_s": recompute_s,
        "cached_ms_range": range_ms(cached_times),  # of the `timed_calls` the medians are of
        "recompute_ms_range": range_ms(recompute_times),
        "timed_calls": steps,
        "speedup": recompute_s / cached_s,
        "cached_steps": int(lengths.max()),
        "tokens_match": all(np.array_equal(tokens[r, :n], recomputed[r, :n])
                            for r, n in enumerate(lengths)),
        "cached_first_call_s": cached_compile_s,
        "recompute_first_call_s": recompute_compile_s,
        "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
    }
