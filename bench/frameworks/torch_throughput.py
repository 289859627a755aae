"""PyTorch training throughput, two processes at once, with PyTorch's own caching allocator
and with gpupool, in the same run (docs/performance.md, "PyTorch and CuPy on a GPU").

For each model it starts --procs torch_train.py processes per allocator, all at once, and lets
them warm up; then, for each repetition, it starts one allocator's processes' timing together
and collects their samples per second, then the next allocator's (the order alternates between
repetitions), the other processes waiting meanwhile. Starting and warming up take most of a
process's life, so the processes live through every repetition: the GPU must hold all of them
(--procs times the allocators, PyTorch's counted twice).
The table gives, per model and allocator, the median over repetitions of the processes'
summed throughput (each process's own number is the median of its chunks), and each
allocator's ratio to PyTorch's. With the default --native-twice PyTorch's allocator runs twice
in each repetition, so that the table also gives the ratio of native against native: the
run-to-run spread that a ratio of gpupool's must be read against. A second table gives, per
model and allocator, the medians of what each process measured of its steps (GPU time by
CUDA events, its 90th percentile, the kernels' time, the time to queue a step, CPU time,
allocations per step, round trips, memory held, and the spread of the chunks' rates;
torch_train.py).

--allocators picks from torch, gpupool (gpupool as PyTorch's allocator) and gpupool-mempool
(PyTorch's allocator over gpupool's segments).

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


# PyTorch's allocator a second time, in a pair of processes of its own: the native/native spread.
AGAIN = "torch-again"


def allocator_of(run):
    """The --allocator of torch_train.py that a run (an allocator, or AGAIN) uses."""
    return "torch" if run == AGAIN else run


def run_model(a, model, allocators, extra, runs, processes):
    """Every repetition of model with every allocator, in processes that live through them all."""
    specs = []
    for x in allocators:
        argv = [os.path.join(HERE, "torch_train.py"), "--wait", "--allocator", allocator_of(x), "--model", model,
                "--device", a.device, "--profile-steps", str(a.profile_steps)] + extra
        specs += [(f"train-{model}-{x}-{i}", argv) for i in range(a.procs)]
    with workers(specs) as ws:
        group = {x: ws[k * a.procs:(k + 1) * a.procs] for k, x in enumerate(allocators)}
        for w in ws:
            w.ready()
        for rep in range(a.reps):
            for x in (allocators if rep % 2 == 0 else allocators[::-1]):
                for w in group[x]:          # all warmed up: they time the same interval
                    w.send("go")
                results = [json.loads(w.read()) for w in group[x]]
                total = sum(r["samples_per_s"] for r in results)
                print(f"rep {rep} {model:<11} {x:<15} " + " + ".join(f"{r['samples_per_s']:.1f}" for r in results)
                      + f" = {total:.1f} samples/s  " + json.dumps(results), flush=True)
                runs.setdefault((model, x), []).append(total)
                processes.setdefault((model, x), []).extend(results)
        if a.profile_steps:                 # last: the profiler may leave costs behind
            for x in allocators:
                # One process at a time, the others idle: a profile of two processes at once
                # counts the other's kernel slices as this one's.
                profiled = []
                for w in group[x]:
                    w.send("profile")
                    profiled.append(json.loads(w.read()))
                print(f"profile {model:<11} {x:<15} {json.dumps(profiled)}", flush=True)
                for r in processes[(model, x)]:
                    r["kernel_ms_per_step"] = statistics.median(p["kernel_ms_per_step"] for p in profiled)
        for w in ws:
            w.send("quit")
        for w in ws:
            w.finish()


DIAGNOSTICS = (("chunk_cv", "chunk spread (cv)"), ("gpu_ms_per_step", "GPU ms/step (events)"),
               ("gpu_ms_per_step_p90", "p90"), ("kernel_ms_per_step", "kernel ms/step (profiler)"),
               ("launch_ms_per_step", "launch ms/step"),
               ("cpu_ms_per_step", "CPU ms/step"), ("allocations_per_step", "allocations/step"),
               ("gpupool_round_trips_timed", "round trips, timed steps"),
               ("torch_reserved_bytes", "PyTorch reserved, MB"), ("gpupool_mapped_bytes", "gpupool mapped, MB"),
               ("gpupool_live_bytes", "gpupool live, MB"))


def diagnostics(per_process):
    """Per key, the median over every process of every repetition, or None where none measured it."""
    out = {}
    for key, _ in DIAGNOSTICS:
        vals = [r[key] for r in per_process if r.get(key) is not None]
        v = statistics.median(vals) if vals else None
        out[key] = v / 1e6 if v is not None and key.endswith("_bytes") else v
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="transformer,resnet18")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a check of the scripts without a GPU (PyTorch's allocator only)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--allocators", default="torch,gpupool",
                   help="comma-separated, from torch, gpupool, gpupool-mempool (torch is always run)")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="after the repetitions, each process runs this many steps under torch.profiler")
    p.add_argument("--no-native-twice", dest="native_twice", action="store_false",
                   help="run PyTorch's allocator once per repetition (no native/native spread)")
    a, extra = p.parse_known_args()
    if extra[:1] == ["--"]:
        extra = extra[1:]
    if importlib.util.find_spec("torch") is None:
        sys.exit("torch_throughput.py: PyTorch is not installed (python3 -c 'import torch' fails)")
    chosen = [x for x in a.allocators.split(",") if x and x != "torch"]
    for x in chosen:
        if x not in ("gpupool", "gpupool-mempool"):
            sys.exit(f"torch_throughput.py: no allocator {x!r} (--allocators): torch, gpupool, gpupool-mempool")
    allocators = ["torch"] + ([AGAIN] if a.native_twice else []) + (chosen if a.device == "cuda" else [])
    if a.device == "cuda" and chosen and not os.environ.get("GPUPOOL_SOCKET"):
        sys.exit("torch_throughput.py: GPUPOOL_SOCKET is not set; run it under bench/with-gpupoold.sh")

    if a.device != "cuda":
        a.profile_steps = 0
    runs, processes = {}, {}
    for model in a.models.split(","):
        run_model(a, model, allocators, extra, runs, processes)

    others = allocators[1:]
    print("\n| model | processes | PyTorch's allocator, samples/s | " + " | ".join(
        f"{x}, samples/s | ratio" for x in others) + " |")
    print("|---|---|---|" + "---|---|" * len(others))
    table = []
    for model in a.models.split(","):
        t = statistics.median(runs[(model, "torch")])
        row = {"model": model, "procs": a.procs, "reps": a.reps, "torch": t}
        cells = []
        for x in others:
            v = statistics.median(runs[(model, x)])
            row[x] = v
            row[x + "/torch"] = v / t
            cells.append(f"{v:.1f} | {v / t:.3f}")
        table.append(row)
        print(f"| {model} | {a.procs} | {t:.1f} | " + " | ".join(cells) + (" |" if cells else "|"))
    print(f"\nmedians over {a.reps} repetitions of the {a.procs} processes' summed throughput"
          + (f"; {AGAIN} is PyTorch's allocator run a second time in each repetition: "
             "its ratio is the spread of native against native" if a.native_twice else ""))

    print("\n| model | allocator | " + " | ".join(label for _, label in DIAGNOSTICS) + " |")
    print("|---|---|" + "---|" * len(DIAGNOSTICS))
    diag = {}
    for model in a.models.split(","):
        for x in allocators:
            d = diagnostics(processes[(model, x)])
            diag[f"{model}/{x}"] = d
            print(f"| {model} | {x} | " + " | ".join(
                "-" if d[k] is None else f"{d[k]:.3f}" if isinstance(d[k], float) else str(d[k])
                for k, _ in DIAGNOSTICS) + " |")
    print("\nmedians over every process of every repetition")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"table": table, "diagnostics": diag,
                       "runs": {f"{m}/{al}": v for (m, al), v in runs.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
