"""How steady each allocator's training was, read from a torch_throughput.py log: per model and
allocator, over every process of every repetition, the medians of the slowest and the fastest
chunk against the process's median chunk (and the slowest of all), the chunks' coefficient of
variation, the median chunk's and the fastest chunk's rate (medians over the processes), and
the memory each process held (PyTorch's reserved bytes at their peak, or
gpupool's mapped bytes at the end). Needs no GPU: it reads the JSON lines a run printed.

    python3 bench/frameworks/chunks.py bench/results/LOG.txt
"""
import json
import re
import statistics
import sys

LINE = re.compile(r"^rep \d+ (\S+)\s+(\S+)\s+.*samples/s\s+(\[.*\])\s*$")


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    rows = {}
    with open(argv[1]) as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            model, allocator, js = m.groups()
            for p in json.loads(js):
                ch = p["chunks"]
                med = statistics.median(ch)
                held = p.get("torch_max_reserved_bytes") or p.get("gpupool_mapped_bytes") or 0
                rows.setdefault((model, allocator), []).append(
                    (min(ch) / med, max(ch) / med, statistics.pstdev(ch) / statistics.mean(ch), held, med, max(ch)))
    if not rows:
        sys.exit(f"chunks.py: no torch_throughput.py result lines in {argv[1]}")
    print("| model | allocator | processes | median chunk, samples/s | fastest chunk | slowest chunk / median "
          "| slowest of all | fastest chunk / median | chunks' cv | held, GB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (model, allocator), v in rows.items():
        print(f"| {model} | {allocator} | {len(v)} | {statistics.median(x[4] for x in v):.1f} | "
              f"{statistics.median(x[5] for x in v):.1f} | {statistics.median(x[0] for x in v):.3f} | "
              f"{min(x[0] for x in v):.3f} | {statistics.median(x[1] for x in v):.3f} | "
              f"{statistics.median(x[2] for x in v):.4f} | {statistics.median(x[3] for x in v) / 1e9:.2f} |")
    print("\nmedians over the processes; held: PyTorch's peak reserved bytes, or gpupool's mapped bytes at the end")


if __name__ == "__main__":
    main(sys.argv)
