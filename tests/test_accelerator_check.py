"""benchmarks/accelerator_check.py's own logic (issue #19's one-run device check): every part
it plans runs, in priority order, within the budget; a part out of time is skipped and the
summary is on disk after every part; the targets read the parts' results. The parts here are
stand-ins (the script's real parts were run at toy size on CPU, see its --toy), except the
dropout probe, whose Threefry count is checked on programs XLA compiled."""
import json
import sys

import pytest


@pytest.fixture(scope="module")
def check(benchmark_script):
    return benchmark_script("accelerator_check")


@pytest.mark.parametrize("toy", [False, True])
def test_every_planned_part_has_a_priority_and_a_cap(check, toy):
    names = [name for name, _ in check.plan(toy)]
    assert len(names) == len(set(names))
    assert set(names) <= set(check.PRIORITY), set(names) - set(check.PRIORITY)
    assert {name.split("/")[0] for name in names} <= set(check.CAPS)
    # Every item of the issue is planned: bench at both presets, attention, vmap, tests, demo,
    # and the profile of the paper step that says what is left to the MFU target.
    assert {name.split("/")[0] for name in names} == {"paper", "small", "attention", "vmap",
                                                      "tests", "demo", "profile", "dropout"}
    assert check.select(names, None) == [n for n in check.PRIORITY if n in names]


def test_select_takes_names_and_prefixes_in_the_order_given(check):
    names = [name for name, _ in check.plan(False)]
    assert check.select(names, "paper") == [n for n in check.PRIORITY
                                            if n.startswith("paper/") and n in names]
    assert check.select(names, "demo,paper/plain") == ["demo", "paper/plain"]
    # A name that a prefix before it already chose runs once, where the prefix put it.
    assert check.select(names, "attention,attention/kernels,tests") == [
        n for n in check.PRIORITY if n.startswith("attention/") and n in names] + ["tests"]
    assert check.select(names, "vmap/small") == [
        "vmap/small/4", "vmap/small/1", "vmap/small/2", "vmap/small/8"]
    assert check.select(names, "pap") == []


