"""One `t5x-lite` command run from two git revisions of this repository in turns: is a change
faster, and by how much?

    python benchmarks/ab_revisions.py BASE [NEW] -- train --preset demo --config.train.steps=300

Each revision is checked out into its own temporary worktree (`git worktree add --detach`;
NEW defaults to the working tree as it is, uncommitted changes included) and imported from
there (`PYTHONPATH`), so both run in this environment's Python and packages. The command runs
`--rounds` times from each, in turns, the first side alternating between rounds (a drift of the
machine's speed, or an effect of one run on the next, hits both alike), in a
new `--workdir` each time (appended to the command; leave it out), with JAX's compilation cache
off so that neither side loads what the other compiled. Prints one JSON object: per revision
the wall seconds of each run and their median and, when the command writes metrics.jsonl, the
median `step_s` of its steps that did not compile; and NEW's medians divided by BASE's
(below 1: NEW is faster).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def checkout(revision: str | None, root: Path) -> Iterator[Path]:
    """A folder holding `revision`'s tree (a temporary git worktree), or the repository itself
    for None."""
    if revision is None:
        yield REPO
        return
    folder = root / revision.replace("/", "_")
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet",
                    str(folder), revision], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(folder)],
                       check=True)


def median_step_seconds(workdir: Path) -> float | None:
    """The median `step_s` of the steps in `workdir/metrics.jsonl` that did not compile."""
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return None
    records = [json.loads(line) for line in path.read_text().splitlines()]
    steady = [r["step_s"] for r in records if r.get("compile_s") == 0.0 and r.get("step_s")]
    return statistics.median(steady) if steady else None


def run_once(tree: Path, command: list[str], workdir: Path) -> dict[str, float | None]:
    """Wall seconds of `t5x-lite COMMAND --workdir WORKDIR` imported from `tree`, and its
    median step time."""
    environment = {**os.environ, "PYTHONPATH": str(tree), "JAX_ENABLE_COMPILATION_CACHE": "false"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "t5x_lite.cli", *command, "--workdir", str(workdir)],
                   env=environment, check=True, stdout=subprocess.DEVNULL, cwd=workdir.parent)
    return {"wall_s": time.perf_counter() - start, "step_s": median_step_seconds(workdir)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the revision to compare against (e.g. a commit or HEAD~1)")
    parser.add_argument("new", nargs="?", help="the revision to compare (default: the working "
                        "tree, uncommitted changes included)")
    parser.add_argument("--rounds", type=int, default=3, help="runs from each revision")
    parser.usage = "%(prog)s BASE [NEW] [--rounds N] -- T5X_LITE_COMMAND [FLAGS]"
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    if not command or "--workdir" in command:
        parser.error("give the t5x-lite command after --, without --workdir")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds} must be at least 1")
    runs: dict[str, list[dict]] = {"base": [], "new": []}
    with tempfile.TemporaryDirectory() as root, \
            checkout(args.base, Path(root)) as base, checkout(args.new, Path(root)) as new:
        for round_index in range(args.rounds):
            # The side that runs first alternates: a run can leave the machine slower or faster
            # for the next one (page cache, memory reclaim), which would favour one side.
            sides = [("base", base), ("new", new)][::1 if round_index % 2 == 0 else -1]
            for side, tree in sides:
                workdir = Path(root) / f"{side}_{round_index}"
                workdir.mkdir()
                runs[side].append(run_once(tree, command, workdir))
                print(f"round {round_index + 1}/{args.rounds} {side}: {runs[side][-1]}",
                      file=sys.stderr, flush=True)

    def medians(side: str) -> dict[str, float | None]:
        return {name: statistics.median(values) if None not in values else None
                for name in ("wall_s", "step_s")
                for values in [[run[name] for run in runs[side]]]}

    summary = {"command": command, "base": args.base, "new": args.new or "working tree",
               "runs": runs, "median": {side: medians(side) for side in runs}}
    summary["new_over_base"] = {
        name: new / base if new is not None and base else None
        for name, base, new in ((name, summary["median"]["base"][name],
                                 summary["median"]["new"][name]) for name in ("wall_s", "step_s"))}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
