"""What one PyTorch allocation and free costs the CPU, with PyTorch's own caching allocator
and with gpupool, in the same run: the cost behind the throughput gap in torch_throughput.py.

Each allocator runs in a process of its own (PyTorch cannot change allocators once it has
used one). A round allocates and frees --pairs tensors of one size on the current stream, as
a training step's temporaries come and go, after a warm-up that fills both caches; the
table gives, per size, the median over --rounds of the nanoseconds per torch.empty() + del,
and gpupool's difference from PyTorch's.

Run it under bench/with-gpupoold.sh, which starts the daemon and sets GPUPOOL_SOCKET and
PYTHONPATH.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = (512, 64 << 10, 1 << 20, 16 << 20)


def child(allocator, pairs, rounds):
    if allocator == "gpupool":
        import gpupool

        gpupool.use_with_torch()
    import torch

    torch.cuda.init()
    result = {}
    for size in SIZES:
        for _ in range(1000):               # warm: both caches hold the block
            t = torch.empty(size, dtype=torch.uint8, device="cuda")
            del t
        torch.cuda.synchronize()
        per = []
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            for _ in range(pairs):
                t = torch.empty(size, dtype=torch.uint8, device="cuda")
                del t
            per.append((time.perf_counter_ns() - t0) / pairs)
        torch.cuda.synchronize()
        result[size] = statistics.median(per)
    print(json.dumps(result))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--child", choices=("torch", "gpupool"))
    a = p.parse_args()
    if a.child:
        return child(a.child, a.pairs, a.rounds)
    if not os.environ.get("GPUPOOL_SOCKET"):
        sys.exit("torch_alloc.py: GPUPOOL_SOCKET is not set; run it under bench/with-gpupoold.sh")
    runs = {}
    for allocator in ("torch", "gpupool"):
        out = subprocess.run([sys.executable, __file__, "--child", allocator, "--pairs", str(a.pairs),
                              "--rounds", str(a.rounds)], check=True, capture_output=True, text=True).stdout
        runs[allocator] = {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}
    print(f"# {a.pairs} torch.empty()+del per round, median of {a.rounds} rounds, ns per pair")
    print(f"{'size':>10} {'torch':>10} {'gpupool':>10} {'difference':>11}")
    for size in SIZES:
        t, g = runs["torch"][size], runs["gpupool"][size]
        print(f"{size:>10} {t:>10.0f} {g:>10.0f} {g - t:>+11.0f}")


if __name__ == "__main__":
    main()
