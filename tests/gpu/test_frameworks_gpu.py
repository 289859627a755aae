"""The framework hooks with the real PyTorch and CuPy on a GPU, against a gpupoold with the cuda
backend (make check-gpu runs it after check_gpu). Each scenario runs in a fresh interpreter
(the hooks keep one handle per process); a framework that is not installed, or a machine
without a GPU, skips its tests and says why.

What they check is what the frameworks' own tests of a custom allocator check: allocations go
through it, the results computed in that memory are right, freed memory comes back, and a
refusal is the framework's out-of-memory error. Here the refusal must also carry gpupoold's
reason, and for PyTorch it crosses PyTorch's C++ as an exception (the hook's throw path).
"""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

from test_gpupool import BUILD, Daemon, run_python  # noqa: E402

MiB = 1 << 20


def _missing(module):
    """Why module cannot be tested here, or None."""
    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"{module} is not installed"
    return None


def _no_gpu():
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    except OSError:
        return "no nvidia-smi: no GPU on this machine"
    return None if r.returncode == 0 and "GPU" in r.stdout else "nvidia-smi lists no GPU"


NO_GPU = _no_gpu()


class GpuCase(unittest.TestCase):
    module = None
    backend = "cuda"

    def setUp(self):
        why = NO_GPU or _missing(self.module)
        if why:
            self.skipTest(why)
        # 256 MiB per client (cuBLAS takes a 32 MiB workspace on Hopper): the refusal tests ask for more.
        self.d = Daemon("--client-limit", "256M", backend=self.backend)
        self.addCleanup(lambda: self.assertEqual(self.d.stop(), 0))

    def run_ok(self, code, **env):
        r = run_python(code, self.d.sock, fakes=False, **env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr + "\ngpupoold:\n" + self.d.read_log())
        return r.stdout


class TestCupy(GpuCase):
    module = "cupy"

    def test_arrays_live_in_gpupool_memory(self):
        out = self.run_ok("""
            import json, numpy, gpupool, cupy
            gpupool.use_with_cupy()
            float(cupy.ones(4).sum())                     # what CuPy keeps after its first kernel
            base = gpupool.stats()["live_blocks"]
            a = cupy.arange(1 << 20, dtype=cupy.float32)
            b = cupy.sin(a) @ cupy.cos(a)                 # an elementwise kernel and cuBLAS
            want = numpy.sin(numpy.arange(1 << 20, dtype=numpy.float32)) @ numpy.cos(numpy.arange(1 << 20, dtype=numpy.float32))
            print("close", bool(abs(float(b) - float(want)) <= 1e-3 * abs(float(want)) + 1e-2))
            st = gpupool.stats()
            print("live", st["live_blocks"] > 0, st["live_bytes"] >= 4 << 20)
            me = [c for c in gpupool.status()["clients"] if c["name"] == "python"]
            print("seen", len(me))
            del a, b
            cupy.cuda.Device().synchronize()
            print("after", gpupool.stats()["live_blocks"] - base)
        """)
        self.assertIn("close True\n", out)
        self.assertIn("live True True\n", out)
        self.assertIn("seen 1\n", out)
        self.assertIn("after 0\n", out)

    def test_allocator_contract(self):
        # What CuPy's own tests of set_allocator check (tests/cupy_tests/cuda_tests/test_memory.py):
        # the array's memory is the allocator's, of the size asked; another thread allocates
        # through it too; set_allocator() takes it out again (CuPy then calls cudaMalloc itself,
        # its pool unused too).
        out = self.run_ok("""
            import threading, gpupool, cupy
            gpupool.use_with_cupy()
            arr = cupy.arange(128, dtype=cupy.int64)
            print("size", arr.data.mem.size, gpupool.stats()["live_bytes"] >= 1024)
            seen = []
            t = threading.Thread(target=lambda: seen.append(int(cupy.arange(16).sum())))
            t.start()
            t.join()
            print("thread", seen)
            live = gpupool.stats()["live_blocks"]
            cupy.cuda.set_allocator()
            pool = cupy.get_default_memory_pool()
            used = pool.used_bytes()
            other = cupy.arange(128, dtype=cupy.int64)
            print("restored", pool.used_bytes() - used, gpupool.stats()["live_blocks"] - live)
        """)
        self.assertIn("size 1024 True\n", out)
        self.assertIn("thread [120]\n", out)
        self.assertIn("restored 0 0\n", out)

    def test_refusal_is_cupy_out_of_memory_with_reason(self):
        out = self.run_ok("""
            import gpupool, cupy
            gpupool.use_with_cupy()
            try:
                cupy.empty(512 << 20, dtype=cupy.uint8)
            except cupy.cuda.memory.OutOfMemoryError as e:
                print("oom:", e, isinstance(e, MemoryError))
            x = cupy.ones(1 << 20, dtype=cupy.float32)      # still usable after a refusal
            print("sum", float(x.sum()))
        """)
        self.assertIn("oom: Out of memory allocating 536,870,912 bytes: gpupool refused allocating 512.0 MiB", out)
        self.assertIn("over its limit of 256.0 MiB", out)
        self.assertIn(" True\n", out)
        self.assertIn("sum 1048576.0\n", out)

    def test_many_sizes_and_reuse(self):
        out = self.run_ok("""
            import gpupool, cupy
            gpupool.use_with_cupy()
            float(cupy.ones(4).sum())
            base = gpupool.stats()["live_blocks"]
            total = 0.0
            for i in range(2000):
                n = 1 + (i * 7919) % (1 << 18)
                total += float(cupy.full(n, 1, dtype=cupy.float32).sum())
            print("total", int(total) == sum(1 + (i * 7919) % (1 << 18) for i in range(2000)))
            cupy.cuda.Device().synchronize()
            print("live", gpupool.stats()["live_blocks"] - base)
        """)
        self.assertIn("total True\n", out)
        self.assertIn("live 0\n", out)


