"""One-off record (not a maintained benchmark): forward+backward time of the RealFormer score core
(He et al., arXiv 2012.11747) and of ADMIN's residual (Liu et al., arXiv 2004.08249) in
candidate formulations, interleaved, 1 thread. Output: formulations_micro.log (load average 7-11
on the shared 2 cores, 2026-12-02). Run: .venv/bin/python docs/benchmarks/formulations_micro.py"""

import statistics
import sys
import time

import torch

torch.set_num_threads(1)
MASK = torch.finfo(torch.float32).min


def make(bh, h, t, d):
    torch.manual_seed(0)
    q = torch.randn(bh, t, d, requires_grad=True)
    k = torch.randn(bh, t, d, requires_grad=True)
    v = torch.randn(bh, t, d, requires_grad=True)
    prev = torch.randn(bh, t, t, requires_grad=True)
    kpm = torch.zeros(bh // h, t, dtype=torch.bool)
    kpm[1:, : t // 8] = True
    return q, k, v, prev, kpm


def current(q, k, v, prev, kpm, h, div):
    s = torch.bmm(q, k.transpose(1, 2)).to(torch.float32)
    s = s + prev
    l = s / div
    b = kpm.size(0)
    t = q.size(1)
    l = l.view(b, h, t, -1).masked_fill(kpm.view(b, 1, 1, -1), MASK).view(b * h, t, -1)
    return torch.bmm(torch.softmax(l, -1), v), s


def add_inplace(q, k, v, prev, kpm, h, div):
    s = torch.bmm(q, k.transpose(1, 2)).to(torch.float32)
    s.add_(prev)
    l = s / div
    b = kpm.size(0)
    t = q.size(1)
    l.view(b, h, t, -1).masked_fill_(kpm.view(b, 1, 1, -1), MASK)
    return torch.bmm(torch.softmax(l, -1), v), s


def baddbmm(q, k, v, prev, kpm, h, div):
    s = torch.baddbmm(prev, q, k.transpose(1, 2))
    l = s / div
    b = kpm.size(0)
    t = q.size(1)
    l.view(b, h, t, -1).masked_fill_(kpm.view(b, 1, 1, -1), MASK)
    return torch.bmm(torch.softmax(l, -1), v), s


def fairseq_eager(q, k, v, prev, kpm, h, div):
    s = torch.bmm(q, k.transpose(1, 2))
    b = kpm.size(0)
    t = q.size(1)
    l = s.view(b, h, t, -1).masked_fill(kpm.view(b, 1, 1, -1), float("-inf")).view(b * h, t, -1)
    return torch.bmm(torch.softmax(l, -1), v), s


def admin_mul(x, r, oi, od):
    return r * (oi + od) + x


def admin_addcmul(x, r, oi, od):
    return torch.addcmul(x, r, oi + od)


def run(shapes, repeats=15, inner=10):
    for t, b, dm, h in shapes:
        bh, d = b * h, dm // h
        q, k, v, prev, kpm = make(bh, h, t, d)
        fns = {
            "current": current,
            "add_inplace": add_inplace,
            "baddbmm": baddbmm,
            "fairseq_eager": fairseq_eager,
        }
        # exactness vs current
        o0, s0 = current(q, k, v, prev, kpm, h, 4.0)
        for n, f in fns.items():
            if n == "fairseq_eager":
                continue
            o, s = f(q, k, v, prev, kpm, h, 4.0)
            print(n, "max|do|", float((o - o0).abs().max()), "max|ds|", float((s - s0).abs().max()))

        def step(f):
            o, s = f(q, k, v, prev, kpm, h, 4.0)
            (o.sum() + 1e-3 * s.sum()).backward()

        x = torch.randn(t, b, dm, requires_grad=True)
        r = torch.randn(t, b, dm, requires_grad=True)
        oi = torch.tensor(1.7)
        od = torch.zeros(dm, requires_grad=True)

        def astep(f):
            f(x, r, oi, od).sum().backward()

        steps = {n: (lambda f=f: step(f)) for n, f in fns.items()}
        steps["admin_mul"] = lambda: astep(admin_mul)
        steps["admin_addcmul"] = lambda: astep(admin_addcmul)
        for fn in steps.values():
            fn()
        times = {n: [] for n in steps}
        for rep in range(repeats):
            for n in (list(steps) if rep % 2 == 0 else list(steps)[::-1]):
                t0 = time.perf_counter()
                for _ in range(inner):
                    steps[n]()
                times[n].append((time.perf_counter() - t0) / inner)

        def ratio(a, bb):
            return statistics.median([y / x for x, y in zip(times[a], times[bb])])

        print(
            f"shape T={t} B={b} d={dm} h={h}: ms",
            {n: round(1e3 * statistics.median(v), 3) for n, v in times.items()},
        )
        print("  speed ratio vs current:", {n: round(ratio(n, "current"), 3) for n in fns})
        print("  current vs fairseq_eager:", round(ratio("current", "fairseq_eager"), 3))
        print("  addcmul vs mul:", round(ratio("admin_addcmul", "admin_mul"), 3), flush=True)


run([(32, 8, 512, 8), (32, 16, 128, 4), (128, 8, 256, 4), (512, 2, 256, 4)])
