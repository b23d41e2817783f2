"""Interleaved timing and peak memory, on CPU or GPU, for the speed benchmarks.

Measures the cost of RealFormer residual attention (He et al., arXiv 2012.11747) and ADMIN
(Liu et al., arXiv 2004.08249) against fairseq's transformer: every ratio is the median of
per-repeat ratios of runs interleaved in one process (A B C, then C B A, ...), so that load
which changes between repeats affects every variant alike.
"""

import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from typing import Callable, Dict, List, Optional

import torch


def synchronize(device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def timed(fn: Callable, calls: int, device: str = "cpu") -> float:
    """Seconds for ``calls`` calls of ``fn`` (GPU work included)."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return time.perf_counter() - start


def interleaved_rates(
    steps: Dict[str, Callable], units_per_call: Dict[str, float], repeats: int, calls: int,
    device: str = "cpu", log: Optional[Callable[[int, Dict[str, float]], None]] = None,
) -> Dict[str, List[float]]:  # fmt: skip
    """Units/s of every step, per repeat; even repeats in the given order, odd ones reversed."""
    rates = {name: [] for name in steps}
    for r in range(repeats):
        order = list(steps) if r % 2 == 0 else list(steps)[::-1]
        for name in order:
            seconds = timed(steps[name], calls, device)
            rates[name].append(units_per_call[name] * calls / seconds)
        if log:
            log(r, {name: rates[name][-1] for name in steps})
    return rates


def ratio_of_rates(rates: Dict[str, List[float]], a: str, b: str) -> Dict:
    per_repeat = [x / y for x, y in zip(rates[a], rates[b])]
    return {"median": statistics.median(per_repeat), "per_repeat": per_repeat}


def peak_bytes(fn: Callable, device: str = "cpu") -> int:
    """Peak live tensor bytes allocated while ``fn`` runs, above the level at its start: the
    CUDA caching allocator's peak on a GPU; on CPU, ``torch.profiler`` memory events (tensors
    only: no Python objects, no allocator fragmentation)."""
    if device.startswith("cuda"):
        synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as fh:
            events = json.load(fh)["traceEvents"]
    finally:
        os.remove(path)
    memory = sorted(
        (e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
        key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0)),
    )
    if not memory:
        raise RuntimeError("torch.profiler recorded no CPU memory events")
    live = peak = 0
    for event in memory:
        live += int(event["args"]["Bytes"])
        peak = max(peak, live)
    return peak


def machine_info() -> Dict:
    cpu = platform.processor() or "unknown"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    import fairseq

    return {
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "fairseq": getattr(fairseq, "__version__", "unknown"),
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average_at_start": os.getloadavg(),
    }
