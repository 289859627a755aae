"""The gpupool Python package on the host backend: Client, status(), the framework glue (with
stand-ins for PyTorch and CuPy in tests/python/fakes: their real selves need a GPU), errors
with gpupoold's reasons, and pip install. Run by tests/check-python.sh from "make test".

Each scenario that uses the framework hooks runs in a fresh interpreter: the hooks keep one
handle per process.
"""
import ctypes
import errno
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("GPUPOOL_BUILD_DIR", os.path.join(TREE, "build")))
os.environ["GPUPOOL_LIBRARY"] = os.path.join(BUILD, "libgpupool.so.1")
os.environ["GPUPOOL_CTL"] = os.path.join(BUILD, "gpupoolctl")
sys.path.insert(0, os.path.join(TREE, "python"))

import gpupool  # noqa: E402

MiB = 1 << 20


class Daemon:
    """A gpupoold of the build on a socket in a temp dir, the host backend unless told."""

    def __init__(self, *args, backend="host"):
        self.dir = tempfile.TemporaryDirectory(prefix="gpupool-py-")
        self.sock = os.path.join(self.dir.name, "gpupool.sock")
        self.log = open(os.path.join(self.dir.name, "log"), "w+")
        self.proc = subprocess.Popen(
            [os.path.join(BUILD, "gpupoold"), "--backend", backend, "--socket", self.sock, "--check-invariants", *args],
            stderr=self.log,
        )
        deadline = time.monotonic() + 10
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                s.connect(self.sock)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("gpupoold did not start: " + self.read_log())
                time.sleep(0.01)
            finally:
                s.close()

    def read_log(self):
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        self.proc.terminate()
        rc = self.proc.wait(10)
        self.log.close()
        self.dir.cleanup()
        return rc


def python_env(sock, fakes=True, **env):
    """An environment for a fresh interpreter on sock with the package and (unless fakes=False,
    for the real frameworks on a GPU) the stand-ins importable."""
    path = [os.path.join(TREE, "python")] + ([os.path.join(HERE, "fakes")] if fakes else [])
    full = dict(os.environ, GPUPOOL_SOCKET=sock, PYTHONPATH=os.pathsep.join(path))
    full.update(env)
    return full


def run_python(code, sock, fakes=True, **env):
    """Runs code in a fresh interpreter (python_env)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=python_env(sock, fakes, **env))


class TestLibraryLookup(unittest.TestCase):
    """From a source checkout, "import gpupool" finds the checkout's build/libgpupool.so.1."""

    def _run(self, root):
        env = {k: v for k, v in os.environ.items() if k not in ("GPUPOOL_LIBRARY", "LD_LIBRARY_PATH")}
        env["PYTHONPATH"] = os.path.join(root, "python")
        return subprocess.run([sys.executable, "-c", "import gpupool; print(gpupool.library_path())"],
                              capture_output=True, text=True, env=env, cwd="/")

    def test_checkout_build_is_found(self):
        with tempfile.TemporaryDirectory() as root:
            # A checkout elsewhere: python/gpupool and build/libgpupool.so.1 side by side.
            subprocess.run(["cp", "-r", os.path.join(TREE, "python"), root], check=True)
            os.mkdir(os.path.join(root, "build"))
            subprocess.run(["cp", os.path.join(BUILD, "libgpupool.so.1"), os.path.join(root, "build")], check=True)
            r = self._run(root)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), os.path.join(os.path.realpath(root), "build", "libgpupool.so.1"))
            # Not built (and not installed): the error says what was looked for.
            os.unlink(os.path.join(root, "build", "libgpupool.so.1"))
            r = self._run(root)
            if r.returncode == 0:
                self.skipTest("libgpupool.so.1 is installed on this machine")
            self.assertIn("ImportError", r.stderr)
            self.assertIn(os.path.join("build", "libgpupool.so.1") + " (this checkout's build: not built)", r.stderr)
            self.assertIn("$GPUPOOL_LIBRARY (unset)", r.stderr)


    def test_installed_package_finds_its_checkout(self):
        """A wheel built from a checkout (pip install ./python) loads that checkout's library
        from anywhere, and says so when it is gone."""
        with tempfile.TemporaryDirectory() as root:
            build = os.path.join(root, "build")
            os.mkdir(build)
            subprocess.run(["cp", os.path.join(BUILD, "libgpupool.so.1"), build], check=True)
            env = dict(os.environ, GPUPOOL_BUILD_DIR=build)
            made = subprocess.run([sys.executable, "-c", "import sys, gpupool_build; print(gpupool_build.build_wheel(sys.argv[1]))",
                                   root], capture_output=True, text=True, env=env, cwd=os.path.join(TREE, "python"))
            self.assertEqual(made.returncode, 0, made.stderr)
            site = os.path.join(root, "venv", "lib", "site-packages")  # not beside build/
            with zipfile.ZipFile(os.path.join(root, made.stdout.strip())) as whl:
                whl.extractall(site)
            r = self._run_site(site)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), os.path.join(build, "libgpupool.so.1"))
            os.unlink(os.path.join(build, "libgpupool.so.1"))
            r = self._run_site(site)
            if r.returncode == 0:
                self.skipTest("libgpupool.so.1 is installed on this machine")
            self.assertIn(os.path.join(build, "libgpupool.so.1") + " (the checkout this package was installed from: not built)",
                          r.stderr)
            self.assertIn("make install", r.stderr)

    def _run_site(self, site):
        env = {k: v for k, v in os.environ.items() if k not in ("GPUPOOL_LIBRARY", "LD_LIBRARY_PATH")}
        env["PYTHONPATH"] = site
        return subprocess.run([sys.executable, "-c", "import gpupool; print(gpupool.library_path())"],
                              capture_output=True, text=True, env=env, cwd="/")


