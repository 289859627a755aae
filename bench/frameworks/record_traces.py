"""Records allocation traces from PyTorch programs of this repository, on a GPU, in the format of
bench/traces/ (time,op,id,size,stream), so that every held/used figure measured on recorded
programs can be reproduced from a clone.

Each program runs in a process of its own from an empty GPU (nothing allocated before the
recording starts: the weights are in the trace), with PyTorch's own allocator and its memory
history on (torch.cuda.memory._record_memory_history, no stacks); at the end the history
(torch.cuda.memory._snapshot()["device_traces"]) is converted as bench/traces/README.md says:
one fresh id per allocation, `alloc` as `a` with its recorded size, `free_completed` as `f`
(`free_requested` where the history has no completed frees), segment and snapshot entries
dropped, a free of a block the history never allocated skipped and counted. Blocks still live
at the end stay allocated.

The programs (--programs, all by default):
  transformer_train  bench/frameworks/torch_train.py's GPT-like transformer, trained with AdamW
                     (batch 32 of 256 tokens) for --steps steps;
  resnet18_train     its ResNet-18 (batch 64 of 224 x 224), the same way;
  infer_varied       the transformer (sequences up to 1,024 tokens) serving --requests requests
                     of varied length one after another: a batch of 1 to 8 prompts of 16 to 896
                     tokens, then 2 to 8 tokens generated one at a time by running the whole
                     sequence again (no key/value cache), under torch.no_grad(); lengths from a
                     fixed seed.

  python3 bench/frameworks/record_traces.py OUT_DIR [--programs NAME,...] [--steps N] [--requests N]

writes OUT_DIR/torch_NAME.csv and, per trace, one JSON line on standard output with what was
recorded (entries, allocations, frees skipped, peak in use, PyTorch's peak reserved, seconds).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

PROGRAMS = ("transformer_train", "resnet18_train", "infer_varied")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the folder the traces are written to")
    p.add_argument("--programs", default=",".join(PROGRAMS), help="comma-separated: " + ", ".join(PROGRAMS))
    p.add_argument("--steps", type=int, default=8, help="training steps recorded (default 8)")
    p.add_argument("--requests", type=int, default=48, help="requests the inference loop serves (default 48)")
    p.add_argument("--one", choices=PROGRAMS, help=argparse.SUPPRESS)     # the child's program
    a = p.parse_args(argv)
    a.programs = [n for n in a.programs.split(",") if n]
    for n in a.programs:
        if n not in PROGRAMS:
            p.error(f"no program named {n!r}; the programs: {', '.join(PROGRAMS)}")
    return a


def convert(trace, out):
    """Writes one device's history as time,op,id,size,stream; returns what it counted."""
    actions = {e.get("action") for e in trace}
    free_action = "free_completed" if "free_completed" in actions else "free_requested"
    live, streams = {}, {0: 0}
    st = {"entries": len(trace), "allocs": 0, "frees": 0, "skipped_frees": 0, "implicit_frees": 0,
          "peak_in_use_bytes": 0, "live_at_end": 0}
    in_use, next_id, t = 0, 1, 0
    out.write("time,op,id,size,stream\n")

    def line(op, i, size, stream):
        nonlocal t
        t += 1
        out.write(f"{t},{op},{i},{size},{stream}\n")

    for e in trace:
        a = e.get("action")
        if a not in ("alloc", free_action):
            continue
        addr, size = e["addr"], int(e["size"])
        s = streams.setdefault(e.get("stream", 0), len(streams))
        if a == "alloc":
            if addr in live:                # allocated again while live: the history lost a free
                old, old_size = live.pop(addr)
                line("f", old, 0, s)
                in_use -= old_size
                st["implicit_frees"] += 1
            live[addr] = (next_id, size)
            line("a", next_id, size, s)
            next_id += 1
            in_use += size
            st["allocs"] += 1
            st["peak_in_use_bytes"] = max(st["peak_in_use_bytes"], in_use)
        elif addr in live:
            i, size = live.pop(addr)
            line("f", i, 0, s)
            in_use -= size
            st["frees"] += 1
        else:
            st["skipped_frees"] += 1
    st["live_at_end"] = len(live)
    st["streams"] = len(streams)
    return st


def run_one(a):
    """The child: runs one program with the history on and writes its trace."""
    import torch

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import torch_train

    if not torch.cuda.is_available():
        sys.exit("record_traces.py: PyTorch sees no CUDA device: traces are recorded on a GPU")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None, stacks="python")
    t0 = time.perf_counter()
    name = a.one
    if name in ("transformer_train", "resnet18_train"):
        ta = torch_train.parse_args(["--model", name.split("_")[0]])
        model = torch_train.build(torch, ta).to("cuda")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for _ in range(a.steps):
            x, y = model.batch(ta.batch, "cuda")
            loss = model.loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        del loss, x, y
    else:
        ta = torch_train.parse_args(["--model", "transformer"])
        ta.seq = 1024
        model = torch_train.build(torch, ta).to("cuda").eval()
        rng = random.Random(0)
        with torch.no_grad():
            for _ in range(a.requests):
                n, length, gen = rng.choice((1, 2, 4, 8)), rng.randint(16, 896), rng.randint(2, 8)
                x = torch.randint(0, model.vocab, (n, length), device="cuda")
                for _ in range(gen):
                    s = x.shape[1]
                    h = model.enc(model.emb(x) + model.pos[:s], mask=model.mask[:s, :s], is_causal=True)
                    nxt = model.head(h[:, -1]).argmax(-1, keepdim=True)
                    x = torch.cat((x, nxt), 1)
                del x, h, nxt
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    path = os.path.join(a.out, f"torch_{name}.csv")
    with open(path, "w") as f:
        st = convert(snap["device_traces"][torch.cuda.current_device()], f)
    st.update({"trace": path, "program": name, "seconds": round(seconds, 3), "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(), "torch_max_reserved_bytes": torch.cuda.max_memory_reserved(),
               "torch_max_allocated_bytes": torch.cuda.max_memory_allocated()})
    if name == "infer_varied":
        st["requests"] = a.requests
    else:
        st["steps"] = a.steps
    print(json.dumps(st), flush=True)


def main(argv=None):
    a = parse_args(argv)
    if a.one:
        return run_one(a)
    os.makedirs(a.out, exist_ok=True)
    failed = []
    for name in a.programs:
        # A process each: every trace starts from an empty GPU and PyTorch's own allocator.
        cmd = [sys.executable, os.path.abspath(__file__), a.out, "--one", name,
               "--steps", str(a.steps), "--requests", str(a.requests)]
        env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
        rc = subprocess.call(cmd, env=env)
        if rc != 0:
            print(f"record_traces.py: {name}: exit status {rc}", file=sys.stderr, flush=True)
            failed.append(name)
    if failed:
        sys.exit(f"record_traces.py: no trace from {', '.join(failed)}")


if __name__ == "__main__":
    main()
