"""benchmarks/profile_breakdown.py: a GPU trace's kernels get their kind from their names or,
for XLA's fusions, from what the step's HLO says they compute; only device-stream kernels
count. A hand-written module and trace stand in for the device's (no JAX)."""
import pytest

SHIFTS = "\n".join(f"  %s{i} = u32[4]{{0}} shift-left(%p0, %p0)" for i in range(8))
HLO = f"""HloModule jit_step, is_scheduled=true

%fused_threefry (p0: u32[4]) -> (bf16[4], pred[4]) {{
  %p0 = u32[4]{{0}} parameter(0)
{SHIFTS}
  ROOT %t = (bf16[4]{{0}}, pred[4]{{0}}) tuple(%s0, %s1)
}}

%fused_stack (p0: f32[12,4], p1: s32[]) -> f32[12,4] {{
  %p0 = f32[12,4]{{1,0}} parameter(0)
  %p1 = s32[] parameter(1)
  ROOT %d = f32[12,4]{{1,0}} dynamic-update-slice(%p0, %p0, %p1, %p1)
}}

%add_computation (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}}

%fused_norm (p0: f32[4,4]) -> f32[4] {{
  %p0 = f32[4,4]{{1,0}} parameter(0)
  %zero = f32[] constant(0)
  ROOT %r = f32[4]{{0}} reduce(%p0, %zero), dimensions={{1}}, to_apply=%add_computation
}}

%fused_fill () -> f32[12,4] {{
  %zero = f32[] constant(0)
  ROOT %b = f32[12,4]{{1,0}} broadcast(%zero), dimensions={{}}
}}

%body (p: f32[4]) -> f32[4] {{
  %p = f32[4]{{0}} parameter(0)
  %loop_compare_select_fusion.1 = (bf16[4]{{0}}, pred[4]{{0}}) fusion(%p), kind=kLoop, calls=%fused_threefry
  %loop_dynamic_update_slice_fusion = f32[12,4]{{1,0}} fusion(%p), kind=kLoop, calls=%fused_stack
  %input_reduce_fusion = f32[4]{{0}} fusion(%p), kind=kInput, calls=%fused_norm
  %loop_broadcast_fusion.7 = f32[12,4]{{1,0}} fusion(), kind=kLoop, calls=%fused_fill
  ROOT %loop_add_fusion = f32[4]{{0}} add(%p, %p)
}}

ENTRY %main.9 (p: f32[4]) -> f32[12,4] {{
  %p = f32[4]{{0}} parameter(0)
  ROOT %loop_broadcast_fusion.2 = f32[12,4]{{1,0}} fusion(), kind=kLoop, calls=%fused_fill
}}
"""

# name -> (microseconds per launch, kind it must get)
KERNELS = {
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop": (300.0, "attention"),
    "void cudnn::fusion::fmha_dbias<true>(void const*)": (40.0, "attention"),
    "nvjet_sm90_tst_128x160_64x5_2x1_v_bz_NNT": (200.0, "matmul"),
    "gemm_fusion_dot_general_130": (20.0, "matmul"),
    "dot.3": (3.0, "matmul"),  # a CPU trace's XLA op
    "memcpy128": (50.0, "copy"),
    "loop_compare_select_fusion_1": (30.0, "dropout bits"),
    "loop_dynamic_update_slice_fusion": (10.0, "layer stacking"),
    "loop_broadcast_fusion_2": (8.0, "layer stacking"),   # the step's own buffer fill
    "loop_broadcast_fusion_7": (4.0, "elementwise"),      # a broadcast inside a loop
    "input_reduce_fusion": (6.0, "reduction"),
    "loop_add_fusion": (2.0, "elementwise"),
    "a_kernel_nobody_named": (1.0, "other"),
}


@pytest.fixture(scope="module")
def breakdown_module(benchmark_script):
    return benchmark_script("profile_breakdown")


def trace(steps):
    """Each kernel launched once per step on the device's stream, and once more per step on a
    host thread under the same name (the XLA op that launched it), which must not count."""
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "name": "thread_name", "pid": 1, "tid": 14,
               "args": {"name": "Stream #14(Memset,Compute)"}},
              {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/host:CPU"}},
              {"ph": "M", "name": "thread_name", "pid": 7, "tid": 3, "args": {"name": "tf_XLA"}}]
    for step in range(steps):
        for name, (us, _) in KERNELS.items():
            events.append({"ph": "X", "name": name, "pid": 1, "tid": 14, "ts": step, "dur": us})
            events.append({"ph": "X", "name": name, "pid": 7, "tid": 3, "ts": step, "dur": 1e6})
    return {"traceEvents": events}


def test_every_kernel_gets_the_kind_its_name_or_its_fusion_says(breakdown_module):
    kinds = breakdown_module.kernel_kinds(list(KERNELS), HLO)
    assert {name: kind for name, (kind, _) in kinds.items()} == {
        name: kind for name, (_, kind) in KERNELS.items()}
    assert kinds["loop_dynamic_update_slice_fusion"][1] == "f32[12,4]{1,0}"
    assert kinds["memcpy128"][1] == ""  # not a fusion


def test_the_breakdown_sums_device_kernels_per_step_by_kind(breakdown_module):
    result = breakdown_module.breakdown(trace(steps=4), HLO, steps=4, top=3)
    expected = {}
    for us, kind in KERNELS.values():
        expected[kind] = expected.get(kind, 0.0) + us / 1e3
    assert result["ms_per_step_by_kind"] == pytest.approx(expected)
    assert list(result["ms_per_step_by_kind"]) == sorted(expected, key=lambda k: -expected[k])
    assert result["kernel_ms_per_step"] == pytest.approx(sum(expected.values()))
    assert [k["name"][:12] for k in result["top_kernels"]] == [
        "cudnn_genera", "nvjet_sm90_t", "memcpy128"]
    assert all(k["launches_per_step"] == 1 for k in result["top_kernels"])


def test_random_bit_draws_count_each_kernel_s_output_times_its_loop_s_trips(breakdown_module):
    # One Threefry fusion writing (bf16[4], pred[4]) in a computation no loop reaches: 4 draws.
    assert breakdown_module.random_bit_draws(HLO) == 4
    wider = HLO.replace("(bf16[4]{0}, pred[4]{0}) fusion", "(bf16[16,4]{1,0}, pred[4]{0}) fusion")
    assert breakdown_module.random_bit_draws(wider) == 64  # its largest output counts
    # The same fusion in the body of a loop the entry runs 3 times.
    entry = "ENTRY %main.9 (p: f32[4]) -> f32[12,4] {\n  %p = f32[4]{0} parameter(0)\n"
    assert entry in HLO
    looped = HLO.replace(entry, entry + '  %loop = f32[4]{0} while(%p), condition=%cond, '
                         'body=%body, backend_config={"known_trip_count":{"n":"3"}}\n')
    assert breakdown_module.random_bit_draws(looped) == 12
