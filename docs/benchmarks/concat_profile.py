"""One-off: where one training step's time goes, concat route against eager route, in the
6-layer LM (d256, 4 heads) at 1024 tokens x 2 (torch.profiler, one thread). Output:
concat_profile.log next to this file.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python docs/benchmarks/concat_profile.py
"""

import time

import torch
from torch.profiler import profile

from studies import benchmark_lm as bl
from studies.bench_models import dummy_dictionary, quiet_route_logs

if __name__ == "__main__":
    torch.set_num_threads(1)
    quiet_route_logs()
    args = bl.parse_args(["--layers", "6", "--width", "256", "--ffn", "1024", "--heads", "4"])
    dictionary = dummy_dictionary(8000)
    for name in ("realformer_concat", "realformer_eager"):
        bench = bl.Bench(name, args, 1024, dictionary)
        sample = bl.make_batch(2, 1024, dictionary, seed=1)
        bench.train_step(sample)
        bench.train_step(sample)
        with profile() as prof:
            start = time.perf_counter()
            bench.train_step(sample)
            seconds = time.perf_counter() - start
        print(f"{name}: one step {seconds:.2f} s")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
