"""How long each part of ``studies.gpu_check`` will take on an H100 or H200, before it runs.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747).

Each estimate is said with where it comes from: the parts that ran before from the H200 run's
wall time (docs/benchmarks/gpu_check_h200.json), the cases from ``studies.triton_cost``'s
predicted steps times the steps a case runs plus model builds, and Triton's compiles from the
seconds ``studies.triton_compile_times`` measured per kernel for sm_90
(docs/benchmarks/triton_compile_times.json). ``studies.gpu_check --budget`` runs the parts in
``PARTS`` order and skips a part (or a case) whose estimate no longer fits.
"""

import json
import time
from typing import Dict, List, Optional, Tuple

from .runs import REPO_ROOT

# the order a GPU run takes: the triton route's exactness in training at this GPU's
# configurations, then the cases, then the rest
PARTS = ("triton_training", "cases", "precision", "train", "speed", "routes")
# what a budgeted run is for: skipping any of these fails the plan
REQUIRED_PARTS = ("triton_training", "cases")
# Python, torch and fairseq imports and the machine's description before the first part
# (assumed)
STARTUP_SECONDS = 15.0
COMPILE_TIMES = REPO_ROOT / "docs" / "benchmarks" / "triton_compile_times.json"
# seconds of the parts of the H200 run (2026-12-04, gpu_check_h200.json: 319.7 s wall; its
# training part 134.1 s as recorded; the other 185.6 s were not recorded per part and are
# split here by assumption), less the triton part, which that run did not have
PART_SECONDS = {"precision": 15.0, "train": 134.1, "speed": 90.0, "routes_without_triton": 80.6}
# a model build (fairseq's init on the host, the move to the GPU, the optimizer's float32
# copy): assumed, a second plus 10 ns per parameter
BUILD_SECONDS = dict(base=1.0, per_param=1e-8)
# kernels a run compiles per dtype, mask kind and configuration row: forward for the first
# and the other layers, key-block pass for the first, middle and last, the dq pass
KERNELS_PER_MASK_AND_CONFIG = {"forward": 2, "backward": 3, "dq": 1}
# the triton part of "routes": its speed rows (fp16, bf16; key padding and causal; short and
# long rows) and its precision check (float32, fp16, bf16; causal, padded, cross)
ROUTES_TRITON_COMPILES = dict(dtypes=2, masks=2, configs=2, precision_kernels=30)
ROUTES_TRITON_RUN_SECONDS = 20.0
TRAINING_CHECK_RUN_SECONDS = 10.0  # the runs themselves: seconds (float64 reference on GPU)


def compile_seconds(path=COMPILE_TIMES) -> Dict[str, float]:
    """Median seconds per kernel kind, as measured for sm_90 (``triton_compile_times``)."""
    return json.loads(path.read_text(encoding="utf-8"))["median_seconds_per_kernel"]


def kernels_seconds(dtypes: int, masks: int, configs: int, per_kernel: Dict) -> float:
    per_row = sum(n * per_kernel[k] for k, n in KERNELS_PER_MASK_AND_CONFIG.items())
    return dtypes * (masks * configs * per_row + per_kernel["delta"])


def triton_training_estimate(cfg: Dict, per_kernel: Dict) -> Tuple[float, str]:
    training = cfg["routes"]["triton"]["training"]
    configs = len({length <= 64 for length in training["lengths"]})
    compiles = kernels_seconds(len(training["dtypes"]), 2, configs, per_kernel)
    return compiles + TRAINING_CHECK_RUN_SECONDS, (
        f"compiles {compiles:.0f} s ({len(training['dtypes'])} dtypes x causal/key padding x "
        f"{configs} configurations), runs {TRAINING_CHECK_RUN_SECONDS:.0f} s"
    )


def case_estimate(name: str, case: Dict, gpu_name: str, floor: float, timing: Dict,
                  routes, per_kernel: Dict, shapes=None) -> Tuple[float, str]:  # fmt: skip
    """Seconds of one case on ``gpu_name``: builds, the steps it runs (predicted by
    ``triton_cost``; the concat route at the eager route's), Triton's compiles."""
    from . import triton_cost

    shapes = shapes or triton_cost.case_shapes(case)
    model = triton_cost.case_model(case)
    params = triton_cost.model_params(model, case["task"])
    build = BUILD_SECONDS["base"] + BUILD_SECONDS["per_param"] * params
    # per route: warm-up, the memory step and the timed repeats, the baseline alike
    steps_per_batch = timing["warmup"] + 1 + timing["repeats"]
    total = 0.0
    for dtype in case["dtypes"]:
        first = None
        total += build
        for route in routes:
            p = triton_cost.case_route_prediction(name, case, dtype, route, gpu_name, floor,
                                                  shapes)  # fmt: skip
            if not p["modelled"]:
                p = triton_cost.case_route_prediction(name, case, dtype, "eager", gpu_name,
                                                      floor, shapes)  # fmt: skip
            first = first or p
            total += build + steps_per_batch * (p["baseline_step_ms"] + p["step_ms"]) / 1e3
        total += 2 * first["baseline_step_ms"] / 1e3  # the baseline's warm-up and profile
        if "triton" in routes:
            masks = 1 if case["task"] == "masked_lm" else 2
            configs = len(
                {s["src_len"] <= 64 for s in shapes}
                | {s["tgt_len"] <= 64 for s in shapes if s["tgt_len"]}
            )
            total += kernels_seconds(1, masks, configs, per_kernel)
    return (
        total,
        f"{params / 1e6:.0f}M parameters, {len(case['dtypes'])} dtype(s) x {len(routes)} routes",
    )