def test_parts_run_in_turn_until_the_budget_is_spent(check, tmp_path, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(check.time, "monotonic", lambda: clock[0])
    written, limits = [], {}

    def part(name, seconds, status="ok", result=None):
        def run(limit):
            limits[name] = limit
            clock[0] += seconds
            written.append(json.loads((tmp_path / "s.json").read_text())["parts"]
                           if (tmp_path / "s.json").exists() else {})
            return {"status": status, "wall_s": seconds, **({"result": result} if result else {})}
        return run

    parts = {"paper/plain": part("paper/plain", 50, result={"mfu": 0.43}),
             "vmap/small/4": part("vmap/small/4", 30, status="failed"),
             "tests": part("tests", 5), "demo": part("demo", 1)}
    caps = {"paper": 60, "vmap": 100, "tests": 100, "demo": 100}
    # The budget counts from `started`, 2 s before the parts (the environment's probe).
    clock[0] = 2.0
    summary = check.run_parts(parts, list(parts), 90, caps, tmp_path / "s.json", {"toy": False},
                              started=0.0)
    # Each part is limited by its cap or by what is left: 60 (cap), 38, then 8 s (< 10: skipped).
    assert limits == {"paper/plain": 60, "vmap/small/4": 38}
    assert summary["wall_s"] == 82.0
    assert [summary["parts"][n]["status"] for n in parts] == ["ok", "failed", "skipped", "skipped"]
    # The summary on disk held every finished part before the next one ran.
    assert written == [{}, {"paper/plain": summary["parts"]["paper/plain"]}]
    assert json.loads((tmp_path / "s.json").read_text()) == summary
    assert summary["targets"]["paper_bf16_mfu"] == {
        "target": 0.40, "best": 0.43, "by_variant": {"paper/plain": 0.43},
        "pipelined_by_variant": {}, "best_recipe_changed": None, "met": True}
    assert summary["targets"]["vmap_small_K4_speedup"]["met"] is None  # the part failed


def test_targets_compare_the_best_variant_and_the_K4_speedup(check):
    ok = lambda result: {"status": "ok", "result": result}  # noqa: E731
    parts = {"paper/plain": ok({"mfu": 0.31}), "paper/scan_layers": ok({"mfu": 0.36}),
             "paper/remat": {"status": "timed_out"}, "small/plain": ok({"mfu": 0.9}),
             "vmap/small/1": ok({"speedup": 1.0}), "vmap/small/4": ok({"speedup": 1.7})}
    found = check.targets(parts)
    assert found["paper_bf16_mfu"]["best"] == 0.36 and found["paper_bf16_mfu"]["met"] is False
    assert found["vmap_small_K4_speedup"] == {"target": 2.0, "measured": 1.7, "met": False}
    # Steps timed back to back, as training runs them, count too, and are listed apart.
    parts["paper/plain"] = ok({"mfu": 0.38, "pipelined_mfu": 0.41})
    found = check.targets(parts)["paper_bf16_mfu"]
    assert (found["best"], found["met"]) == (0.41, True)
    assert found["by_variant"] == {"paper/plain": 0.38, "paper/scan_layers": 0.36}
    assert found["pipelined_by_variant"] == {"paper/plain": 0.41}
    # A step that changes the paper's recipe (a fused kernel drops no attention weights; no
    # dropout at all) is listed, but does not meet the target for it.
    parts["paper/plain"] = ok({"mfu": 0.30})
    parts["paper/scan_layers+cudnn+no_dropout"] = ok({"mfu": 0.41})
    found = check.targets(parts)["paper_bf16_mfu"]
    assert (found["best"], found["best_recipe_changed"], found["met"]) == (0.36, 0.41, False)
    assert found["by_variant"]["paper/scan_layers+cudnn+no_dropout"] == 0.41


def test_a_command_past_its_limit_is_killed_with_its_children(check):
    ran = check.run_command([sys.executable, "-c", (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60)']); print('started', flush=True); time.sleep(60)")], 2)
    assert ran["status"] == "timed_out" and ran["wall_s"] < 20
    assert "started" in ran["stdout"]


def test_the_exit_status_fails_only_for_a_failed_or_overrun_part(check):
    """accelerator_run.sh's smoke run reads it: a skipped part is not a failure."""
    assert check.exit_status({"a": {"status": "ok"}, "b": {"status": "skipped"}}) == 0
    assert check.exit_status({"a": {"status": "ok"}, "b": {"status": "failed"}}) == 1
    assert check.exit_status({"a": {"status": "timed_out"}}) == 1


def test_a_trace_is_summarised_by_the_device_s_kernels(check):
    """Perfetto's JSON as jax.profiler writes it: metadata events name the processes and
    threads; only the device's kernels count, by name and by kind, per step."""
    def meta(kind, pid, name, tid=None):
        return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}

    def kernel(name, dur, pid=2, tid=1):
        return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": 0, "dur": dur}

    trace = {"traceEvents": [
        meta("process_name", 1, "/host:CPU"), meta("process_name", 2, "/device:GPU:0"),
        meta("thread_name", 1, "python", tid=7), meta("thread_name", 2, "Stream #13", tid=1),
        meta("thread_name", 2, "XLA Ops", tid=2),
        kernel("PjitFunction(step)", 10_000, pid=1, tid=7),  # the host's, not a kernel
        kernel("fusion.3", 10_000, tid=2),  # the op that launched kernels, not one itself
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 3_000), kernel("nvjet_tst_128x64", 1_000),
        kernel("cudnn_generated_fort_native_sdpa_sm90", 2_000),
        kernel("loop_multiply_fusion", 1_500), kernel("loop_multiply_fusion", 500),
        kernel("input_reduce_fusion", 1_000), kernel("threefry2x32_fusion", 1_000)]}
    summary = check.summarise_trace(trace, steps=2, top=3)
    assert summary["source"] == "device streams"
    assert summary["kernel_ms_per_step"] == pytest.approx(5.0)  # 10 ms of kernels in 2 steps
    assert summary["share_by_kind"] == pytest.approx(
        {"matmul": 0.4, "attention": 0.2, "other": 0.2, "reduction": 0.1, "random bits": 0.1})
    assert list(summary["share_by_kind"])[0] == "matmul"
    assert [(k["name"], k["kind"], k["ms_per_step"]) for k in summary["top_kernels"]] == [
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "matmul", 1.5),
        ("cudnn_generated_fort_native_sdpa_sm90", "attention", 1.0),
        ("loop_multiply_fusion", "other", 1.0)]


