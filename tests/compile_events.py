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