def plan(cfg: Dict, parts, gpu_name: str, routes) -> List[Dict]:
    """The parts in run order with their estimated seconds (and each case's)."""
    from . import triton_cost

    per_kernel = compile_seconds()
    fit = triton_cost.fit_and_check()
    floor = fit["fitted"]["torch_launch_floor_s"] if fit else triton_cost.LAUNCH_FLOOR_S["torch"]
    out = []
    for part in PARTS:
        if part not in parts:
            continue
        if part == "triton_training":
            seconds, why = triton_training_estimate(cfg, per_kernel)
            out.append(dict(part=part, seconds=seconds, why=why))
        elif part == "cases":
            for name, case in cfg["cases"].items():
                seconds, why = case_estimate(name, case, gpu_name, floor, cfg["timing"], routes,
                                             per_kernel)  # fmt: skip
                out.append(dict(part=part, case=name, seconds=seconds, why=why))
        elif part == "routes":
            c = ROUTES_TRITON_COMPILES
            compiles = kernels_seconds(c["dtypes"], c["masks"], c["configs"], per_kernel)
            compiles += c["precision_kernels"] * statistics_mean(per_kernel)
            seconds = PART_SECONDS["routes_without_triton"] + compiles + ROUTES_TRITON_RUN_SECONDS
            out.append(dict(part=part, seconds=seconds,
                            why=f"the H200 run's routes part, and the triton part: compiles "
                                f"{compiles:.0f} s, runs {ROUTES_TRITON_RUN_SECONDS:.0f} s"))  # fmt: skip
        else:
            out.append(dict(part=part, seconds=PART_SECONDS[part], why="the H200 run's"))
    return out


def statistics_mean(per_kernel: Dict) -> float:
    return sum(per_kernel.values()) / len(per_kernel)


def within_budget(steps: List[Dict], budget: Optional[float]) -> List[Dict]:
    """Each step marked ``runs`` (it fits what the steps before it left of ``budget``, taken
    in run order after the start-up) or not, as ``gpu_check --budget`` decides on a GPU."""
    left = float("inf") if budget is None else budget - STARTUP_SECONDS
    out = []
    for step in steps:
        runs = step["seconds"] <= left
        left -= step["seconds"] if runs else 0.0
        out.append(dict(step, runs=runs))
    return out


def plan_lines(steps: List[Dict], gpu_name: str) -> List[str]:
    """The plan as printed: the start-up, each step (or that it is skipped to stay within the
    budget), the last line ``estimated N s`` (N: the start-up and the steps that run)."""
    lines = [f"plan on {gpu_name} (estimated seconds, in run order):",
             f"start-up: {STARTUP_SECONDS:.0f} s (imports; assumed)"]  # fmt: skip
    total = STARTUP_SECONDS
    for s in steps:
        name = s["part"] + (f" {s['case']}" if "case" in s else "")
        if s.get("runs", True):
            total += s["seconds"]
            lines.append(f"{name}: {s['seconds']:.0f} s ({s['why']})")
        else:
            lines.append(
                f"{name}: skipped to stay within the budget (estimated {s['seconds']:.0f} s)"
            )
    lines.append(f"estimated {total:.0f} s")
    return lines


def plan_fails(steps: List[Dict], budget: Optional[float]) -> bool:
    """Over the budget, or a required part (``REQUIRED_PARTS``) left out to stay within it."""
    total = STARTUP_SECONDS + sum(s["seconds"] for s in steps if s.get("runs", True))
    skipped_required = any(not s.get("runs", True) and s["part"] in REQUIRED_PARTS for s in steps)
    return budget is not None and (total > budget or skipped_required)


class Budget:
    """Seconds left of a run's budget; ``None``: no budget (everything runs)."""

    def __init__(self, seconds: Optional[float]):
        self.seconds, self.start, self.skipped = seconds, time.time(), []

    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - (time.time() - self.start)

    def allows(self, name: str, estimate: float) -> bool:
        """Whether ``name`` (estimated ``estimate`` s) fits what is left; if not, it is
        recorded as skipped and said."""
        left = self.left()
        if estimate <= left:
            return True
        line = (
            f"skipped {name}: estimated {estimate:.0f} s, {max(0.0, left):.0f} s of the budget left"
        )
        print(line, flush=True)
        self.skipped.append(line)
        return False