def test_a_cpu_trace_counts_xla_s_threads(check):
    trace = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 3, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 4,
         "args": {"name": "tf_XLAEigen/91"}},
        {"ph": "X", "name": "PjitFunction(step)", "pid": 1, "tid": 3, "dur": 900},
        {"ph": "X", "name": "ThunkExecutor::Execute", "pid": 1, "tid": 4, "dur": 800},
        {"ph": "X", "name": "ynn_fusion", "pid": 1, "tid": 4, "dur": 300}]}
    summary = check.summarise_trace(trace, steps=1)
    assert summary["source"] == "XLA host threads"
    assert summary["share_by_kind"] == {"matmul": 1.0}
    assert summary["kernel_ms_per_step"] == pytest.approx(0.3)


def test_the_dropout_probe_counts_threefry_calls_in_xla_s_program(check):
    import jax

    from t5x_lite.layers import random_bits

    # Bits alone: one Threefry call per element (the key's own derivation adds a handful).
    shape = (64, 256)
    compiled = jax.jit(random_bits, static_argnums=1).lower(jax.random.key(0), shape).compile()
    assert 64 * 256 <= check.random_bit_draws(compiled.as_text()) < 64 * 256 + 64
    result = check.child_dropout([4, 32, 256], steps=2)
    assert set(result["forms"]) == {"layers.dropout", "grouped_16bit", "rbg"}
    for form in result["forms"].values():
        assert abs(form["dropped_share"] - 0.1) < 0.02  # 32,768 draws: sd 0.0017
        assert form["forward_backward_ms"] > 0
    # Forward and backward each need the mask: drawn once and kept, or drawn again; the grouped
    # form makes a quarter of the calls unless XLA evaluates them once per element.
    assert 1.0 <= result["forms"]["layers.dropout"]["random_bit_draws_per_element"] <= 2.01
    assert 0.25 <= result["forms"]["grouped_16bit"]["random_bit_draws_per_element"] <= 2.01


def test_a_child_that_prints_nothing_fails_its_part_and_the_check_goes_on(check, monkeypatch):
    """A child that exits 0 with no output raised IndexError in the parent, ending the run."""
    monkeypatch.setattr(check, "run_command", lambda *args: {
        "status": "ok", "returncode": 0, "wall_s": 1.0, "stdout": "", "stderr": "warning"})
    entry = check.run_child("bench", {}, 60)
    assert entry == {"status": "failed", "wall_s": 1.0, "output_tail": "warning"}


def test_the_plan_says_where_the_caps_pass_the_budget(check):
    """The default plan's caps sum to far more than one call's budget: --plan says which parts
    a call may reach before running any."""
    text = check.schedule(["paper/plain", "vmap/small/4", "tests"], check.CAPS, 330)
    assert text.splitlines() == [
        "paper/plain                              cap   180 s  by    180 s",
        "vmap/small/4                             cap   120 s  by    300 s",
        "tests                                    cap   150 s  by    450 s  (past the budget)",
        "3 parts, caps 450 s, budget 330 s"]