class TestClient(unittest.TestCase):
    def setUp(self):
        self.d = Daemon("--client-limit", "8M")

    def tearDown(self):
        self.assertEqual(self.d.stop(), 0)

    def test_grow_stats(self):
        os.environ["GPUPOOL_SEGMENTS"] = "grow"
        try:
            c = gpupool.Client(self.d.sock, name="py-grow")
        finally:
            del os.environ["GPUPOOL_SEGMENTS"]
        with c:
            p = c.alloc(3 * MiB)                # two granules, none ahead (3 MiB and a 32nd more take two)
            self.assertEqual(c.grow_stats(), {"granules_held": 2, "granules_free": 0, "granules_mapped": 2,
                                              "granules_unmapped": 0})
            c.free(p)
            self.assertEqual(c.grow_stats()["granules_free"], 2)
            c.trim()
            self.assertEqual(c.grow_stats(), {"granules_held": 0, "granules_free": 0, "granules_mapped": 2,
                                              "granules_unmapped": 2})

    def test_alloc_free_stats_trim(self):
        with gpupool.Client(self.d.sock, name="py-plain") as c:
            p = c.alloc(1000)
            ctypes.memset(p, 0x5A, 1000)         # host memory: the caller's to write
            self.assertEqual(ctypes.string_at(p + 999, 1), b"\x5a")
            st = c.stats()
            self.assertEqual((st["live_blocks"], st["live_bytes"], st["mapped_segments"]), (1, 1024, 1))
            self.assertEqual(st["mapped_bytes"], 2 * MiB)
            c.free(p)
            st = c.stats()
            self.assertEqual(st["cached_bytes"], 2 * MiB)         # its segment, all free, kept for the next ones
            self.assertEqual(st["mapped_bytes"], 2 * MiB)
            c.trim()
            st = c.stats()
            self.assertEqual((st["cached_bytes"], st["mapped_bytes"]), (0, 0))
            with self.assertRaises(gpupool.GpupoolError) as e:
                c.free(p)
            self.assertEqual(e.exception.errno, errno.ENOENT)
            with self.assertRaises(ValueError):
                c.alloc(0)
            with self.assertRaises(gpupool.GpupoolError) as e:
                c.alloc(4096, device=2)
            self.assertEqual(e.exception.errno, errno.ENODEV)
            self.assertIn("no device 2", e.exception.strerror)
            names = [cl["name"] for cl in gpupool.status(self.d.sock)["clients"]]
            self.assertIn("py-plain", names)
            self.assertEqual(c.grow_stats(), {"granules_held": 0, "granules_free": 0, "granules_mapped": 0,
                                              "granules_unmapped": 0})     # whole segments
        with self.assertRaises(ValueError):
            c.alloc(1)                          # closed
        c.close()                               # twice is fine

    def test_refusal_is_out_of_memory_with_reason(self):
        c = gpupool.Client(self.d.sock, name="py-limited")
        with self.assertRaises(gpupool.OutOfMemoryError) as e:
            c.alloc(12 * MiB)
        self.assertIsInstance(e.exception, MemoryError)
        self.assertEqual(e.exception.errno, errno.EDQUOT)
        self.assertIn("over its limit of 8.0 MiB", e.exception.strerror)
        c.close()

    def test_connect_failure_says_where(self):
        with self.assertRaises(gpupool.GpupoolError) as e:
            gpupool.Client(os.path.join(self.d.dir.name, "absent.sock"))
        self.assertEqual(e.exception.errno, errno.ENOENT)
        self.assertIn("no gpupoold listens at " + os.path.join(self.d.dir.name, "absent.sock"), e.exception.strerror)
        self.assertIn("start it, or set $GPUPOOL_SOCKET", e.exception.strerror)

    def test_connect_failure_says_why(self):
        # No handle comes back: the library's reason for this thread is what the exception says.
        with self.assertRaises(gpupool.GpupoolError) as e:
            gpupool.Client(self.d.sock, name="x" * 100)
        self.assertEqual(e.exception.errno, errno.EINVAL)
        self.assertIn("a client name is 1 to 63 bytes", e.exception.strerror)

    def test_status(self):
        st = gpupool.status(self.d.sock)
        self.assertEqual(st["devices"][0]["backend"], "host")
        self.assertEqual(st["version"], 1)
        with self.assertRaises(gpupool.GpupoolError) as e:
            gpupool.status(os.path.join(self.d.dir.name, "absent.sock"))
        self.assertIn("gpupoolctl status:", e.exception.strerror)

    def test_status_from_the_checkout(self):
        # No $GPUPOOL_CTL and no gpupoolctl on PATH: the one beside the library the package loaded.
        env = dict(os.environ, PATH="/usr/bin:/bin", PYTHONPATH=os.path.join(TREE, "python"))
        env.pop("GPUPOOL_CTL")
        run = subprocess.run(
            [sys.executable, "-c", "import gpupool, sys; print(gpupool.status(sys.argv[1])['version'])", self.d.sock],
            env=env, capture_output=True, text=True,
        )
        self.assertEqual(run.stdout.strip(), "1", run.stderr)


