"""Roofline: the machine's own measured ceilings and each cell's fraction of them.

Ceilings are measured once per run on the same machine (design.md §4): a large
square matmul per dtype for FLOP/s and a device-to-device copy for bandwidth.
A cell's `pct_of_limit` is the better of its FLOP-bound and byte-bound times
over the measured time, so 1.0 means "as fast as this machine's measured
matmul/copy allow" and the `bound` column says which of the two binds.

torch is imported inside functions: importing this module has no side effects.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Mapping, Sequence

from ...core.dtypes import dtype_names, dtype_spec
from ...workload.draws import torch_dtype
from ..golden.numerics import BACKWARD_FLOP_FACTOR, attention_flops
from .timing import measure, sync_for, time_call

# Largest problems (n of an n x n matmul, the same for every dtype). A measurement starts from a
# small probe and doubles it while the next size still fits its share of the time budget, so a dtype
# the hardware emulates slowly (bf16 at 0.002 TFLOP/s on an AVX2-only CPU) stays small and fast
# units grow until the probe is large enough to run near their peak.
CPU_MATMUL_N = 2048
CUDA_MATMUL_N = 8192
CPU_COPY_BYTES = 256 * 2**20      # larger than any CPU's last-level cache
CUDA_COPY_BYTES = 2 * 2**30       # ~40x an H100/H200 L2; halved on out-of-memory
MIN_MATMUL_N = 128
MIN_COPY_BYTES = 4 * 2**20
CEILINGS_BUDGET_S = 2.5           # per device, every dtype and the copy together (issue: at most 3 s)
GROW_FRACTION = 0.25              # the growing probes may use this share of a measurement's time
STATISTIC = "max of repeats"
CEILINGS_METHOD = 4               # bump when a change makes earlier (cached) ceilings wrong: 2 = setup call
                                  # not growth; 3 = host_probe_s added; 4 = growth as observed (_grow),
                                  # the CPU's attention probe

# Columns cell_roofline() produces, for the record schema.
ROOFLINE_COLUMNS: tuple[str, ...] = (
    "pct_of_limit", "fwd_bwd_pct_of_limit", "bound", "fwd_bwd_bound", "bytes", "fwd_bwd_bytes",
    "peak_flops_per_s", "peak_bytes_per_s",
)


def _best_rate(fn: Callable[[], object], work_per_call: float, *, budget_s: float,
               sync: Callable[[], None] | None, warm_s: float,
               min_block_s: float = 0.02, clock: Callable[[], float] = time.perf_counter,
               spread: list | None = None) -> float:
    """Best (max) work/s over repeated blocks of calls, for `budget_s` seconds; `spread`, if given,
    gets the best block's rate over the median block's (the measurement's own noise: the referee's
    margin for a cell faster than the ceiling).

    `fn` is already warmed up; `warm_s` is one warm call's time, used to batch
    short calls into blocks of >= `min_block_s` so the clock and the device sync
    cost nothing measurable. At least one block is always timed.
    """
    samples = measure(fn, estimate_s=warm_s, min_samples=1, min_time_s=budget_s, max_samples=10**9,
                      min_block_s=min_block_s, clock=clock, sync=sync)
    fastest = min(samples.per_call_s)
    if spread is not None and fastest > 0:
        spread.append(samples.median_s / fastest)
    return work_per_call / fastest if fastest > 0 else 0.0


def _timed_call(fn: Callable[[], object], sync: Callable[[], None] | None) -> float:
    return time_call(fn, sync=sync)


def _grow(make: Callable[[int], Callable[[], object]], size: int, max_size: int, factor: int,
          cost_growth: float, budget_s: float, sync: Callable[[], None] | None
          ) -> tuple[Callable[[], object], int, float, float, float]:
    """Grow a problem from `size` by `factor` while the next one's warm call still fits
    GROW_FRACTION of the budget. Returns (the call, its size, one warm call's time, time spent
    growing, the setup call's time).

    The next call's time is this one's times the growth the last step showed (observed_growth):
    between MIN_OBSERVED_GROWTH and `cost_growth` (the work's own growth). A call whose time is
    overhead, not work, barely grows with the work: on a 2-core machine with the other core busy,
    a 2-thread 128³ fp32 matmul waits ~10 ms on its thread pool's barrier, and predicted as 8x
    that the probe stopped there and read 0.4 GFLOP/s for a 127 GFLOP/s machine (and the plan,
    from it, found not one cell that fits a 30 s budget). The first step, with no growth seen
    yet, is taken when its call at the work's own growth fits the whole share.

    The very first call is a warm-up left out of the growth budget: as the first CUDA work
    of a process it carries cuBLAS/cuBLASLt setup, workspace allocation and lazy kernel
    loading (hundreds of ms), and counting it stopped growth at the smallest, host-bound
    size, whose rate is a thousandth of the hardware's. Each later size's first call (its
    allocation) does count."""
    fn = make(size)
    setup = _timed_call(fn, sync)                  # library init, workspace, kernel loading
    spent, previous = 0.0, None
    while True:
        warm = _timed_call(fn, sync)
        spent += warm
        if previous is None:
            fits = spent + warm * cost_growth <= budget_s
        else:
            growth = observed_growth(previous, warm, cost_growth)
            fits = spent + warm * growth * 2 <= GROW_FRACTION * budget_s
        if size * factor > max_size or not fits:
            return fn, size, warm, spent, setup
        size *= factor
        fn = make(size)
        spent += _timed_call(fn, sync)             # first call at this size: allocation
        previous = warm


# The least growth of a call's time a step of the probe is predicted with: where the last step grew it
# less (the time was overhead, not work), the next step is still taken as at least doubling it.
MIN_OBSERVED_GROWTH = 2.0


def observed_growth(before_s: float, after_s: float, cost_growth: float) -> float:
    """The factor the next step of a growing probe is predicted to multiply its call's time by: what the
    last step did (after_s over before_s), within MIN_OBSERVED_GROWTH and the work's own growth."""
    seen = after_s / before_s if before_s > 0 else cost_growth
    return min(cost_growth, max(MIN_OBSERVED_GROWTH, seen))


def _matmul_rate(device: str, dtype: str, max_n: int, budget_s: float,
                 sync: Callable[[], None] | None, spread: list | None = None) -> tuple[float, int, float]:
    """(FLOP/s, n used, the setup call's seconds) of an n×n @ n×n matmul in `dtype` within `budget_s` seconds.

    n starts at MIN_MATMUL_N (or max_n if smaller) and doubles (8x the work) while the
    next size fits the budget, up to max_n; the rest of the budget repeats the call.
    """
    import torch


    gen = torch.Generator(device=device).manual_seed(0)

    def make(n: int) -> Callable[[], object]:
        # random data, never zeros: some hardware multiplies zeros faster
        a = torch.randn(n, n, generator=gen, device=device).to(torch_dtype(dtype))   # (n, n)
        b = torch.randn(n, n, generator=gen, device=device).to(torch_dtype(dtype))   # (n, n)
        return lambda: torch.matmul(a, b)                                             # (n, n)

    fn, n, warm, spent, setup = _grow(make, min(MIN_MATMUL_N, max_n), max_n, 2, 8.0, budget_s, sync)
    rate = _best_rate(fn, 2.0 * n ** 3, budget_s=max(0.0, budget_s - spent), sync=sync, warm_s=warm,
                      spread=spread)
    return rate, n, setup


# The attention probe (CPU): the fused kernel SDPA dispatches to, on (1, ATTENTION_HEADS, T, ATTENTION_D)
# inputs, T growing from MIN_ATTENTION_T. A fused kernel's speed in a dtype does not follow that dtype's
# matmul: with oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA=AVX2, an AVX2-only CPU's matmul) a bf16 matmul
# runs at 1.2 GFLOP/s and SDPA's bf16 flash kernel at 300 (2-core Xeon with AMX, one thread).
MIN_ATTENTION_T, CPU_ATTENTION_T = 128, 4096
ATTENTION_HEADS, ATTENTION_D = 2, 64
# Its share of the ceilings' time against a matmul's or the copy's: the cost model's per-call times need
# its rate to ~10%, the roofline's ceilings theirs as large as they grow.
ATTENTION_SHARE = 0.4


def _attention_rate(device: str, dtype: str, max_t: int, budget_s: float,
                    sync: Callable[[], None] | None) -> tuple[float, int]:
    """(FLOP/s, T used) of SDPA's forward in `dtype` (its default dispatch, no mask, no grad), the
    sequence growing from MIN_ATTENTION_T while the next fits the budget (_grow), FLOPs counted as
    every cell's are (numerics.attention_flops)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(0)

    def make(t: int) -> Callable[[], object]:
        q, k, v = (torch.randn(1, ATTENTION_HEADS, t, ATTENTION_D, generator=gen, device=device)
                   .to(torch_dtype(dtype)) for _ in range(3))                   # (1, H, T, d)
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)   # (1, H, T, d)

    with torch.no_grad():
        fn, t, warm, spent, _setup = _grow(make, min(MIN_ATTENTION_T, max_t), max_t, 2, 4.0, budget_s, sync)
        flops = attention_flops(1, ATTENTION_HEADS, t, t, ATTENTION_D, causal=False)
        return _best_rate(fn, flops, budget_s=max(0.0, budget_s - spent), sync=sync, warm_s=warm), t


def matmul_rate_now(device: str, dtype: str, expected_flops_per_s: float | None, *, repeats: int = 3,
                    target_s: float = 0.01, min_n: int = 512, max_n: int = 8192) -> float:
    """FLOP/s of one n×n matmul in `dtype`, best of `repeats`, with n sized so one call takes about
    `target_s` at the expected rate (at least min_n: a call long enough that a busy machine's
    scheduler and thread barriers cost it little). The referee's second look at a ceiling."""
    import torch

    rate = expected_flops_per_s or 1e11
    n = int(min(max_n, max(min_n, round((target_s * rate / 2) ** (1 / 3) / 64) * 64)))
    gen = torch.Generator(device=device).manual_seed(1)
    a = torch.randn(n, n, generator=gen, device=device).to(torch_dtype(dtype))          # (n, n)
    b = torch.randn(n, n, generator=gen, device=device).to(torch_dtype(dtype))          # (n, n)
    sync = sync_for(device)
    best = min(time_call(lambda: torch.matmul(a, b), sync=sync) for _ in range(repeats + 1))
    return 2.0 * n ** 3 / best if best > 0 else 0.0


def _copy_rate(device: str, max_bytes: int, budget_s: float,
               sync: Callable[[], None] | None, spread: list | None = None) -> tuple[float, int]:
    """(bytes/s, tensor bytes) of dst.copy_(src), counting bytes read + bytes written; the
    tensor grows from MIN_COPY_BYTES (4x at a time) within the budget, up to max_bytes."""
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    # Random, never zeros; tiling a 4 MiB random block is far cheaper than drawing
    # 256 MiB+ of random numbers and copies at the same speed.
    block = torch.rand(2**20, generator=gen, device=device) + 0.5                        # (1M,)
    sizes: dict[int, int] = {}

    def make(nbytes: int) -> Callable[[], object]:
        numel = nbytes // 4
        src = block.repeat(-(-numel // block.numel()))[:numel].contiguous()               # (numel,)
        dst = torch.empty_like(src)                                                       # (numel,)
        sizes[id(dst)] = nbytes
        fn = lambda: dst.copy_(src)
        fn.nbytes = nbytes
        return fn

    try:
        fn, nbytes, warm, spent, _setup = _grow(make, min(MIN_COPY_BYTES, max_bytes), max_bytes, 4, 4.0,
                                                budget_s, sync)
    except torch.OutOfMemoryError:
        fn, nbytes, warm, spent, _setup = _grow(make, min(MIN_COPY_BYTES, max_bytes), MIN_COPY_BYTES, 4, 4.0,
                                                budget_s, sync)
    numel = nbytes // 4
    return _best_rate(fn, 2.0 * numel * 4, budget_s=max(0.0, budget_s - spent), sync=sync, warm_s=warm,
                      spread=spread), numel * 4


HOST_PROBE_REPEATS = 5
HOST_PROBE_ROWS = 100


def host_probe_s(repeats: int = HOST_PROBE_REPEATS) -> float:
    """Seconds this host takes, now, for a fixed piece of the audit's own bookkeeping: a
    record-sized dict through JSON and back, and a dict comprehension over it, 100 times (the
    median of `repeats`; about 5 ms on a 2-core Intel Xeon). What a run does outside its cells
    (start-up, planning, writing records, the report) is host-bound Python like this, not
    arithmetic the ceilings measure: plan.overhead scales its constants by this probe."""
    import json
    import statistics

    record = {f"column_{i}": (i * 0.1 if i % 3 else f"value {i}") for i in range(100)}
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(HOST_PROBE_ROWS):
            row = json.loads(json.dumps(record))
            {key: value for key, value in row.items() if value is not None}
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_ceilings(device: str, dtypes: Sequence[str] | None = None, *,
                     budget_s: float = CEILINGS_BUDGET_S, matmul_n: Mapping[str, int] | int | None = None,
                     copy_bytes: int | None = None) -> dict[str, Any]:
    """Measure this machine's matmul FLOP/s per dtype (None: every registered dtype, core/dtypes.py)
    and copy bandwidth, once per run, in about `budget_s` seconds for the device whatever it is; on a
    CPU also SDPA's forward per dtype (`attention_flops_per_s`, `attention_t`, `attention_reason`:
    _attention_rate), which the cost model predicts the fused kernels' cells from (their speed in a
    dtype is not its matmul's).

    Each matmul and the copy get an equal share of the budget: the problem grows from a
    small probe while the next size fits its share (_grow), then the call is repeated
    for the rest of it; the result is the best (max-rate) repeat. Why the max: a ceiling is an upper
    bound, and everything that disturbs a repeat (background load, clocks still
    ramping, page faults) only lowers the rate, so the best repeat is the closest
    estimate of what the hardware can do. The median would understate the
    ceiling on a busy machine and push cells' pct_of_limit above 1.

    Bandwidth counts bytes read + bytes written (a copy of S bytes moves 2·S).
    fp32 matmul follows torch.get_float32_matmul_precision() (TF32 on CUDA when
    set to "high"), recorded as `float32_matmul_precision`.

    A dtype whose matmul fails gets null and a reason in `matmul_reason`; a failed
    copy gives `copy_bytes_per_s` null and `copy_reason`. Nothing is faked.
    `matmul_n` (one n or per dtype) and `copy_bytes` cap the sizes the probes grow to;
    `host_probe_s` is the host's speed at the audit's own Python work (host_probe_s()), for
    plan.overhead; `matmul_n_max` records the cap, `matmul_setup_s` the first (warm-up) call's seconds, and on
    CUDA `multiprocessors` the SM count; `matmul_believable` and `matmul_believable_why` hold
    matmul_plausibility()'s verdict per dtype (None off CUDA), for the report.
    """
    import torch

    started = time.perf_counter()
    dtypes = dtype_names() if dtypes is None else dtypes
    cuda = device.startswith("cuda")
    sync = sync_for(device)
    default_n = CUDA_MATMUL_N if cuda else CPU_MATMUL_N
    out: dict[str, Any] = {
        "device": device,
        "device_name": torch.cuda.get_device_name(torch.device(device)) if cuda else None,
        "matmul_flops_per_s": {}, "matmul_n": {}, "matmul_n_max": {}, "matmul_setup_s": {}, "matmul_reason": {},
        "multiprocessors": (torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
                            if cuda else None),
        "copy_bytes_per_s": None, "copy_tensor_bytes": None, "copy_reason": None,
        "statistic": STATISTIC, "budget_s": budget_s,
        "threads": torch.get_num_threads(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "host_probe_s": host_probe_s(),
        "spread": {},          # per dtype and "copy": best repeat's rate over the median's (the referee's margin)
        "attention_flops_per_s": {}, "attention_t": {}, "attention_reason": {},   # CPU: the attention probe
    }
    # Each probe gets an equal share of what is left when it starts, not of the whole budget: the
    # setup calls, allocations and the host probe otherwise come on top (an H200 took 3.01 s of a
    # 2.5 s budget with fixed shares); 10% of the budget stays for the last probe's overrun.
    deadline = started + 0.9 * budget_s
    weight_left = len(dtypes) * (1 + ATTENTION_SHARE * (not cuda)) + 1

    def next_share(weight: float = 1.0) -> float:
        nonlocal weight_left
        share = max(0.0, deadline - time.perf_counter()) * weight / weight_left
        weight_left -= weight
        return share

    for dt in dtypes:
        if isinstance(matmul_n, int):
            n = matmul_n
        elif matmul_n is not None and dt in matmul_n:
            n = matmul_n[dt]
        else:
            n = default_n
        _measure_matmul(out, device, dt, n, next_share(), sync)
    for dt in dtypes if not cuda else ():
        _measure_attention(out, device, dt, next_share(ATTENTION_SHARE), sync)
    try:
        out["copy_bytes_max"] = copy_bytes or (CUDA_COPY_BYTES if cuda else CPU_COPY_BYTES)
        spread = []
        rate, used = _copy_rate(device, out["copy_bytes_max"], next_share(), sync, spread)
        out["spread"]["copy"] = spread[0] if spread else None
        out["copy_bytes_per_s"], out["copy_tensor_bytes"] = _positive(rate), used
    except Exception as exc:
        out["copy_reason"] = f"{type(exc).__name__}: {exc}"[:500]
    if cuda:
        torch.cuda.empty_cache()
    verdicts = {dt: matmul_plausibility(out, dt) for dt in dtypes}
    out["matmul_believable"] = {dt: ok for dt, (ok, _) in verdicts.items()}
    out["matmul_believable_why"] = {dt: why for dt, (_, why) in verdicts.items()}
    out["elapsed_s"] = time.perf_counter() - started
    return out


def _positive(rate: float) -> float:
    if not (math.isfinite(rate) and rate > 0):
        raise RuntimeError(f"non-positive or non-finite rate {rate!r}")
    return rate


def _measure_matmul(out: dict[str, Any], device: str, dtype: str, n: int, share_s: float,
                    sync: Callable[[], None] | None) -> None:
    """measure_ceilings' matmul columns of one dtype (a rate, or null and the reason it failed)."""
    out["matmul_n_max"][dtype], out["matmul_setup_s"][dtype] = n, None
    try:
        spread: list = []
        rate, used_n, setup_s = _matmul_rate(device, dtype, n, share_s, sync, spread)
        out["spread"][dtype] = spread[0] if spread else None
        out["matmul_flops_per_s"][dtype], out["matmul_n"][dtype] = _positive(rate), used_n
        out["matmul_setup_s"][dtype], out["matmul_reason"][dtype] = setup_s, None
    except Exception as exc:  # unsupported dtype on this device, OOM, ...
        out["matmul_flops_per_s"][dtype], out["matmul_n"][dtype] = None, None
        out["matmul_reason"][dtype] = f"{type(exc).__name__}: {exc}"[:500]


def _measure_attention(out: dict[str, Any], device: str, dtype: str, share_s: float,
                       sync: Callable[[], None] | None) -> None:
    """measure_ceilings' attention columns of one dtype (a rate, or null and the reason it failed)."""
    try:
        rate, used_t = _attention_rate(device, dtype, CPU_ATTENTION_T, share_s, sync)
        out["attention_flops_per_s"][dtype], out["attention_t"][dtype] = _positive(rate), used_t
        out["attention_reason"][dtype] = None
    except Exception as exc:  # noqa: BLE001 - a dtype this CPU's kernels refuse (pack_vnni2 without AVX-512)
        out["attention_flops_per_s"][dtype], out["attention_t"][dtype] = None, None
        out["attention_reason"][dtype] = f"{type(exc).__name__}: {exc}"[:500]


# The fewest FLOP/s per streaming multiprocessor any NVIDIA GPU since Volta does in plain FP32
# (64 FMA lanes = 128 FLOP per clock) at 1 GHz (datacenter GPUs since Pascal boost above 1.3 GHz).
# Tensor-core dtypes do 4-16x more: a measured matmul under this floor timed overhead, not arithmetic.
SM_FLOOR_FLOPS_PER_S = 128 * 1e9


def matmul_plausibility(ceilings: Mapping[str, Any], dtype: str) -> tuple[bool | None, str]:
    """(whether a CUDA matmul ceiling is believable, why) for one dtype of measure_ceilings().

    Believable when the probe grew to its largest size, or when its rate reaches the floor the
    device itself sets at the size it stopped at: min(SM count × SM_FLOOR_FLOPS_PER_S, the
    measured copy bandwidth × that matmul's arithmetic intensity, 2n³ FLOPs over 3n² elements).
    A probe stuck at a small size measures launch and sync overhead (1 TFLOP/s on an H200 that
    does 790), and every cell's pct_of_limit would be inflated by the same factor. None (not
    judged) off CUDA, or for ceilings recorded before the sizes and SM count were.
    """
    if not str(ceilings.get("device") or "cuda").startswith("cuda"):
        return None, f"{dtype}: judged on CUDA only (a CPU's probe may rightly stay small)"
    rate = (ceilings.get("matmul_flops_per_s") or {}).get(dtype)
    n = (ceilings.get("matmul_n") or {}).get(dtype)
    n_max = (ceilings.get("matmul_n_max") or {}).get(dtype)
    sms = ceilings.get("multiprocessors")
    if not rate or not n:
        return None, f"{dtype}: no matmul rate measured"
    if n_max is None or sms is None:
        return None, f"{dtype}: matmul_n_max or multiprocessors not recorded (ceilings of an older attn-audit)"
    if n >= n_max:
        return True, f"{dtype}: grew to its largest size n={n}"
    floor = sms * SM_FLOOR_FLOPS_PER_S
    bandwidth = ceilings.get("copy_bytes_per_s")
    if bandwidth:
        floor = min(floor, bandwidth * 2 * n / (3 * dtype_spec(dtype).bytes))
    if rate >= floor:
        return True, (f"{dtype}: stopped at n={n} of {n_max}, but {rate / 1e12:.3g} TFLOP/s reaches the "
                      f"device's floor {floor / 1e12:.3g} TFLOP/s ({sms} SMs, copy bandwidth)")
    return False, (f"{dtype}: stopped growing at n={n} of {n_max} at {rate / 1e12:.3g} TFLOP/s, under the "
                   f"{floor / 1e12:.3g} TFLOP/s floor of {sms} SMs and the copy bandwidth: it timed overhead")


def attention_bytes(batch: int, heads: int, q_len: int, kv_len: int, d: int, dtype: str, *,
                    mask_bytes: int = 0, backward: bool = False, kv_heads: int | None = None,
                    d_v: int | None = None) -> int:
    """Fewest bytes an attention call must move through memory (the roofline's byte count).

    Forward: read Q (B·H·Tq·d), K (B·Hkv·Tk·d), V (B·Hkv·Tk·d_v; Hkv = kv_heads, default H,
    d_v default d) and the mask, write O (B·H·Tq·d_v). With backward=True: the whole forward+backward,
    i.e. the forward plus a backward that reads Q, K, V, O, dO and the mask again and writes dQ,
    dK, dV. Intermediates (scores, probabilities, softmax statistics) are not
    counted: a fused kernel keeps them on chip, so this is a lower bound and the
    byte-bound time it gives is the best any implementation can reach.
    """
    size = dtype_spec(dtype).bytes
    d_v = d if d_v is None else d_v
    q = batch * heads * q_len * d * size
    o = batch * heads * q_len * d_v * size                       # O, dO
    kv_rows = batch * (heads if kv_heads is None else kv_heads) * kv_len * size
    kv = kv_rows * (d + d_v)                                     # K and V
    fwd = q + kv + mask_bytes + o                                # Q, K, V, mask in; O out
    if not backward:
        return fwd
    bwd = (q + 2 * o + kv + mask_bytes) + (q + kv)               # Q, O, dO, K, V, mask in; dQ, dK, dV out
    return fwd + bwd


def pct_of_limit(flops: float, nbytes: float, seconds: float, peak_flops: float | None,
                 peak_bytes_per_s: float | None) -> tuple[float | None, str | None]:
    """(fraction of the machine's limit reached, "compute" or "memory").

    The limit is the larger of the FLOP-bound time flops/peak_flops and the
    byte-bound time nbytes/bandwidth: no implementation can be faster than
    both. The fraction is that time over the measured `seconds` (1.0 = at the
    roofline), and the name says which bound is the binding (larger) one.
    (None, None) when a peak is missing or non-positive, or seconds <= 0.
    """
    if (peak_flops is None or peak_bytes_per_s is None or not peak_flops > 0
            or not peak_bytes_per_s > 0 or seconds is None or not seconds > 0):
        return None, None
    t_compute = flops / peak_flops
    t_memory = nbytes / peak_bytes_per_s
    if t_compute >= t_memory:
        return t_compute / seconds, "compute"
    return t_memory / seconds, "memory"


def compute_ceiling(ceilings: Mapping[str, Any], dtype: str) -> float | None:
    """FLOP/s a kernel on `dtype` inputs can reach: the better of that dtype's matmul and its upcast
    dtype's (core/dtypes.py: fp32 for every dtype today).

    A kernel may upcast (SDPA on a CPU without fp16 units computes fp16 in fp32 and
    runs ~40x faster than an fp16 matmul there), so the fp32 rate also bounds what
    is attainable; where the low-precision matmul is faster (GPUs), it wins.
    """
    rates = ceilings.get("matmul_flops_per_s") or {}
    known = [r for r in (rates.get(dtype), rates.get(dtype_spec(dtype).upcast)) if r]
    return max(known) if known else None


def cell_roofline(case_like: Mapping[str, Any], fwd_s: float | None, fwd_bwd_s: float | None,
                  ceilings: Mapping[str, Any]) -> dict[str, Any]:
    """A cell's roofline columns (ROOFLINE_COLUMNS) from its measured times and the run's ceilings.

    `case_like` needs batch, heads, seq_len (key length), d_k, dtype, causal and
    optionally kv_heads (defaults to heads), d_v (defaults to d_k), pairs (visible pairs per slice,
    when the scenario counts them: packed documents), q_len (defaults to seq_len) and mask_bytes (bytes of an explicit
    mask tensor; 0 when the kernel builds the mask, as for causal). FLOPs follow
    numerics.attention_flops (causal counts visible pairs only); forward+backward
    is (1 + BACKWARD_FLOP_FACTOR) × forward. Times are seconds per call (medians);
    a None time or missing ceiling gives null fractions.
    """
    b, h = int(case_like["batch"]), int(case_like["heads"])
    hkv = int(case_like.get("kv_heads") or h)
    tk = int(case_like["seq_len"])
    tq = int(case_like.get("q_len") or tk)
    d, dtype, causal = int(case_like["d_k"]), str(case_like["dtype"]), bool(case_like["causal"])
    d_v = int(case_like.get("d_v") or d)
    pairs = case_like.get("pairs")
    mask_bytes = int(case_like.get("mask_bytes") or 0)

    peak_flops = compute_ceiling(ceilings, dtype)
    peak_bw = ceilings.get("copy_bytes_per_s")
    flops = attention_flops(b, h, tq, tk, d, causal, d_v=d_v, pairs=pairs)
    nbytes = attention_bytes(b, h, tq, tk, d, dtype, mask_bytes=mask_bytes, kv_heads=hkv, d_v=d_v)
    fb_bytes = attention_bytes(b, h, tq, tk, d, dtype, mask_bytes=mask_bytes, backward=True, kv_heads=hkv, d_v=d_v)
    pct, bound = pct_of_limit(flops, nbytes, fwd_s or 0.0, peak_flops, peak_bw)
    fb_pct, fb_bound = pct_of_limit(flops * (1 + BACKWARD_FLOP_FACTOR), fb_bytes, fwd_bwd_s or 0.0,
                                    peak_flops, peak_bw)
    return {"pct_of_limit": pct, "fwd_bwd_pct_of_limit": fb_pct, "bound": bound,
            "fwd_bwd_bound": fb_bound, "bytes": nbytes, "fwd_bwd_bytes": fb_bytes,
            "peak_flops_per_s": peak_flops, "peak_bytes_per_s": peak_bw}


def roofline_columns(case: Any, tq: int, inputs: Any, fwd: Any, fb: Any, ceilings: dict | None,
                     pairs: int | None = None) -> dict[str, Any]:
    """A measured cell's roofline columns (ROOFLINE_COLUMNS): cell_roofline on its case (core.grid.Case),
    query length, mask (of its workload.inputs.Inputs) and visible pairs (measurement.work_pairs), from
    its timed medians (timing.Samples; fb None for a forward-only cell); null where the run has no ceilings."""
    if not ceilings:
        return {col: None for col in ROOFLINE_COLUMNS}
    mask = inputs.mask
    case_like = dict(case.axes(), q_len=tq, pairs=pairs,
                     mask_bytes=0 if mask is None else mask.numel() * mask.element_size())
    return cell_roofline(case_like, fwd.median_s, fb.median_s if fb else None, ceilings)
