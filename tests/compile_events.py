"""Counting XLA compilations through JAX's public monitoring events instead of a jitted
function's private `_cache_size()`: each program that jit lowers and compiles (an in-memory
cache miss; a persistent-cache load counts too) records one backend-compile event, named after
the function. tests/test_conftest.py checks that the event still fires, so a JAX upgrade that
renamed it fails there instead of making every "no new compilation" assertion pass vacuously."""
import contextlib

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def compilations():
    """Yields a list that collects the name of every function compiled inside the block."""
    names: list[str] = []

    def listener(event, duration_secs, **kwargs):
        del duration_secs
        if event == BACKEND_COMPILE_EVENT:
            names.append(str(kwargs.get("fun_name", "?")))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


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