class TestObjects(unittest.TestCase):
    def setUp(self):
        self.d = Daemon()

    def tearDown(self):
        self.assertEqual(self.d.stop(), 0)

    def test_publish_and_attach(self):
        data = bytes(range(256)) * 4096
        with gpupool.Client(self.d.sock, name="publisher") as c:
            self.assertEqual(c.backend, "host")
            c.publish("weights", data)
            c.publish("vocab", b"v" * 100, readers=["inference", "eval"])
            c.publish("open", b"o" * 100, readers="*")
            with self.assertRaises(gpupool.GpupoolError) as e:
                c.publish("bad", b"b", readers="no spaces")
            self.assertEqual(e.exception.errno, errno.EINVAL)
        out = subprocess.run([gpupool._gpupoolctl(), "--socket", self.d.sock, "--json", "objects"], capture_output=True,
                             text=True, check=True)
        readers = {o["name"]: o["readers"] for o in json.loads(out.stdout)["objects"]}
        self.assertEqual(readers, {"weights": [], "vocab": ["inference", "eval"], "open": ["*"]})
        # The publisher is gone; the object is not.
        with gpupool.Client(self.d.sock, name="reader") as c:
            view = c.attach("weights")
            self.assertTrue(view.readonly)
            self.assertEqual(bytes(view[: len(data)]), data)
            with self.assertRaises(TypeError):
                view[0] = 1
            del view
            with self.assertRaises(gpupool.GpupoolError) as e:
                c.attach("nothing")
            self.assertEqual(e.exception.errno, errno.ENOENT)
            self.assertIn("no object named 'nothing'", e.exception.strerror)
            c.unpublish("weights")
            with self.assertRaises(gpupool.GpupoolError):
                c.attach("weights")


    def test_attach_dtype_without_numpy(self):
        """attach(dtype=) without NumPy says what is missing and what works without it, and leaves
        nothing attached."""
        with gpupool.Client(self.d.sock, name="publisher") as c:
            c.publish("weights", b"w" * 4096)
        r = run_python(
            """
            import sys
            sys.modules["numpy"] = None     # as where NumPy is not installed
            import gpupool
            try:
                gpupool.attach("weights", dtype="float32")
            except ImportError as e:
                print(e)
            print(bytes(gpupool.attach("weights")[:2]))
            """, self.d.sock)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("gives a NumPy array, and NumPy is not installed (pip install numpy); attach() without dtype "
                      "gives a read-only memoryview", r.stdout)
        self.assertIn("b'ww'", r.stdout)


