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


if __name__ == "__main__":
    training(random.Random(1))
    inference(random.Random(2))
    random_sizes(random.Random(3))
