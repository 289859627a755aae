#!/usr/bin/env python3
"""make_traces.py: writes the synthetic allocation traces in bench/traces/ (CSV: time, op, id,
size, stream; op is "a" for an allocation of size bytes, "f" for the free of allocation id).

They are synthetic, built from the shapes described in each function, with a fixed seed, so
that the files are the same on every run: re-run this script and diff. No trace recorded from a
real framework is here yet (bench/traces/README.md)."""
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


class Trace:
    def __init__(self, name):
        self.rows = []
        self.t = 0
        self.next_id = 1
        self.name = name

    def alloc(self, size, stream=0):
        i = self.next_id
        self.next_id += 1
        self.t += 1
        self.rows.append((self.t, "a", i, int(size), stream))
        return i

    def free(self, i, stream=0):
        self.t += 1
        self.rows.append((self.t, "f", i, 0, stream))

    def write(self):
        with open(os.path.join(HERE, self.name + ".csv"), "w") as f:
            f.write("time,op,id,size,stream\n")
            for r in self.rows:
                f.write("%d,%s,%d,%d,%d\n" % r)


def training(rng):
    """A training loop: parameters and optimizer state live throughout; each of 30 iterations
    allocates 24 layers' activations (1-48 MiB, fixed per layer) and some small temporaries in
    the forward pass, then frees activations in reverse while allocating and freeing gradient
    buffers of the parameters' sizes in the backward pass."""
    t = Trace("training")
    params = [rng.choice([4, 8, 16, 32]) * MiB + rng.randrange(0, 64) * 4096 for _ in range(24)]
    keep = [t.alloc(p) for p in params] + [t.alloc(2 * p) for p in params]     # weights, Adam state
    act = [rng.randrange(1, 48) * MiB + rng.randrange(0, 512) * 512 for _ in range(24)]
    for _ in range(30):
        live = []
        for layer in range(24):
            live.append(t.alloc(act[layer]))
            tmp = t.alloc(rng.randrange(1, 256) * 1024)
            t.free(tmp)
        for layer in reversed(range(24)):
            g = t.alloc(params[layer])
            small = t.alloc(rng.randrange(1, 64) * 512)
            t.free(small)
            t.free(live.pop())
            t.free(g)
    for k in keep:
        t.free(k)
    t.write()


def inference(rng):
    """An inference server: 400 requests, four in flight at a time, each with a sequence length
    of 16 to 2048 tokens; a request holds a KV cache of 160 KiB per token and allocates
    per-step temporaries that scale with its length, all freed when it ends."""
    t = Trace("inference")
    weights = t.alloc(6 * 1024 * MiB)
    inflight = []
    for _ in range(400):
        length = rng.randrange(16, 2049)
        kv = t.alloc(length * 160 * 1024)
        temps = [t.alloc(length * rng.choice([2, 4, 8]) * 1024) for _ in range(3)]
        inflight.append([kv] + temps)
        if len(inflight) > 4:
            for i in inflight.pop(rng.randrange(len(inflight))):
                t.free(i)
    for req in inflight:
        for i in req:
            t.free(i)
    t.free(weights)
    t.write()


def random_sizes(rng):
    """A stress shape: 20000 allocations of sizes log-uniform from 512 B to 64 MiB, each freed
    at a random later point, about 400 live at a time."""
    t = Trace("random")
    live = []
    for _ in range(20000):
        size = int(512 * (64 * MiB / 512) ** rng.random())
        live.append(t.alloc(size))
        if len(live) > 400 or (live and rng.random() < 0.45):
            t.free(live.pop(rng.randrange(len(live))))
    for i in live:
        t.free(i)
    t.write()


def gpt_training(rng):
    """A GPT-style training step of large blocks, as a model without fused attention makes it:
    12 layers of width 1024 (16 heads), a batch of 4 sequences of 1,024 tokens, a vocabulary of
    50,257, fp16. Weights, gradients and Adam state live throughout. Each of 8 steps saves per
    layer the layer norm's output, q/k/v (24 MiB), the attention scores and their softmax
    (128 MiB each), the attention output and the MLP's 4x activations (32 MiB each), with
    temporaries freed at once; then the logits (fp32, 785 MiB) and their gradient; then the
    backward pass frees each layer's activations in reverse while it allocates and frees
    gradients of their sizes."""
    t = Trace("gpt_training")
    b, seq, d, h, vocab, layers = 4, 1024, 1024, 16, 50257, 12
    tokens = b * seq
    params = [d * 3 * d * 2, d * d * 2, d * 4 * d * 2, 4 * d * d * 2]          # per layer, fp16
    keep = [t.alloc(vocab * d * 2)]                                             # embeddings
    for _ in range(layers):
        for p in params:
            keep += [t.alloc(p), t.alloc(p), t.alloc(2 * p), t.alloc(2 * p)]   # weight, grad, Adam m and v (fp32)
    for _ in range(8):
        saved = []
        x = t.alloc(tokens * d * 2)
        for _ in range(layers):
            acts = [t.alloc(tokens * d * 2),                # layer norm
                    t.alloc(tokens * 3 * d * 2),            # q, k, v
                    t.alloc(b * h * seq * seq * 2),         # scores
                    t.alloc(b * h * seq * seq * 2),         # softmax
                    t.alloc(tokens * d * 2)]                # attention output
            tmp = t.alloc(tokens * d * 2)                   # the projection before the residual
            t.free(tmp)
            acts += [t.alloc(tokens * d * 2), t.alloc(tokens * 4 * d * 2), t.alloc(tokens * 4 * d * 2)]
            saved.append(acts)
        logits = t.alloc(tokens * vocab * 4)
        loss = t.alloc(rng.choice([512, 1024]))
        dlogits = t.alloc(tokens * vocab * 4)
        t.free(logits)
        t.free(loss)
        grad = t.alloc(tokens * d * 2)
        t.free(dlogits)
        for acts in reversed(saved):
            for a in reversed(acts):
                g = t.alloc(t_size(t, a))
                t.free(a)
                t.free(grad)
                grad = g
            ws = t.alloc(rng.randrange(1, 64) * 4096)       # a reduction's workspace
            t.free(ws)
        t.free(grad)
        t.free(x)
    for k in keep:
        t.free(k)
    t.write()


def t_size(t, i):
    """The size allocation i of trace t was made with."""
    return next(r[3] for r in t.rows if r[1] == "a" and r[2] == i)


if __name__ == "__main__":
    training(random.Random(1))
    inference(random.Random(2))
    random_sizes(random.Random(3))
    gpt_training(random.Random(4))