class TestDeviceObjects(unittest.TestCase):
    """Named objects on cuda-vmm, the daemon and this package's library on the fake driver:
    what attach gives Python (a DeviceBuffer, PyTorch and CuPy views through their stand-ins),
    and the detach once nothing uses it. The real frameworks run on a GPU (tests/gpu)."""

    def setUp(self):
        fake = os.path.join(BUILD, "tests", "libfakecuda.so")
        if not os.path.exists(fake):
            self.skipTest(f"no fake driver at {fake} (make test builds it)")
        self.node = tempfile.TemporaryDirectory(prefix="gpupool-py-fake-")
        self.env = {"GPUPOOL_LIBCUDA": fake, "FAKECUDA_DIR": self.node.name}
        os.environ.update(self.env)
        self.d = Daemon(backend="cuda-vmm")

    def tearDown(self):
        self.assertEqual(self.d.stop(), 0)
        for k in self.env:
            os.environ.pop(k)
        self.node.cleanup()

    def test_attach_gives_device_views(self):
        r = run_python(
            """
            import ctypes, gc, json, subprocess, sys
            import gpupool, torch, cupy
            from gpupool._lib import lib

            def attachments():
                out = subprocess.run([gpupool._gpupoolctl(), "--json", "objects"], capture_output=True, text=True)
                return json.loads(out.stdout)["objects"][0]["attachments"]

            pub = gpupool.Client(name="publisher")
            assert pub.backend == "cuda-vmm", pub.backend
            ptr = pub.alloc(16 << 20)
            assert lib.gpupool_publish(pub._handle, b"weights", ptr, 12 << 20) == 0, pub.last_error()
            assert lib.gpupool_detach(pub._handle, ptr) == 0
            pub.close()
            try:
                gpupool.Client(name="x").publish("copy", b"bytes")
            except TypeError as e:
                assert "PyTorch CUDA tensor or a CuPy array" in str(e), e
            else:
                raise AssertionError("publishing host bytes on cuda-vmm was not refused")

            buf = gpupool.attach("weights")
            assert isinstance(buf, gpupool.DeviceBuffer)
            cai = buf.__cuda_array_interface__
            assert cai["shape"] == (12 << 20,) and cai["typestr"] == "|u1" and cai["version"] == 3, cai
            assert cai["data"][1] is True, "cuda-vmm maps it read-only"
            assert attachments() == 1
            typed = buf.view("float32", (3, 1 << 20))      # what attach(name, dtype) gives without a framework
            assert typed.__cuda_array_interface__["data"][1] is True
            assert typed.__cuda_array_interface__["typestr"] == "<f4" and typed.__cuda_array_interface__["shape"] == (3, 1 << 20)
            t = gpupool.attach("weights", "float16", (2, 4))    # torch imported: a tensor (writable, as PyTorch has it)
            assert t.shape == (2, 4) and t.typestr == "<f2" and t.data_ptr() == cai["data"][0]
            a = gpupool.attach("weights", "int32", like="cupy")
            assert a.shape == (3 << 20,) and a.ptr == cai["data"][0]
            try:
                buf.view("float32", (4, 1 << 20))
            except ValueError as e:
                assert "needs 16777216 bytes; the object has 12582912" in str(e), e
            else:
                raise AssertionError("a shape larger than the object was taken")
            # Attached once per handle, counted; detached once nothing uses any of it.
            assert attachments() == 1
            del buf, typed, t, a
            gc.collect()
            assert attachments() == 0, attachments()
            print("ok")
            """,
            self.d.sock,
            **self.env,
        )
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout + self.d.read_log())
        self.assertIn("ok", r.stdout)