class TestTorch(GpuCase):
    module = "torch"

    def test_tensors_live_in_gpupool_memory(self):
        out = self.run_ok("""
            import gpupool
            gpupool.use_with_torch()
            import torch
            float(torch.ones(4, device="cuda").sum())     # what PyTorch keeps after its first kernel
            base = gpupool.stats()["live_blocks"]
            x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
            y = (x * 2).sum()
            print("sum", int(y.item()) == (1 << 20) * ((1 << 20) - 1))
            st = gpupool.stats()
            print("live", st["live_blocks"] > 0, st["live_bytes"] >= 4 << 20)
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):                  # a block freed on a side stream
                z = torch.ones(1 << 20, device="cuda")
                w = float(z.sum())
                del z
            s.synchronize()
            del x, y
            torch.cuda.synchronize()
            gpupool.trim()
            print("after", gpupool.stats()["live_blocks"] - base, w)
        """)
        self.assertIn("sum True\n", out)
        self.assertIn("live True True\n", out)
        self.assertIn("after 0 1048576.0\n", out)

    def test_refusal_raises_through_pytorch_with_reason(self):
        out = self.run_ok("""
            import gpupool
            gpupool.use_with_torch()
            import torch
            try:
                torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
            except RuntimeError as e:
                print("oom:", str(e).splitlines()[0])
            x = torch.ones(1 << 20, device="cuda")        # still usable after a refusal
            print("sum", float(x.sum()))
        """)
        self.assertIn("oom: CUDA out of memory. gpupool refused allocating 512.0 MiB", out)
        self.assertIn("over its limit of 256.0 MiB", out)
        self.assertIn("sum 1048576.0\n", out)

    def test_training_steps(self):
        out = self.run_ok("""
            import gpupool
            gpupool.use_with_torch()
            import torch
            torch.manual_seed(0)
            m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
            opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
            x, y = torch.randn(512, 256, device="cuda"), torch.randint(0, 10, (512,), device="cuda")
            first = None
            for _ in range(200):
                loss = torch.nn.functional.cross_entropy(m(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                first = first if first is not None else float(loss)
            print("learned", float(loss) < first / 2)
        """)
        self.assertIn("learned True\n", out)


