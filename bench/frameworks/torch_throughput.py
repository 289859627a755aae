"""PyTorch training throughput, two processes at once, with PyTorch's own caching allocator
and with gpupool, in the same run (docs/performance.md, "PyTorch and CuPy on a GPU").

For each model and each repetition it starts --procs torch_train.py processes with one
allocator, lets them warm up, starts their timing together and collects their samples per
second; then the same with the other allocator (the order alternates between repetitions).
The table gives, per model and allocator, the median over repetitions of the processes'
summed throughput (each process's own number is the median of its chunks), and gpupool's
ratio to PyTorch's allocator.

Run it under bench/with-gpupoold.sh (make bench-frameworks does), which starts the daemon
and sets GPUPOOL_SOCKET and PYTHONPATH. Extra arguments after -- go to every torch_train.py.
"""
import argparse
import importlib.util
import json
import os
import statistics
import sys

from workers import workers

HERE = os.path.dirname(os.path.abspath(__file__))


def run_pair(a, allocator, model, rep, extra):
    argv = [os.path.join(HERE, "torch_train.py"), "--wait", "--allocator", allocator, "--model", model,
            "--device", a.device] + extra
    with workers((f"train-{model}-{i}", argv) for i in range(a.procs)) as ws:
        for w in ws:
            w.ready()
        for w in ws:                        # all warmed up: they time the same interval
            w.send("go")
        results = [json.loads(w.read()) for w in ws]
        for w in ws:
            w.finish()
    total = sum(r["samples_per_s"] for r in results)
    print(f"rep {rep} {model:<11} {allocator:<8} " + " + ".join(f"{r['samples_per_s']:.1f}" for r in results)
          + f" = {total:.1f} samples/s  " + json.dumps(results), flush=True)
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="transformer,resnet18")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a check of the scripts without a GPU (PyTorch's allocator only)")
    p.add_argument("--json", help="also write the results here")
    a, extra = p.parse_known_args()
    if extra[:1] == ["--"]:
        extra = extra[1:]
    if importlib.util.find_spec("torch") is None:
        sys.exit("torch_throughput.py: PyTorch is not installed (python3 -c 'import torch' fails)")
    allocators = ("torch", "gpupool") if a.device == "cuda" else ("torch",)
    if a.device == "cuda" and not os.environ.get("GPUPOOL_SOCKET"):
        sys.exit("torch_throughput.py: GPUPOOL_SOCKET is not set; run it under bench/with-gpupoold.sh")

    runs = {}
    for model in a.models.split(","):
        for rep in range(a.reps):
            order = allocators if rep % 2 == 0 else allocators[::-1]
            for allocator in order:
                runs.setdefault((model, allocator), []).append(run_pair(a, allocator, model, rep, extra))

    print("\n| model | processes | PyTorch's allocator, samples/s | gpupool, samples/s | gpupool / PyTorch |")
    print("|---|---|---|---|---|")
    table = []
    for model in a.models.split(","):
        t = statistics.median(runs[(model, "torch")])
        g = statistics.median(runs[(model, "gpupool")]) if (model, "gpupool") in runs else None
        table.append({"model": model, "procs": a.procs, "torch": t, "gpupool": g, "reps": a.reps})
        print(f"| {model} | {a.procs} | {t:.1f} | " + (f"{g:.1f} | {g / t:.3f} |" if g else "- | - |"))
    print(f"\nmedians over {a.reps} repetitions of the {a.procs} processes' summed throughput")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"table": table, "runs": {f"{m}/{al}": v for (m, al), v in runs.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
