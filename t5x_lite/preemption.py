"""What a preempted run raises, and the exit status a scheduler sees from it.

A run that gets SIGTERM / SIGINT (or, on several processes, JAX's preemption notice) saves
every point's checkpoint at the step it reached and raises `Preempted` (`loop.run_loop`).
`Preempted` is a `SystemExit` with status `PREEMPTED_EXIT_STATUS`: uncaught, it ends the
process with that status, in the CLI and in a user's script alike, so a scheduler can tell a
run to resume from a finished one (0) and a failed one (1, or 128 + the signal of a run killed
unsaved). Running the same command again resumes from the saved step. Being a `SystemExit`, it
also passes through the `except Exception` that records a failed run (a sweep's failed
point): a preempted run has not failed, and records nothing. This module imports nothing
heavy, so the CLI's help can name the status.
"""
from __future__ import annotations

from typing import Sequence

# EX_TEMPFAIL of sysexits.h: "a temporary failure, the user is invited to retry".
PREEMPTED_EXIT_STATUS = 75


class Preempted(SystemExit):
    """A run stopped at `step` by `cause` ("SIGTERM", "SIGINT" or "a preemption notice"),
    its checkpoints in `workdirs` saved; exits with `PREEMPTED_EXIT_STATUS`. step None: a
    sweep in `workdirs` stopped between runs, before it started the next."""

    def __init__(self, step: int | None, workdirs: Sequence[str], cause: str):
        super().__init__(PREEMPTED_EXIT_STATUS)
        self.step, self.workdirs, self.cause = step, [str(w) for w in workdirs], cause

    def __reduce__(self) -> tuple:
        # SystemExit's would rebuild it from the status alone; a worker process (a parallel
        # sweep's) sends it back to the sweep pickled.
        return type(self), (self.step, self.workdirs, self.cause)

    def __str__(self) -> str:
        if self.step is None:
            return (f"{self.cause}: stopping with exit status {PREEMPTED_EXIT_STATUS} before "
                    f"the next run of {', '.join(self.workdirs)}, the finished ones recorded; "
                    "run the same command again to resume")
        return (f"{self.cause} at step {self.step}: stopping with exit status "
                f"{PREEMPTED_EXIT_STATUS} once the checkpoints of {', '.join(self.workdirs)} "
                "are saved; run the same command again to resume")