class TestTorchMempool(GpuCase):
    """gpupool.use_with_torch(mode="mempool"): PyTorch's own caching allocator over segments
    gpupool leases. Every allocation of the device goes there, the autograd engine's threads
    included; PyTorch's statistics and cuDNN's benchmark mode work; a refusal is
    torch.cuda.OutOfMemoryError, and gpupool.last_error() gives gpupoold's reason."""
    module = "torch"

    def test_every_segment_comes_from_gpupool(self):
        out = self.run_ok("""
            import gpupool, torch
            gpupool.use_with_torch("mempool")
            torch.manual_seed(0)
            torch.backends.cudnn.benchmark = True         # asks the allocator for cacheInfo
            m = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                    torch.nn.Linear(16 * 30 * 30, 10)).cuda()
            opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
            x, y = torch.randn(64, 3, 32, 32, device="cuda"), torch.randint(0, 10, (64,), device="cuda")
            first = None
            for _ in range(100):
                loss = torch.nn.functional.cross_entropy(m(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()                           # on the autograd engine's own thread
                opt.step()
                first = first if first is not None else float(loss)
            torch.cuda.synchronize()
            print("learned", float(loss) < first / 2)
            st, reserved = gpupool.stats(), torch.cuda.memory_reserved()
            print("reserved", reserved > 0, "from gpupool", st["live_bytes"] == reserved, st["live_bytes"], reserved)
            print("stats", torch.cuda.memory_stats()["allocation.all.current"] > 0)
        """)
        self.assertIn("learned True\n", out)
        self.assertIn("reserved True from gpupool True", out)
        self.assertIn("stats True\n", out)

    def test_release_frees_the_cache_and_the_process_lives(self):
        """What the release thread does when gpupoold asks: the cache of the pool it leaves goes
        back (PyTorch ends the process where its MemPool is destroyed while a pool is routed),
        the memory still in use goes back once dropped, and the process goes on and exits 0."""
        out = self.run_ok("""
            import gpupool, torch
            from gpupool import _frameworks as f
            a = gpupool.use_with_torch("mempool")
            def release():
                f._torch_rotate(torch, a, torch.cuda.MemPool, torch._C._cuda_beginAllocateToPool,
                                torch._C._cuda_endAllocateToPool, torch._C._cuda_releasePool)
            x = torch.ones(64 << 20, dtype=torch.uint8, device="cuda")
            y = torch.ones(32 << 20, dtype=torch.uint8, device="cuda")
            del x
            torch.cuda.synchronize()
            held = torch.cuda.memory_reserved()
            release()
            print("cache freed", torch.cuda.memory_reserved() <= held - (64 << 20), gpupool.stats()["live_bytes"] < held)
            print("y", int(y[0]) + int(y[-1]) == 2)       # (a sum would make a 256 MiB int64 copy, over the limit)
            del y
            release()
            print("all back", torch.cuda.memory_reserved(), gpupool.stats()["live_bytes"])
            z = torch.ones(1 << 20, device="cuda")
            print("z", float(z.sum()))
        """)
        self.assertIn("cache freed True True\n", out)
        self.assertIn("y True\n", out)
        self.assertIn("all back 0 0\n", out)
        self.assertIn("z 1048576.0\n", out)

    def test_refusal_is_torch_out_of_memory(self):
        out = self.run_ok("""
            import gpupool, torch
            gpupool.use_with_torch("mempool")
            try:
                torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
            except torch.cuda.OutOfMemoryError as e:
                print("oom:", type(e).__name__, gpupool.last_error()[1])
            x = torch.ones(1 << 20, device="cuda")        # still usable after a refusal
            print("sum", float(x.sum()))
        """)
        self.assertIn("oom: OutOfMemoryError allocating 512.0 MiB", out)
        self.assertIn("over its limit of 256.0 MiB", out)
        self.assertIn("sum 1048576.0\n", out)


class TestObjects(GpuCase):
    """Named objects as tensors and arrays: published by one process, which exits; attached by
    another without a copy, every value as published; on cuda-vmm a write is refused."""

    module = "torch"
    backend = "cuda-vmm"

    def test_torch_tensor_outlives_its_publisher(self):
        self.run_ok("""
            import torch, gpupool
            gpupool.publish("weights", torch.arange(3 << 20, dtype=torch.float32, device="cuda").reshape(3, -1))
        """)
        out = self.run_ok("""
            import torch, gpupool
            t = gpupool.attach("weights", torch.float32, (3, 1 << 20))
            print("cuda", t.is_cuda, tuple(t.shape))
            want = torch.arange(3 << 20, dtype=torch.float32, device="cuda").reshape(3, -1)
            print("same", bool((t == want).all()))
            print("sum", float(t.double().sum()) == float(want.double().sum()))
        """)
        self.assertIn("cuda True (3, 1048576)\n", out)
        self.assertIn("same True\n", out)
        self.assertIn("sum True\n", out)
        # A write into it is an illegal address: the process's CUDA context is lost, nothing else.
        r = run_python("""
            import torch, gpupool
            t = gpupool.attach("weights", torch.float32, (3, 1 << 20))
            t.fill_(0)
            torch.cuda.synchronize()
        """, self.d.sock, fakes=False)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        out = self.run_ok("""
            import torch, gpupool
            t = gpupool.attach("weights", torch.float32, (3, 1 << 20))
            print("intact", bool((t[2] == torch.arange(2 << 20, 3 << 20, dtype=torch.float32, device="cuda")).all()))
        """)
        self.assertIn("intact True\n", out)

    def test_cupy_array(self):
        if _missing("cupy"):
            self.skipTest(_missing("cupy"))
        self.run_ok("""
            import cupy, gpupool
            gpupool.publish("table", cupy.arange(1 << 20, dtype=cupy.int64))
        """)
        out = self.run_ok("""
            import cupy, gpupool
            a = gpupool.attach("table", "int64", like="cupy")
            print("same", bool((a == cupy.arange(1 << 20, dtype=cupy.int64)).all()))
        """)
        self.assertIn("same True\n", out)


if __name__ == "__main__":
    print(f"gpupool framework tests on a GPU, build {BUILD}")
    unittest.main()
