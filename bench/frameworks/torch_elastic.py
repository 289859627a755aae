"""Elasticity: two PyTorch processes whose peaks together exceed the GPU, at different times
(docs/performance.md, "PyTorch and CuPy on a GPU").

Each process, when told, reaches a peak of --peak times the GPU's memory in tensors of mixed
sizes, works on them, drops them and says so; the driver then tells the other. The peaks
alternate for --rounds rounds, so that they never overlap and only one fits at a time.

With PyTorch's own caching allocator, the first process keeps what it dropped reserved in its
cache, and the second runs out of memory. With gpupool, what one process drops goes back to
gpupoold (or waits in its client cache, which gpupoold asks for back), and the other
process's allocation gets it. Each mode runs in fresh processes; the output says, for each
process, how many peaks it reached and the error that stopped it, if any.

--modes picks from torch, gpupool (gpupool as PyTorch's allocator) and gpupool-mempool
(PyTorch's allocator over segments from gpupool: what PyTorch keeps in its cache goes back
when gpupoold asks, through the package's release thread).

Run it under bench/with-gpupoold.sh (make bench-frameworks does). The exit status is 1 when a
gpupool process (either mode) failed its peak, whatever PyTorch's allocator did.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

from workers import workers

GiB = 1 << 30
MiB = 1 << 20
MODES = ("torch", "gpupool", "gpupool-mempool")
CHUNKS = (1 * GiB, 256 * MiB, 64 * MiB, 512 * MiB, 16 * MiB)     # a peak's tensors, in turn


def reach_peak(torch, peak):
    """Holds peak bytes in tensors, works on them and drops them all (they are this frame's
    only references: returning frees them, an exception's traceback included)."""
    held, tensors, i = 0, [], 0
    try:
        while held < peak:
            n = min(CHUNKS[i % len(CHUNKS)], peak - held)
            i += 1
            tensors.append(torch.empty(n // 4, dtype=torch.float32, device="cuda"))
            tensors[-1].fill_(float(i))     # touch every page: the memory is really there
            held += n
        return {"ok": True, "peak_bytes": held, "tensors": len(tensors),
                "check": sum(float(t[-1]) for t in tensors[-4:])}
    except RuntimeError as e:              # torch.OutOfMemoryError, or gpupool's refusal
        if "out of memory" not in str(e).lower():
            raise
        return {"ok": False, "held_bytes": held, "error": str(e).strip().splitlines()[0][:400]}


def worker(a):
    gpupool = None
    if a.allocator != "torch":
        import gpupool

        gpupool.use_with_torch("mempool" if a.allocator == "gpupool-mempool" else "allocator")
    import torch

    if not torch.cuda.is_available():
        sys.exit("torch_elastic.py: PyTorch sees no CUDA device")
    total = torch.cuda.get_device_properties(0).total_memory
    peak = int(total * a.peak) // MiB * MiB        # whole float32 tensors
    print(f"ready {total}", flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            return
        t0 = time.perf_counter()
        reply = reach_peak(torch, peak)
        torch.cuda.synchronize()
        reply["seconds"] = round(time.perf_counter() - t0, 3)
        if a.allocator != "gpupool":
            reply["torch_reserved_after_bytes"] = torch.cuda.memory_reserved()
        if gpupool is not None:
            s = gpupool.stats()
            reply["gpupool_cached_after_bytes"] = s["cached_bytes"]
            reply["gpupool_mapped_after_bytes"] = s["mapped_bytes"]
        print(json.dumps(reply), flush=True)


def counters():
    """gpupoold's reclaim and release counters (gpupoolctl metrics), to show where memory came from."""
    ctl = os.environ.get("GPUPOOL_CTL", "gpupoolctl")
    out = subprocess.run([ctl, "metrics"], capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip()}
    keep = ("gpupool_reclaims_total", "gpupool_evictions_total", "gpupool_watermark_releases_total",
            "gpupool_allocations_total", "gpupool_refusals_total")
    found = {}
    for line in out.stdout.splitlines():
        if line.startswith(keep):
            name, _, value = line.rpartition(" ")
            if float(value):
                found[name] = int(float(value))
    return found


def run_mode(a, allocator):
    argv = [os.path.abspath(__file__), "--worker", "--allocator", allocator, "--peak", str(a.peak)]
    reached, failed = {"A": 0, "B": 0}, {}
    with workers((f"elastic-{name}", argv) for name in reached) as ws:
        total = max(int(w.ready()[0]) for w in ws)
        print(f"{allocator}: GPU memory {total / GiB:.1f} GiB; each process peaks at {a.peak:.2f} of it "
              f"({a.peak * total / GiB:.1f} GiB), {2 * a.peak:.2f} of the GPU together", flush=True)
        for rnd in range(1, a.rounds + 1):
            for name, w in zip(reached, ws):
                if name in failed:
                    continue
                w.send("peak")
                r = json.loads(w.read())
                print(f"{allocator}: round {rnd} process {name}: {json.dumps(r)}", flush=True)
                if r["ok"]:
                    reached[name] += 1
                else:
                    failed[name] = f"round {rnd}: {r['error']}"
        for w in ws:
            w.send("quit")
            w.finish()
    return reached, failed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allocator", choices=MODES, default="torch", help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--peak", type=float, default=0.6, help="each process's peak, a fraction of the GPU (default 0.6)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", default="torch,gpupool", help="comma-separated, from " + ", ".join(MODES))
    a = p.parse_args()
    for m in a.modes.split(","):
        if m not in MODES:
            sys.exit(f"torch_elastic.py: no mode {m!r} (--modes): " + ", ".join(MODES))
    if a.worker:
        return worker(a)
    if importlib.util.find_spec("torch") is None:
        sys.exit("torch_elastic.py: PyTorch is not installed (python3 -c 'import torch' fails)")
    if not 0.5 < a.peak < 1:
        sys.exit("torch_elastic.py: --peak must be over 0.5 (the two peaks exceed the GPU) and under 1")
    if not os.environ.get("GPUPOOL_SOCKET"):
        sys.exit("torch_elastic.py: GPUPOOL_SOCKET is not set; run it under bench/with-gpupoold.sh")
    status = 0
    summary = []
    for allocator in a.modes.split(","):
        before = counters()
        reached, failed = run_mode(a, allocator)
        after = counters()
        for name in ("A", "B"):
            line = f"| {allocator} | {name} | {reached[name]} of {a.rounds} | {failed.get(name, 'finished')} |"
            summary.append(line)
        if allocator != "torch":
            moved = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
            print(f"gpupool: gpupoold's counters during the run: {json.dumps(moved)}")
            if failed:
                status = 1
    print("\n| allocator | process | peaks reached | outcome |")
    print("|---|---|---|---|")
    print("\n".join(summary))
    return status


if __name__ == "__main__":
    sys.exit(main())
