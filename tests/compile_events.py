"""The tests' compile counting: `t5x_lite.compile_events.compilations` (JAX's public
backend-compile events), and a cold program cache for tests that claim "this compiles once"."""
import contextlib

from t5x_lite.compile_events import compilations

__all__ = ["cold_program_cache", "compilations"]


@contextlib.contextmanager
def cold_program_cache():
    """A block in which `t5x_lite.train_step`'s program cache (its `_PROGRAMS`, keyed by the
    step settings and mesh) starts empty, so every train, fine-tuning and eval step made inside
    compiles afresh, whatever ran before in the process: a test that claims "this compiles once"
    then proves it in any order. Afterwards the programs from before are back, and those made
    inside are added for keys that had none (later tests need not compile them again).
    There is no public way to empty the cache; tests/test_conftest.py checks this one works."""
    from t5x_lite import train_step

    before, fresh = train_step._PROGRAMS, {}
    train_step._PROGRAMS = fresh
    try:
        yield
    finally:
        train_step._PROGRAMS = before
        for key, program in fresh.items():
            before.setdefault(key, program)
