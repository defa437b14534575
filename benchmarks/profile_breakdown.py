"""Where a profiled GPU train step's kernel time goes, by what each kernel does.

    python benchmarks/profile_breakdown.py PROFILE.json.gz HLO.txt.gz [--steps 5] [--top 25]

Reads the two files `accelerator_check.py`'s `profile/paper` part brings back: the perfetto
trace of `--steps` train steps and the step's optimised HLO module. A trace names XLA's fused
kernels only by their fusion (`loop_compare_select_fusion_1`), which says little: dropout's
Threefry rounds, for one, are fused into kernels named after the ops around them. The HLO says
what each fusion computes, so every kernel gets a kind:

  attention        cuDNN's attention kernels (and their dQ / dbias helpers)
  matmul           cuBLAS / cuBLASLt kernels and XLA's GEMM fusions (on a CPU, its dots)
  copy             memcpy / memset: among them the scanned layers' residuals copied in and out
  dropout bits     fusions computing random bits (at least 8 shifts: Threefry's rotations)
  layer stacking   fusions writing a slice of a [layers, ...] buffer (dynamic-update-slice),
                   and the step's own fusions that fill such buffers (a broadcast constant)
  reduction        the other fusions with a reduce (norms, softmax, cross-entropy, bias grads)
  elementwise      the other fusions
  other            kernels neither the names above nor the HLO account for

Prints the milliseconds per step of each kind and the top kernels with their kind and shape.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

# Kernels whose name says what they compute, first match wins: cuDNN's attention, cuBLAS /
# cuBLASLt and XLA's GEMM fusions, memcpy / memset; on a CPU, XLA's dots and YNNPACK's fusions.
KIND_BY_NAME = (("attention", r"cudnn|fmha|flash|sdpa|attention"),
                ("matmul", r"nvjet|gemm|cublas|cutlass|xmma|matmul|\bdot|ynn_fusion"),
                ("copy", r"^(memcpy|memset)"))


def kind_by_name(name: str) -> str | None:
    """The kind a kernel's name alone says (`KIND_BY_NAME`); None for XLA's other fusions,
    whose names say little (the HLO does, `kernel_kinds`)."""
    return next((kind for kind, pattern in KIND_BY_NAME if re.search(pattern, name.lower())),
                None)
# An instruction line of an HLO module: name, shape (a tuple shape is parenthesised), opcode.
INSTRUCTION = re.compile(r"\s*(?:ROOT )?%(\S+) = (\(.*?\)|\S+) ([\w\-]+)\(")
COMPUTATION = re.compile(r"^(ENTRY )?%(\S+) \(")
INIT_OPS = {"broadcast", "constant", "parameter", "tuple", "bitcast", "copy"}


def parse_hlo(text: str) -> tuple[dict[str, list[str]], dict[str, tuple[str, str, str | None,
                                                                          str]], str | None]:
    """(computation -> its instruction lines, instruction -> (shape, opcode, the computation it
    calls or None, the computation it is in), the entry computation's name)."""
    computations: dict[str, list[str]] = {}
    entry, current = None, None
    for line in text.splitlines():
        match = COMPUTATION.match(line)
        if match and line.rstrip().endswith("{"):
            current = match.group(2)
            computations[current] = []
            entry = current if match.group(1) else entry
        elif line.startswith("}"):
            current = None
        elif current is not None:
            computations[current].append(line)
    instructions = {}
    for computation, lines in computations.items():
        for line in lines:
            match = INSTRUCTION.match(line)
            if match:
                called = re.search(r"calls=%([\w.\-]+)", line)
                instructions[match.group(1)] = (match.group(2), match.group(3),
                                                called.group(1) if called else None, computation)
    return computations, instructions, entry


def opcodes(computations: dict[str, list[str]], name: str) -> Counter:
    """The opcodes of computation `name` and of the computations it calls, counted."""
    counts: Counter = Counter()
    for line in computations.get(name, []):
        match = INSTRUCTION.match(line)
        if match:
            counts[match.group(3)] += 1
        for called in re.findall(r"calls=%([\w.\-]+)", line):
            counts += opcodes(computations, called)
    return counts


def computes_random_bits(ops: Counter) -> bool:
    """Whether a kernel with these opcodes computes random bits: at least 8 shifts (Threefry's
    rotations, a left and a right shift each; Philox's 64-bit products split in halves)."""
    return ops["shift-left"] + ops["shift-right-logical"] >= 8


# Threefry-2x32-20's rounds: one rotation, so one left shift, each.
THREEFRY_ROUNDS = 20
WHILE_BODY = re.compile(r" while\(.*body=%([\w.\-]+)")
TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def computation_runs(computations: dict[str, list[str]], entry: str | None) -> dict[str, int]:
    """How many times each computation reachable from the entry by loops and calls runs in one
    run of the module: a while loop's body its known trip count (1 where XLA knows none) times
    its caller's runs, a `call`'s callee as often as its caller."""
    runs = {entry: 1} if entry else {}
    queue = list(runs)
    for computation in queue:
        for line in computations.get(computation, []):
            loop = WHILE_BODY.search(line)
            call = re.search(r" call\(.*to_apply=%([\w.\-]+)", line)
            if loop:
                trips = TRIP_COUNT.search(line)
                callee, times = loop.group(1), int(trips.group(1)) if trips else 1
            elif call:
                callee, times = call.group(1), 1
            else:
                continue
            runs[callee] = runs.get(callee, 0) + runs[computation] * times
            queue.append(callee)
    return runs


def random_bit_draws(hlo_text: str) -> int:
    """How many Threefry calls one run of the module makes: for each fusion that computes
    random bits (`computes_random_bits`), its largest output array's size times the calls it
    holds (its left shifts / `THREEFRY_ROUNDS`, at least 1) times the runs of the computation
    it is in (`computation_runs`; 1 for one no loop or call reaches). A kernel draws for each
    element it writes, so, against the elements that need bits, this says how often a draw is
    made: XLA fusing a draw into a consumer that reads each of its values several times (a
    broadcast) makes it once per consumer element."""
    computations, instructions, entry = parse_hlo(hlo_text)
    runs = computation_runs(computations, entry)
    total = 0
    for shape, opcode, called, computation in instructions.values():
        if opcode != "fusion" or not called:
            continue
        ops = opcodes(computations, called)
        if computes_random_bits(ops):
            size = max(math.prod(int(d) for d in dims.split(",") if d)
                       for dims in re.findall(r"\[([\d,]*)\]", shape))
            calls = max(1, round(ops["shift-left"] / THREEFRY_ROUNDS))
            total += size * calls * runs.get(computation, 1)
    return total


def kernel_kinds(names: list[str], hlo_text: str) -> dict[str, tuple[str, str]]:
    """Kernel name (as the trace has it) -> (its kind, as the module docstring lists them; the
    shape of the fusion it runs, '' where the HLO has none)."""
    computations, instructions, entry = parse_hlo(hlo_text)
    # The trace writes a fusion `loop_add_fusion.3` as `loop_add_fusion_3`.
    by_trace_name = {name.replace(".", "_"): name for name in instructions}
    kinds = {}
    for name in names:
        kind = kind_by_name(name)
        instruction = instructions.get(name) or instructions.get(by_trace_name.get(name, ""))
        shape = instruction[0] if instruction else ""
        if kind is None and instruction is not None:
            _, opcode, called, computation = instruction
            ops = opcodes(computations, called) if called else Counter({opcode: 1})
            if computes_random_bits(ops):
                kind = "dropout bits"
            elif ops["dynamic-update-slice"] or (computation == entry and set(ops) <= INIT_OPS):
                kind = "layer stacking"
            elif ops["reduce"]:
                kind = "reduction"
            else:
                kind = "elementwise"
        kinds[name] = (kind or "other", shape)
    return kinds


def kernel_totals(trace: dict[str, Any]) -> tuple[str, dict[str, tuple[float, int]]]:
    """(where the kernels were read, kernel name -> (total microseconds, launches)) of a
    perfetto trace (`jax.profiler.trace(..., create_perfetto_trace=True)`). Kernels are the
    events on the device's streams (the `Stream ...` threads of `/device:...` processes; its
    other tracks, such as the XLA ops that launched them, would count each kernel twice). A
    trace without a device (a CPU) counts the events on XLA's own threads (`tf_XLA...`)
    instead, less its runtime's (`Class::method`); there nested ops (a while loop and its body)
    count twice. Kernels on several streams can overlap, so their time can exceed the wall
    time."""
    events = trace["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e.get("ph") == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    devices = {pid for pid, name in processes.items() if name.startswith("/device:")}
    streams = {key for key, name in threads.items() if key[0] in devices
               and name.startswith("Stream")}

    def is_kernel(event: dict[str, Any]) -> bool:
        key = (event["pid"], event.get("tid"))
        if streams:
            return key in streams
        if devices:  # a profiler that names its tracks otherwise: every device track
            return event["pid"] in devices
        return threads.get(key, "").startswith("tf_XLA") and "::" not in event["name"]

    totals: dict[str, list[float]] = {}
    for event in events:
        if event.get("ph") == "X" and is_kernel(event):
            entry = totals.setdefault(event["name"], [0.0, 0])
            entry[0] += event.get("dur", 0.0)
            entry[1] += 1
    source = ("device streams" if streams else "device tracks" if devices
              else "XLA host threads")
    return source, {name: (us, int(count)) for name, (us, count) in totals.items()}


def breakdown(trace: dict[str, Any], hlo_text: str, steps: int, top: int = 25) -> dict[str, Any]:
    """Milliseconds per step by kind (largest first), and the `top` kernels."""
    _, kernels = kernel_totals(trace)
    kinds = kernel_kinds(list(kernels), hlo_text)
    by_kind: Counter = Counter()
    for name, (us, _) in kernels.items():
        by_kind[kinds[name][0]] += us / 1e3 / steps
    ranked = sorted(kernels.items(), key=lambda item: -item[1][0])[:top]
    return {
        "kernel_ms_per_step": sum(by_kind.values()),
        "ms_per_step_by_kind": dict(by_kind.most_common()),
        "top_kernels": [{"name": name[:100], "kind": kinds[name][0], "shape": kinds[name][1][:100],
                         "ms_per_step": us / 1e3 / steps, "launches_per_step": count / steps}
                        for name, (us, count) in ranked],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path, help="the perfetto trace (.json.gz)")
    parser.add_argument("hlo", type=Path, help="the step's optimised HLO module (.txt.gz)")
    parser.add_argument("--steps", type=int, default=5, help="steps the trace holds (default 5)")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    with gzip.open(args.profile, "rt") as f:
        trace = json.load(f)
    with gzip.open(args.hlo, "rt") as f:
        hlo_text = f.read()
    result = breakdown(trace, hlo_text, args.steps, args.top)
    for kind, ms in result["ms_per_step_by_kind"].items():
        print(f"{ms:8.2f} ms  {kind}")
    print(f"{result['kernel_ms_per_step']:8.2f} ms  kernel time per step")
    print(f"{random_bit_draws(hlo_text):.3g} Threefry calls per step\n")
    for kernel in result["top_kernels"]:
        print(f"{kernel['ms_per_step']:7.2f} ms {kernel['launches_per_step']:6.0f}x "
              f"{kernel['kind']:15s} {kernel['name'][:60]:60s} {kernel['shape'][:50]}")


if __name__ == "__main__":
    main()