class TestFrameworks(unittest.TestCase):
    def setUp(self):
        self.d = Daemon("--client-limit", "8M")

    def tearDown(self):
        self.assertEqual(self.d.stop(), 0)

    def check(self, run):
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        return run.stdout

    def test_cupy(self):
        out = self.check(run_python("""
            import ctypes, json, gpupool, cupy
            gpupool.use_with_cupy()
            alloc = cupy.cuda.get_allocator()
            m = alloc(1 << 20)
            ctypes.memset(m.ptr, 1, 1 << 20)
            print("live", gpupool.stats()["live_blocks"])
            del m
            print("after del", gpupool.stats()["live_blocks"])
            try:
                alloc(12 << 20)
            except cupy.cuda.memory.OutOfMemoryError as e:
                print("oom:", e)
            print("zero", alloc(0).ptr)
            names = [c["name"] for c in gpupool.status()["clients"]]
            print("names", json.dumps(names))
        """, self.d.sock))
        self.assertIn("live 1\n", out)
        self.assertIn("after del 0\n", out)
        self.assertIn("oom: Out of memory allocating 12,582,912 bytes: gpupool refused allocating 12.0 MiB", out)
        self.assertIn("over its limit of 8.0 MiB", out)
        self.assertIn("zero 0\n", out)
        self.assertIn('names ["python"]', out)          # "-c": no script name; see test_client_name

    def test_cupy_with_own_client(self):
        out = self.check(run_python("""
            import gpupool, cupy
            c = gpupool.Client(name="own")
            gpupool.use_with_cupy(c)
            m = cupy.cuda.get_allocator()(4096)
            print("own", c.stats()["live_blocks"])
            print("clients", len(gpupool.status()["clients"]))
        """, self.d.sock))
        self.assertIn("own 1\n", out)
        self.assertIn("clients 1\n", out)           # the shared handle was never made

    def test_torch(self):
        out = self.check(run_python("""
            import ctypes, os, warnings, gpupool, torch
            try:
                ctypes.CDLL("libstdc++.so.6", mode=os.RTLD_NOLOAD)
                cxx = True
            except OSError:
                cxx = False
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                a = gpupool.use_with_torch()
            print("names", a.names, "path", a.path == gpupool.library_path())
            print("nccl", os.environ.get("TORCH_NCCL_AVOID_RECORD_STREAMS"))
            print("warned", bool(w) != cxx, [str(x.message) for x in w])
            p = a.alloc(4096, 0, None)
            print("live", gpupool.stats()["live_bytes"])
            a.free(p, 4096, 0, None)
            print("after free", gpupool.stats()["live_bytes"])
            # Python cannot catch a C++ exception (tests/hooks_throw.cc checks that path): NULL here.
            gpupool._lib.lib.gpupool_torch_set_throw(0)
            print("refused", a.alloc(12 << 20, 0, None), gpupool.last_error())
            print("again", gpupool.use_with_torch() is a)
            # Captures through torch.cuda.CUDAGraph are told to the library (its count after each call).
            lib, g = gpupool._lib.lib, torch.cuda.CUDAGraph()
            g.capture_begin()
            print("capturing", lib.gpupool_hook_capture(1), lib.gpupool_hook_capture(0))
            g.capture_end()
            try:
                g.capture_begin(capture_error_mode="bad")
            except RuntimeError:
                pass
            print("captures", lib.gpupool_hook_capture(0), lib.gpupool_torch_promise(8))
        """, self.d.sock))
        # A process whose PyTorch allocated before the call.
        out += self.check(run_python("""
            import gpupool, torch
            torch.initialized = True
            try:
                gpupool.use_with_torch()
            except RuntimeError as e:
                print("late:", e)
        """, self.d.sock))
        self.assertIn("names ('gpupool_torch_alloc', 'gpupool_torch_free') path True", out)
        self.assertIn("nccl 1\n", out)      # NCCL keeps tensors instead of record_stream(), a no-op here
        # Without a C++ runtime in the process (the stand-in loads none) it says so; with one, it throws.
        self.assertIn("warned True", out)
        self.assertIn("live 4096\n", out)
        self.assertIn("after free 0\n", out)
        self.assertIn('refused None (122, "allocating 12.0 MiB', out)
        self.assertIn("again True\n", out)             # installed once: the same allocator
        self.assertIn("capturing 2 1\n", out)
        self.assertIn("captures -22 -22\n", out)      # none under way (a failed begin undone); no promise 8
        self.assertIn("late: gpupool.use_with_torch(): Can't swap an already initialized allocator: call it before", out)

    def test_torch_mempool(self):
        out = self.check(run_python("""
            import os, gpupool, torch
            a = gpupool.use_with_torch()            # the mode from $GPUPOOL_TORCH_MODE
            print("pools", [(d, p.allocator is a) for d, p in gpupool._frameworks._torch_pools])
            print("routed", sorted((d, [i for i, _ in p]) for d, p in torch.routed.items()))
            print("nccl", os.environ.get("TORCH_NCCL_AVOID_RECORD_STREAMS"))
            t = torch.empty(1024)
            print("live", gpupool.stats()["live_bytes"])
            del t
            print("after del", gpupool.stats()["live_bytes"], torch.cuda.memory_reserved(), torch.cuda.memory_allocated())
            try:
                torch.empty(3 << 20)
            except torch.cuda.OutOfMemoryError as e:
                print("oom", type(e).__name__, gpupool.last_error())
            print("again", gpupool.use_with_torch("mempool") is a, len(gpupool._frameworks._torch_pools))
            try:
                gpupool.use_with_torch("allocator")
            except RuntimeError as e:
                print("mixed:", e)
        """, self.d.sock, GPUPOOL_TORCH_MODE="mempool", FAKE_TORCH_DEVICES="2"))
        self.assertIn("pools [(0, True), (1, True)]\n", out)
        self.assertIn("routed [(0, [(0, 1)]), (1, [(0, 2)])]\n", out)
        self.assertIn("nccl 1\n", out)           # PyTorch never frees a record_stream()'s block while a pool is routed
        self.assertIn("live 4096\n", out)
        self.assertIn("after del 4096 4096 0\n", out)  # in PyTorch's cache: gpupool's block, PyTorch's free memory
        self.assertIn('oom OutOfMemoryError (122, "allocating 12.0 MiB', out)
        self.assertIn("over its limit of 8.0 MiB", out)
        self.assertIn("again True 2\n", out)         # the same allocator, no more pools
        self.assertIn("mixed: gpupool.use_with_torch(): this process uses mode 'mempool' already; a process has "
                      "one mode, not 'allocator' too", out)

    def test_torch_modes_refused(self):
        out = self.check(run_python("""
            import gpupool
            try:
                gpupool.use_with_torch("pool")
            except ValueError as e:
                print("bad mode:", e)
            try:
                gpupool.use_with_torch("mempool")
            except RuntimeError as e:
                print("old torch:", e)
        """, self.d.sock, FAKE_TORCH_NO_MEMPOOL="1"))
        self.assertIn("bad mode: gpupool.use_with_torch(): no mode 'pool' (from the argument or $GPUPOOL_TORCH_MODE): "
                      "one of allocator, mempool", out)
        self.assertIn("old torch: gpupool.use_with_torch(mode='mempool'): PyTorch 2.11.0+standin has no "
                      "torch.cuda.MemPool or torch._C._cuda_beginAllocateToPool (PyTorch 2.8 or later)", out)

    def test_missing_frameworks(self):
        out = self.check(run_python("""
            import gpupool
            for f in (gpupool.use_with_torch, gpupool.use_with_cupy):
                try:
                    f()
                except ImportError as e:
                    print(e)
        """, self.d.sock, PYTHONPATH=os.path.join(TREE, "python")))
        self.assertIn("gpupool.use_with_torch(): PyTorch is not installed", out)
        self.assertIn("gpupool.use_with_cupy(): CuPy is not installed", out)

    def test_client_name(self):
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "train_resnet.py")
            with open(script, "w") as f:
                f.write("import gpupool, cupy\ngpupool.use_with_cupy()\nm = cupy.cuda.get_allocator()(512)\n"
                        "print([c['name'] for c in gpupool.status()['clients']])\n")
            env = python_env(self.d.sock)
            run = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env)
            self.assertIn("['train_resnet']", run.stdout, run.stderr)
            env["GPUPOOL_CLIENT_NAME"] = "job-42"
            run = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env)
            self.assertIn("['job-42']", run.stdout, run.stderr)

    def test_no_daemon(self):
        out = self.check(run_python("""
            import gpupool, cupy
            gpupool.use_with_cupy()
            try:
                cupy.cuda.get_allocator()(4096)
            except MemoryError as e:
                print("refused:", e)
        """, os.path.join(self.d.dir.name, "absent.sock")))
        self.assertIn("gpupool refused no gpupoold listens at", out)
        self.assertIn("start it, or set $GPUPOOL_SOCKET", out)


