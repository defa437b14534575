"""Two processes on localhost (2 CPU devices each, gloo collectives) train 3 steps, each feeding
only its half of the global batch; their losses equal a single-process run on the whole batch.

Run as a script, this file is one of the two worker processes.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
from tiny_configs import tiny_train_config as tiny_config

STEPS = 3
PROCESSES = 2
DEVICES_PER_PROCESS = 2


def losses(mesh, process_rows: slice) -> list[float]:
    """Train STEPS updates on the fixed global batch, passing only `process_rows` of it."""
    import jax

    from t5x_lite import objectives, train_step

    config = tiny_config()
    layout = objectives.layout_for([config.objective], "encoder_decoder", 160, 32)
    global_batch = np.random.default_rng(0).integers(3, 128, (8, layout.raw_length), dtype=np.int32)
    spec = objectives.spec_from_config(config.objective)
    state = train_step.init_state(config, mesh)
    step = train_step.make_train_step(config, layout, mesh)
    history = []
    for _ in range(STEPS):
        state, metrics = step(state, global_batch[process_rows], spec, jax.random.key(0))
        history.append(float(metrics["loss"]))
    return history


def worker(port: int, process_id: int, out: str) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from t5x_lite import partitioning, train

    assert train.initialize_distributed(f"localhost:{port}", PROCESSES, process_id)
    assert jax.device_count() == PROCESSES * DEVICES_PER_PROCESS
    mesh = partitioning.make_mesh(tiny_config().mesh)  # (-1, 1): data over all 4 devices
    rows = 8 // PROCESSES
    result = losses(mesh, slice(process_id * rows, (process_id + 1) * rows))
    Path(out, f"losses_{process_id}.json").write_text(json.dumps(result))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def test_two_processes_match_a_single_process_run(tmp_path):
    import jax

    from t5x_lite import partitioning

    # The workers skip XLA's slow CPU optimisations: compiling, not running, dominates here.
    flags = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES_PER_PROCESS} {flags}",
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
    )
    port = _free_port()
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, str(port), str(i), str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    try:
        outputs = [w.communicate(timeout=600)[0] for w in workers]
    finally:
        for w in workers:
            w.kill()
    for w, output in zip(workers, outputs):
        assert w.returncode == 0, output[-3000:]

    mesh = partitioning.make_mesh(tiny_config().mesh, jax.devices()[:1])
    reference = losses(mesh, slice(None))
    per_process = [
        json.loads((tmp_path / f"losses_{i}.json").read_text()) for i in range(PROCESSES)
    ]
    assert per_process[0] == per_process[1]  # every process sees the same global loss
    np.testing.assert_allclose(per_process[0], reference, rtol=1e-5)


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
