"""One PyTorch training process for bench/frameworks/torch_throughput.py: a small GPT-like
transformer or a ResNet-18 (written out here, so that torchvision is not needed) trained with
AdamW on random data, its memory from PyTorch's own caching allocator or from gpupool.

It talks to the driver on stdin/stdout, one line each way, so that the processes of a run
measure at the same time: after the warm-up steps it prints "ready" and waits; at each "go" it
times --chunks chunks of --chunk-steps steps (synchronizing at the end of each) and prints one
JSON line with the samples per second of each chunk and their median, and what tells the
allocators apart: the GPU time of each step (CUDA events around it, median), the process's
CPU time per step while it queued the steps (every thread's; the chunk's closing synchronize,
where the CUDA runtime spins, left out), the allocations per step (where PyTorch counts them: its own allocator, and
gpupool's "mempool" mode) and the memory held. With --profile-steps N, "profile" runs N more
steps under torch.profiler and prints the kernels' GPU time per step, which leaves out the gaps
where the GPU waited for the CPU (torch_throughput.py profiles one process at a time, so that
no other's kernels share the GPU meanwhile); "quit" ends it.

--allocator: torch (PyTorch's own), gpupool (gpupool.use_with_torch(), gpupool the allocator)
or gpupool-mempool (gpupool.use_with_torch("mempool"): PyTorch's allocator over gpupool's
segments).

Run alone (python3 bench/frameworks/torch_train.py --allocator gpupool) it does not wait: it
times once, profiles if asked, and ends.
--device cpu runs the same steps on the CPU with PyTorch's allocator: a check of the script on
a machine without a GPU, not a measurement.
"""
import argparse
import json
import os
import statistics
import sys
import time


ALLOCATORS = ("torch", "gpupool", "gpupool-mempool")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allocator", choices=ALLOCATORS, default="torch")
    p.add_argument("--model", choices=("transformer", "resnet18"), default="transformer")
    p.add_argument("--batch", type=int, default=0, help="samples per step (default: 32 transformer, 64 resnet18)")
    p.add_argument("--warmup", type=int, default=10, help="steps before the timing")
    p.add_argument("--chunks", type=int, default=10)
    p.add_argument("--chunk-steps", type=int, default=5)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--wait", action="store_true", help="print ready, wait for go on stdin (the driver)")
    p.add_argument("--small", action="store_true", help="a model small enough for --device cpu")
    p.add_argument("--profile-steps", type=int, default=0, help="steps timed by torch.profiler after the rest")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="cuDNN's benchmark mode (fails with --allocator gpupool: no cacheInfo)")
    a = p.parse_args(argv)
    if a.device == "cpu" and a.allocator != "torch":
        p.error("--device cpu runs with --allocator torch only: gpupool gives device memory")
    if not a.batch:
        a.batch = 32 if a.model == "transformer" else 64
    return a


def build(torch, a):
    nn = torch.nn
    small = a.small

    class Transformer(nn.Module):
        # GPT-like: token and position embeddings, pre-norm encoder layers under a causal mask.
        def __init__(self, vocab=8192 if small else 32000, d=128 if small else 512, layers=2 if small else 6,
                     heads=4 if small else 8, seq=64 if small else 256):
            super().__init__()
            self.vocab, self.seq = vocab, seq
            self.emb = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.zeros(seq, d))
            layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
            self.enc = nn.TransformerEncoder(layer, layers)
            self.head = nn.Linear(d, vocab)
            self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1))

        def forward(self, x):
            # is_causal said, not detected: detecting it from the mask copies the mask to the host
            # every forward, a sync that would put the allocator's CPU cost on this model's path.
            return self.head(self.enc(self.emb(x) + self.pos, mask=self.mask, is_causal=True))

        def batch(self, n, device):
            x = torch.randint(0, self.vocab, (n, self.seq), device=device)
            return x, torch.roll(x, -1, 1)

        def loss(self, out, y):
            return nn.functional.cross_entropy(out.reshape(-1, self.vocab), y.reshape(-1))

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        def __init__(self, classes=1000, side=64 if small else 224):
            super().__init__()
            self.classes, self.side = classes, side
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                blocks += [Block(cin, cout, stride), Block(cout, cout, 1)]
                cin = cout
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))

        def batch(self, n, device):
            return (torch.randn(n, 3, self.side, self.side, device=device),
                    torch.randint(0, self.classes, (n,), device=device))

        def loss(self, out, y):
            return nn.functional.cross_entropy(out, y)

    if a.model != "transformer":
        return ResNet18()
    # The longest sequence: the training batches' length, or what a caller that passes seq
    # (bench/frameworks/record_traces.py's inference loop) sends at most.
    seq = getattr(a, "seq", 0)
    return Transformer(seq=seq) if seq else Transformer()


def memory(torch, gpupool, a):
    """What this process holds now, as each allocator can say it."""
    if a.device != "cuda":
        return {}
    m = {}
    if gpupool is not None:
        s = gpupool.stats()
        keys = ("live_bytes", "cached_bytes", "mapped_bytes", "round_trips", "segments_imported")
        m.update({"gpupool_" + k: s[k] for k in keys})
    if a.allocator != "gpupool":        # PyTorch's own allocator keeps the books
        m.update({"torch_reserved_bytes": torch.cuda.memory_reserved(),
                  "torch_max_reserved_bytes": torch.cuda.max_memory_reserved(),
                  "torch_max_allocated_bytes": torch.cuda.max_memory_allocated()})
    return m