class TestElasticity(unittest.TestCase):
    """bench/frameworks/torch_elastic.py's gpupool mode on the host backend (1 GiB), through the
    PyTorch hooks and the stand-in's tensors: two processes whose peaks are 0.6 of the device
    each, in turns, both finish, the memory one drops going to the other."""

    def run_elastic(self, *daemon_args, mode="gpupool"):
        d = Daemon(*daemon_args)
        try:
            run = subprocess.run([sys.executable, "-W", "ignore", os.path.join(TREE, "bench", "frameworks", "torch_elastic.py"),
                                  "--modes", mode, "--peak", "0.6", "--rounds", "2"],
                                 capture_output=True, text=True, env=python_env(d.sock), timeout=300)
        finally:
            self.assertEqual(d.stop(), 0)
        return run

    def test_both_peaks_fit_in_turns(self):
        run = self.run_elastic()
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("| gpupool | A | 2 of 2 | finished |", run.stdout)
        self.assertIn("| gpupool | B | 2 of 2 | finished |", run.stdout)

    def test_mempool_peaks_fit_in_turns(self):
        """Mode "mempool": what PyTorch's cache holds goes back when gpupoold asks (the release
        thread moves allocations to a new pool and drops the old), so both processes finish."""
        run = self.run_elastic(mode="gpupool-mempool")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("| gpupool-mempool | A | 2 of 2 | finished |", run.stdout)
        self.assertIn("| gpupool-mempool | B | 2 of 2 | finished |", run.stdout)

    def test_a_refused_peak_fails_the_run_with_the_reason(self):
        run = self.run_elastic("--client-limit", "256M")
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        self.assertIn("| gpupool | A | 0 of 2 | round 1: CUDA out of memory. gpupool refused allocating", run.stdout)
        self.assertIn("over its limit of 256.0 MiB", run.stdout)


