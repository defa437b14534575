"""Counting XLA compilations through JAX's public monitoring events, not a jitted function's
private `_cache_size()`: each program that jit lowers and compiles (an in-memory cache miss; a
persistent-cache load counts too) records one backend-compile event, named `jit(<function
name>)`. The train loop counts its step's compilations with it (`loop.run_loop`'s
`step_compiles`, summed into a sweep record's `train_step_compiles`); tests/test_conftest.py
checks that the event still fires under that name, so a JAX upgrade that renamed it fails there
instead of making every count read 0."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def _on_compile(record: Callable[[str, float], None]) -> Iterator[None]:
    """Calls `record(event name, backend compile seconds)` for every program compiled inside the
    block, in any thread."""
    def listener(event: str, duration_secs: float, **kwargs) -> None:
        if event == BACKEND_COMPILE_EVENT:
            record(str(kwargs.get("fun_name", "?")), duration_secs)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


@contextlib.contextmanager
def compilations() -> Iterator[list[str]]:
    """Yields a list that collects the event name (`jit(<function name>)`) of every function
    compiled inside the block, in any thread."""
    names: list[str] = []
    with _on_compile(lambda name, _: names.append(name)):
        yield names


@contextlib.contextmanager
def compile_seconds() -> Iterator[list[float]]:
    """Yields a list that collects the backend compile time, in seconds, of every program
    compiled inside the block (what of a first call is XLA's compiler, not tracing or running)."""
    seconds: list[float] = []
    with _on_compile(lambda _, duration: seconds.append(duration)):
        yield seconds


def count(names: Iterable[str], function_name: str) -> int:
    """How many of the compiled `names` (from `compilations`) are of the jitted function called
    `function_name` (its `__name__`)."""
    return sum(name == f"jit({function_name})" for name in names)
