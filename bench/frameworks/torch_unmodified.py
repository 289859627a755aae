"""PyTorch with no change under gpupool-run (gpupool-run(1)): this script never imports gpupool.

Run under build/gpupool-run against a gpupoold started with --client-limit LIMIT, it prints one
JSON line: what torch.cuda.mem_get_info() says (its total should be the limit), what is free
after a 256 MiB tensor, and whether a tensor of the limit's size then raises
torch.cuda.OutOfMemoryError, as it must. Exits 1 when either is not so.
bench/frameworks/torch_unmodified.sh runs it, and torch_train.py's training throughput natively
and under gpupool-run (bench/gpu-validate.sh's part run-torch).
"""
import argparse
import json
import sys


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, required=True, help="the client limit the daemon was started with, in bytes")
    a = p.parse_args(argv)
    import torch

    if "gpupool" in sys.modules:
        sys.exit("torch_unmodified.py: gpupool was imported; this is the program that knows nothing of it")
    free, total = torch.cuda.mem_get_info()
    held = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    free_after, _ = torch.cuda.mem_get_info()
    raised, message = False, ""
    try:
        torch.empty(a.limit, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as e:
        raised, message = True, str(e).splitlines()[0][:300]
    del held
    result = {"limit": a.limit, "mem_get_info_total": total, "mem_get_info_free": free,
              "free_after_256MiB": free_after, "total_is_limit": total == a.limit,
              "over_limit_raises_oom": raised, "oom_message": message}
    print(json.dumps(result))
    return 0 if result["total_is_limit"] and raised else 1


if __name__ == "__main__":
    sys.exit(main())