class TestPackage(unittest.TestCase):
    def test_version_matches_the_daemon(self):
        run = subprocess.run([os.path.join(BUILD, "gpupoold"), "--version"], capture_output=True, text=True)
        self.assertIn(gpupool.__version__, run.stdout)

    def test_pip_install_offline(self):
        if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
            self.skipTest("no pip for " + sys.executable)
        with tempfile.TemporaryDirectory() as tmp:
            target = os.path.join(tmp, "site")
            run = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--quiet", "--target", target,
                                  os.path.join(TREE, "python")], capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            run = subprocess.run([sys.executable, "-c", "import gpupool; print(gpupool.__file__, gpupool.__version__)"],
                                 capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=target), cwd=tmp)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertTrue(run.stdout.startswith(target), run.stdout)
            self.assertIn(gpupool.__version__, run.stdout)
            self.assertTrue(os.path.isdir(os.path.join(target, f"gpupool-{gpupool.__version__}.dist-info")))


if __name__ == "__main__":
    unittest.main()


class TestChunks(unittest.TestCase):
    """bench/frameworks/chunks.py reads a throughput log's per-process chunks."""

    def test_reads_a_log(self):
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "log.txt")
            with open(log, "w") as f:
                f.write("# header\n")
                for alloc, chunks, held in (("torch", [100, 100, 101, 99], "torch_max_reserved_bytes"),
                                            ("gpupool", [90, 100, 80, 90], "gpupool_mapped_bytes")):
                    p = {"chunks": chunks, held: 2_000_000_000}
                    f.write(f"rep 0 resnet18    {alloc:<8} 1.0 + 1.0 = 2.0 samples/s  {json.dumps([p, p])}\n")
            run = subprocess.run([sys.executable, os.path.join(TREE, "bench/frameworks/chunks.py"), log],
                                 capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertIn("| resnet18 | torch | 2 | 100.0 | 101.0 | 0.990 | 0.990 | 1.010 | 0.0071 | 2.00 |", run.stdout)
            self.assertIn("| resnet18 | gpupool | 2 | 90.0 | 100.0 | 0.889 | 0.889 | 1.111 | 0.0786 | 2.00 |", run.stdout)
            with open(log, "w") as f:
                f.write("nothing\n")
            run = subprocess.run([sys.executable, os.path.join(TREE, "bench/frameworks/chunks.py"), log],
                                 capture_output=True, text=True)
            self.assertIn("no torch_throughput.py result lines", run.stderr)


class TestRecordTraces(unittest.TestCase):
    """bench/frameworks/record_traces.py: its conversion of PyTorch's memory history, and a clear end without a GPU."""

    def load(self):
        import importlib.util

        spec = importlib.util.spec_from_file_location("record_traces", os.path.join(TREE, "bench/frameworks/record_traces.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)        # imports torch only in the child that records
        return mod

    def test_converts_a_history(self):
        import io

        rt = self.load()
        trace = [
            {"action": "segment_alloc", "addr": 0, "size": 2 << 20, "stream": 0},     # the allocator's own: dropped
            {"action": "alloc", "addr": 10, "size": 512, "stream": 0},
            {"action": "alloc", "addr": 20, "size": 1024, "stream": 0},
            {"action": "free_requested", "addr": 10, "size": 512, "stream": 0},       # the completed free counts
            {"action": "free_completed", "addr": 10, "size": 512, "stream": 0},
            {"action": "free_completed", "addr": 99, "size": 5, "stream": 0},         # never allocated here: skipped
            {"action": "alloc", "addr": 20, "size": 2048, "stream": 7},               # over a live block: a lost free
            {"action": "alloc", "addr": 10, "size": 4096, "stream": 7},
        ]
        out = io.StringIO()
        st = rt.convert(trace, out)
        self.assertEqual(out.getvalue(), "time,op,id,size,stream\n1,a,1,512,0\n2,a,2,1024,0\n3,f,1,0,0\n"
                                         "4,f,2,0,1\n5,a,3,2048,1\n6,a,4,4096,1\n")
        self.assertEqual((st["allocs"], st["frees"], st["skipped_frees"], st["implicit_frees"], st["live_at_end"],
                          st["streams"], st["peak_in_use_bytes"]), (4, 1, 1, 1, 2, 2, 6144))

    def test_unknown_program_and_no_gpu(self):
        run = subprocess.run([sys.executable, os.path.join(TREE, "bench/frameworks/record_traces.py"), "/nonexistent",
                              "--programs", "lenet"], capture_output=True, text=True)
        self.assertEqual(run.returncode, 2)
        self.assertIn("no program named 'lenet'", run.stderr)
        with tempfile.TemporaryDirectory() as tmp:
            # Without PyTorch, or without a GPU for it, each program's process fails and the run says so.
            run = subprocess.run([sys.executable, os.path.join(TREE, "bench/frameworks/record_traces.py"), tmp,
                                  "--programs", "resnet18_train"], capture_output=True, text=True,
                                 env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
            self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
            self.assertIn("record_traces.py: no trace from resnet18_train", run.stderr)
            self.assertEqual(os.listdir(tmp), [])