def allocations(torch, a):
    """PyTorch's count of the allocations made so far, where its allocator counts them."""
    if a.device != "cuda" or a.allocator == "gpupool":
        return None
    return torch.cuda.memory_stats().get("allocation.all.allocated", 0)


def profile(torch, a, step, steps):
    """GPU time of the kernels per step, in ms, from torch.profiler over steps more steps."""
    from torch.profiler import ProfilerActivity, profile as prof

    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    total = 0
    for e in p.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0)
        # As torch.profiler's own table sums the device's time: kernel, copy and memset events,
        # not the annotations that span them.
        if str(getattr(e, "device_type", "")).endswith("CUDA") and not getattr(e, "is_user_annotation", False):
            total += t
    return total / 1000 / steps


def main(argv=None):
    a = parse_args(argv)
    gpupool = None
    if a.allocator != "torch":
        import gpupool

        gpupool.use_with_torch("mempool" if a.allocator == "gpupool-mempool" else "allocator")  # before torch touches the GPU
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_train.py: PyTorch sees no CUDA device (--device cpu checks the script without one)")
    torch.manual_seed(0)
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        # Off by default for every allocator: with gpupool as the allocator cuDNN's benchmark
        # mode raises (it asks for cacheInfo, which PyTorch does not pass on; docs/frameworks.md).
        torch.backends.cudnn.benchmark = a.cudnn_benchmark
    model = build(torch, a).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    def step():
        # New inputs each step, as a data loader gives: the allocator serves them too.
        x, y = model.batch(a.batch, a.device)
        loss = model.loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    sync()
    if not a.wait:
        result = timed(torch, gpupool, a, step, sync)
        if a.profile_steps and a.device == "cuda":
            result["kernel_ms_per_step"] = round(profile(torch, a, step, a.profile_steps), 3)
        print(json.dumps(result), flush=True)
        return
    # The driver's commands, a line each: "go" times the chunks again (a repetition in the same
    # process), "profile" runs the profiled steps (last: the profiler may leave costs behind),
    # "quit" ends.
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "go":
            print(json.dumps(timed(torch, gpupool, a, step, sync)), flush=True)
        elif cmd == "profile":
            ms = profile(torch, a, step, a.profile_steps) if a.device == "cuda" else None
            print(json.dumps({"kernel_ms_per_step": None if ms is None else round(ms, 3)}), flush=True)
        elif cmd == "quit":
            return
        else:
            sys.exit(f"torch_train.py: expected go, profile or quit from the driver, got {cmd!r}")
    sys.exit("torch_train.py: the driver closed stdin without 'quit'")


def timed(torch, gpupool, a, step, sync):
    """Times a.chunks chunks of a.chunk_steps steps; the result line's dict."""
    # What the timed steps ask of the daemon, import and map (a steady state should do none of it).
    before = gpupool.stats() if gpupool is not None and a.device == "cuda" else None
    grow_before = gpupool.grow_stats() if before is not None else None
    allocs_before = allocations(torch, a)
    rates, gpu_ms, launch_ms, cpu = [], [], [], 0.0
    for _ in range(a.chunks):
        events = []
        t0 = time.perf_counter()
        c0 = time.process_time()
        for _ in range(a.chunk_steps):
            if a.device == "cuda":
                events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
                events[-1][0].record()
            t1 = time.perf_counter()
            loss = step()
            launch_ms.append((time.perf_counter() - t1) * 1000)
            if a.device == "cuda":
                events[-1][1].record()
        # The process's CPU time (every thread: gpupool's reaper and control thread too) while it
        # queued the steps; not the chunk's closing synchronize, where the CUDA runtime spins.
        cpu += time.process_time() - c0
        sync()
        rates.append(a.batch * a.chunk_steps / (time.perf_counter() - t0))
        gpu_ms += [start.elapsed_time(end) for start, end in events]
    steps = a.chunks * a.chunk_steps
    result = {
        "pid": os.getpid(), "allocator": a.allocator, "model": a.model, "batch": a.batch,
        "samples_per_s": statistics.median(rates), "chunks": [round(r, 2) for r in rates],
        "cpu_ms_per_step": round(cpu * 1000 / steps, 3),
        # How long the Python thread took to queue a step (the GPU ran behind it unless this
        # comes near the GPU's time), and how unsteady the chunks were (the spread of rates).
        "launch_ms_per_step": round(statistics.median(launch_ms), 3),
        "chunk_cv": round(statistics.pstdev(rates) / statistics.mean(rates), 4),
        "loss": float(loss), "torch": torch.__version__,
    }
    if gpu_ms:
        gpu_ms.sort()
        result["gpu_ms_per_step"] = round(statistics.median(gpu_ms), 3)
        result["gpu_ms_per_step_p90"] = round(gpu_ms[int(0.9 * (len(gpu_ms) - 1))], 3)
    if allocs_before is not None:
        result["allocations_per_step"] = (allocations(torch, a) - allocs_before) / steps
    result.update(memory(torch, gpupool, a))
    if before is not None:
        result["gpupool_round_trips_timed"] = result["gpupool_round_trips"] - before["round_trips"]
        result["gpupool_segments_imported_timed"] = result["gpupool_segments_imported"] - before["segments_imported"]
        grow = gpupool.grow_stats()     # segments that grow in place; all 0 with whole segments
        result.update({"gpupool_" + k: grow[k] for k in grow})
        for k in ("granules_mapped", "granules_unmapped"):
            result[f"gpupool_{k}_timed"] = grow[k] - grow_before[k]
    return result


if __name__ == "__main__":
    main()
