"""gpupool-device-plugin against a fake kubelet (fake_kubelet.py, the kubelet's protocols) and the
real gpupoold: registration, units per GPU, Allocate making the reservation a pod's processes
are then held to, reconciling with PodResources, restarts of each of the three, and bad input.
Run by tests/check-kubelet.sh from "make test", on Debian's python3 and its python3-grpcio.

What this does not show: the real kubelet's choices and checkpoints, the scheduler's
arithmetic, and CDI injection by the container runtime; those need a cluster.
"""
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("GPUPOOL_BUILD_DIR", os.path.join(TREE, "build")))
sys.path[:0] = [os.path.join(BUILD, "kubelet-py"), HERE]

from fake_kubelet import FakeKubelet  # noqa: E402

GiB = 1 << 30
POD_A = "0c1f2e3d-4b5a-6978-8a9b-acbdcedf0f1e"
POD_B = "11111111-2222-3333-4444-555555555555"


def wait_for(predicate, timeout=20, step=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = predicate()
        if v:
            return v
        time.sleep(step)
    return predicate()


def cgroup2_mount():
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if " - cgroup2 " in line:
                return line.split()[4]
    return None


class Node:
    """A node for one test: gpupoold (the host backend unless env says otherwise), the fake kubelet and the plugin."""

    def __init__(self, capacity="4G", unit="1G", env=None, backend="host", plugin_args=()):
        self.tmp = tempfile.mkdtemp(prefix="gpupool-kubelet-")
        self.sock = os.path.join(self.tmp, "run", "gpupool.sock")
        self.state = os.path.join(self.tmp, "state")
        self.plugin_dir = os.path.join(self.tmp, "device-plugins")
        self.pod_resources = os.path.join(self.tmp, "pod-resources.sock")
        os.makedirs(os.path.dirname(self.sock))
        os.makedirs(self.state)
        self.env = dict(os.environ, **(env or {}))
        self.daemon_args = [os.path.join(BUILD, "gpupoold"), "--backend", backend, "--host-capacity", capacity,
                            "--socket", self.sock, "--state-dir", self.state, "--check-invariants", "--log-level", "info"]
        self.unit = unit
        self.plugin_args = list(plugin_args)
        self.daemon = self.plugin = None
        self.logs = []
        self.kubelet = FakeKubelet(self.plugin_dir, self.pod_resources)

    def start(self):
        self.start_daemon()
        self.kubelet.start()
        self.start_plugin()
        assert self.kubelet.wait(lambda: self.kubelet.registrations and self.kubelet.devices), "the plugin did not register"

    def start_daemon(self):
        log = open(os.path.join(self.tmp, "gpupoold.log"), "a")
        self.logs.append(log)
        self.daemon = subprocess.Popen(self.daemon_args, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        assert wait_for(lambda: os.path.exists(self.sock) and self.ctl("status").returncode == 0), "gpupoold did not start"

    def start_plugin(self):
        log = open(os.path.join(self.tmp, "plugin.log"), "a")
        self.logs.append(log)
        self.plugin = subprocess.Popen(
            [os.path.join(BUILD, "gpupool-device-plugin"), "--socket", self.sock, "--device-plugin-dir", self.plugin_dir,
             "--pod-resources", self.pod_resources, "--unit", self.unit, "--poll", "0.2", "--reconcile", "0.3",
             "--grace", "1", "--log-level", "debug", *self.plugin_args],
            env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def stop_plugin(self, sig=signal.SIGTERM):
        self.plugin.send_signal(sig)
        self.plugin.wait(20)

    def crash_daemon(self):
        self.daemon.kill()
        self.daemon.wait()

    def close(self):
        for p in (self.plugin, self.daemon):
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.kubelet.stop()
        for log in self.logs:
            log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def ctl(self, *args):
        return subprocess.run([os.path.join(BUILD, "gpupoolctl"), "--socket", self.sock, *args], env=self.env,
                              capture_output=True, text=True)

    def reservations(self):
        out = self.ctl("--json", "reservations")
        assert out.returncode == 0, out.stderr
        return {r["key"]: r for r in json.loads(out.stdout)["reservations"]}

    def log(self, which="plugin"):
        with open(os.path.join(self.tmp, which + ".log")) as f:
            return f.read()


class DevicePluginTest(unittest.TestCase):
    def node(self, **kw):
        n = Node(**kw)
        self.addCleanup(n.close)
        n.start()
        return n

    def test_registers_and_advertises_units(self):
        n = self.node(capacity="4G", unit="1G")
        r = n.kubelet.registrations[0]
        self.assertEqual((r.version, r.endpoint, r.resource_name), ("v1beta1", "gpupool.sock", "gpupool.io/memory"))
        self.assertTrue(r.options.get_preferred_allocation_available)
        self.assertEqual(n.kubelet.healthy(), ["dev0-u%d" % k for k in range(4)])

    def test_allocate_makes_the_reservation_a_pod_is_held_to(self):
        n = self.node(capacity="4G", unit="1G")
        ids, answer = n.kubelet.allocate("job", "main", 2)
        self.assertEqual(sorted(ids), ["dev0-u0", "dev0-u1"])
        self.assertEqual(answer.envs["GPUPOOL_SOCKET"], "/run/gpupool/gpupool.sock")
        token = answer.envs["GPUPOOL_RESERVATION"]
        self.assertGreaterEqual(len(token), 32)
        self.assertEqual([(m.container_path, m.host_path, m.read_only) for m in answer.mounts],
                         [("/run/gpupool", os.path.dirname(n.sock), True)])
        self.assertEqual(list(answer.cdi_devices), [])         # the host backend has no GPU to give
        (key, r), = n.reservations().items()
        self.assertTrue(key.startswith("dp-"))
        self.assertEqual((r["guarantee_bytes"], r["limit_bytes"], r["token"], r["pod_uids"]), (2 * GiB, 2 * GiB, True, []))
        self.assertNotIn(token, n.ctl("--json", "status").stdout)
        # The same units again (a kubelet retrying its Allocate): one reservation, a new token.
        again = n.kubelet.allocate_ids(ids)
        self.assertNotEqual(again.envs["GPUPOOL_RESERVATION"], token)
        self.assertEqual(list(n.reservations()), [key])

    def pod_dirs(self, *uids):
        """The container cgroups of pods, as the kubelet's systemd driver names them; removed after the test."""
        mnt = cgroup2_mount()
        dirs = []

        def remove():
            for d in dirs:
                while d != mnt:
                    try:
                        os.rmdir(d)
                    except OSError:
                        break
                    d = os.path.dirname(d)
        self.addCleanup(remove)
        for uid in uids:
            d = os.path.join(mnt, "kubepods.slice", "kubepods-besteffort.slice",
                             "kubepods-besteffort-pod%s.slice" % uid.replace("-", "_"), "cri-containerd-test.scope")
            os.makedirs(d, exist_ok=True)
            dirs.append(d)
        return dirs

    @unittest.skipUnless(os.geteuid() == 0 and cgroup2_mount(), "needs root and a cgroup v2 hierarchy (pods as the kubelet's cgroups)")
    def test_a_pod_given_two_units_is_held_to_two(self):
        n = self.node(capacity="4G", unit="1G")
        _, answer = n.kubelet.allocate("job", "main", 2)
        env = {"GPUPOOL_SOCKET": n.sock, "GPUPOOL_RESERVATION": answer.envs["GPUPOOL_RESERVATION"]}
        a, b = self.pod_dirs(POD_A, POD_B)
        # Two processes of pod A lease 1 GiB each; the next byte is refused, naming the reservation.
        first = PodClient(a, env, GiB)
        self.addCleanup(first.close)
        self.assertEqual(first.result, "0")
        second = PodClient(a, env, GiB)
        self.addCleanup(second.close)
        self.assertEqual(second.result, "0")
        third = PodClient(a, env, 1)
        self.assertRegex(third.result, r"^-122 .*would take reservation dp-[0-9a-f]+ \(3 clients of its pods\) to 2\.0 GiB "
                                        r"reserved on device 0, over its limit of 2\.0 GiB")
        third.close()
        (r,) = n.reservations().values()
        self.assertEqual(r["pod_uids"], [POD_A])
        self.assertEqual(r["reserved_bytes"], 2 * GiB)
        # Pod B presenting the token is refused, saying whose it is.
        other = PodClient(b, env, 1)
        self.assertIn("is pod %s's: this process is in pod %s" % (POD_A, POD_B), other.result)
        other.close()
        # Pod A's processes end: a greedy pod with no reservation still cannot take what its guarantee keeps.
        first.close()
        second.close()
        self.assertTrue(wait_for(lambda: n.reservations()[r["key"]]["reserved_bytes"] == 0))
        greedy = PodClient(b, {"GPUPOOL_SOCKET": n.sock}, 3 * GiB)
        self.assertIn("held back for other tenants' unused guarantees", greedy.result)
        greedy.close()
        fits = PodClient(b, {"GPUPOOL_SOCKET": n.sock}, 2 * GiB)
        self.assertEqual(fits.result, "0")
        fits.close()

    @unittest.skipUnless(os.geteuid() == 0 and cgroup2_mount(), "needs root and a cgroup v2 hierarchy (pods as the kubelet's cgroups)")
    def test_burst_lends_what_no_one_holds_and_gives_it_back(self):
        n = self.node(capacity="4G", unit="1G", plugin_args=["--burst", "--burst-wait", "2"])
        (a,) = self.pod_dirs(POD_A)
        _, answer = n.kubelet.allocate("a", "main", 1)
        (ra,) = n.reservations().values()
        self.assertEqual((ra["guarantee_bytes"], ra["limit_bytes"]), (GiB, 4 * GiB))
        # Pod A, given 1 unit, uses 3 GiB that no one else holds or is guaranteed.
        env = {"GPUPOOL_SOCKET": n.sock, "GPUPOOL_RESERVATION": answer.envs["GPUPOOL_RESERVATION"]}
        burst = PodClient(a, env, 3 * GiB)
        self.addCleanup(burst.close)
        self.assertEqual(burst.result, "0")
        # In use, it is not taken back: a new pod's 3 units fail, after the wait, naming who holds them.
        with self.assertRaises(grpc.RpcError) as e:
            n.kubelet.allocate("b", "main", 3)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION, n.log())
        self.assertRegex(e.exception.details(), r"only 1\.0 GiB of the reservation's 3\.0 GiB is free to lease: the rest "
                                                 r"is held by reservation %s \(2\.0 GiB over its guarantee\)" % ra["key"])
        self.assertEqual(list(n.reservations()), [ra["key"]])
        # Kept free in its process, it is asked back (ladder step 3) and the new pod's Allocate succeeds.
        self.assertEqual(burst.free(), "0")
        ids, _ = n.kubelet.allocate("b", "main", 3)
        self.assertEqual(len(n.reservations()), 2)
        self.assertTrue(wait_for(lambda: n.reservations()[ra["key"]]["reserved_bytes"] == 0))

    @unittest.skipUnless(os.geteuid() == 0 and cgroup2_mount(), "needs root and a cgroup v2 hierarchy (pods as the kubelet's cgroups)")
    def test_a_cuda_program_under_gpupool_run_is_held_to_its_units(self):
        fake = os.path.join(BUILD, "tests", "libfakecuda.so")
        prog = os.path.join(BUILD, "tests", "cuprog-linked")
        if not (os.path.exists(fake) and os.path.exists(prog)):
            self.skipTest("no fake driver or CUDA program built (make test builds them)")
        tmp = tempfile.mkdtemp(prefix="gpupool-fakecuda-")
        self.addCleanup(shutil.rmtree, tmp, True)
        env = {"GPUPOOL_LIBCUDA": fake, "FAKECUDA_MEM": "2G", "FAKECUDA_DIR": tmp}
        n = self.node(unit="256M", backend="cuda-vmm", env=env)
        (a,) = self.pod_dirs(POD_A)
        _, answer = n.kubelet.allocate("job", "main", 1)
        # A program that knows nothing of gpupool, under gpupool-run, with what Allocate gave its container.
        run = dict(n.env, GPUPOOL_RESERVATION=answer.envs["GPUPOOL_RESERVATION"],
                   LD_LIBRARY_PATH=os.path.join(BUILD, "tests", "cudalib"))
        preload = os.environ.get("GPUPOOL_TEST_PRELOAD", "").strip()
        if preload:
            run["ASAN_OPTIONS"] = "detect_leaks=0:verify_asan_link_order=0"
        out = subprocess.run(["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', a, os.path.join(BUILD, "gpupool-run"),
                              "--socket", n.sock, "--", prog, "fill", "1000"], env=run, capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        # Its 256 MiB in 1 MiB blocks, then CUDA_ERROR_OUT_OF_MEMORY (2), the reason naming the reservation.
        self.assertIn("refused 256 2", out.stdout, out.stdout + out.stderr)
        self.assertRegex(out.stdout + out.stderr, r"gpupool-run: .*would take reservation dp-[0-9a-f]+ .*over its limit of "
                                                  r"256\.0 MiB")

    def test_reconcile_deletes_what_no_container_holds(self):
        n = self.node(capacity="4G", unit="1G")
        n.kubelet.allocate("job", "main", 1)
        n.kubelet.allocate("job2", "main", 2)
        self.assertEqual(len(n.reservations()), 2)
        n.kubelet.remove_pod("job")
        self.assertTrue(wait_for(lambda: len(n.reservations()) == 1), n.log())
        # A reservation the kubelet has not listed yet is kept for the grace period, then goes.
        n.kubelet.allocate_ids(["dev0-u3"])
        self.assertEqual(len(n.reservations()), 2)
        self.assertTrue(wait_for(lambda: len(n.reservations()) == 1), n.log())

    def test_restarts_lose_nothing_and_leave_nothing(self):
        n = self.node(capacity="4G", unit="1G")
        n.kubelet.allocate("job", "main", 2)
        keys = set(n.reservations())
        # The plugin: its reservations are the daemon's; it serves and registers again.
        n.stop_plugin(signal.SIGKILL)
        registered = len(n.kubelet.registrations)
        n.start_plugin()
        self.assertTrue(n.kubelet.wait(lambda: len(n.kubelet.registrations) > registered))
        self.assertEqual(set(n.reservations()), keys)
        # The daemon: units unhealthy while it is down, the reservation there when it is back.
        n.crash_daemon()
        self.assertTrue(n.kubelet.wait(lambda: not any(h == "Healthy" for h in n.kubelet.devices.values())),
                        n.kubelet.devices)
        n.start_daemon()
        self.assertTrue(n.kubelet.wait(lambda: len([h for h in n.kubelet.devices.values() if h == "Healthy"]) == 4))
        self.assertEqual(set(n.reservations()), keys)
        # The kubelet: its sockets go and come back; the plugin registers again.
        registered = len(n.kubelet.registrations)
        n.kubelet.restart()
        self.assertTrue(n.kubelet.wait(lambda: len(n.kubelet.registrations) > registered and n.kubelet.devices), n.log())
        self.assertEqual(set(n.reservations()), keys)
        # And the pod's end still deletes it.
        n.kubelet.remove_pod("job")
        self.assertTrue(wait_for(lambda: not n.reservations()), n.log())

    def test_bad_requests_get_clear_errors_and_hold_nothing(self):
        n = self.node(capacity="4G", unit="1G")
        cases = [
            (["GPU-nope-u1"], "unit 'GPU-nope-u1' is not one gpupool-device-plugin advertises"),
            (["dev0-u1", "dev0-u1"], "names a unit twice"),
            ([], "a container with no units"),
        ]
        for ids, says in cases:
            with self.assertRaises(grpc.RpcError) as e:
                n.kubelet.allocate_ids(ids)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(says, e.exception.details())
        # A daemon that refuses (its GPU's guarantees taken by hand): FAILED_PRECONDITION, its sentence.
        out = n.ctl("reserve", "by-hand", "device=0", "guarantee=3G", "pod=" + POD_B)
        self.assertEqual(out.returncode, 0, out.stderr)
        with self.assertRaises(grpc.RpcError) as e:
            n.kubelet.allocate_ids(["dev0-u0", "dev0-u1"])
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("add up to 5.0 GiB", e.exception.details())
        self.assertEqual(list(n.reservations()), ["by-hand"])
        # The daemon down: Allocate fails saying so.
        n.crash_daemon()
        with self.assertRaises(grpc.RpcError) as e:
            n.kubelet.allocate_ids(["dev0-u0"])
        self.assertIn("cannot reach gpupoold", e.exception.details())

    def test_units_of_two_gpus_are_refused_and_cdi_names_the_gpu(self):
        fake = os.path.join(BUILD, "tests", "libfakecuda.so")
        if not os.path.exists(fake):
            self.skipTest("no fake driver built (make test builds it)")
        tmp = tempfile.mkdtemp(prefix="gpupool-fakecuda-")
        self.addCleanup(shutil.rmtree, tmp, True)
        n = self.node(unit="256M", backend="cuda-vmm",
                      env={"GPUPOOL_LIBCUDA": fake, "FAKECUDA_DEVICES": "2", "FAKECUDA_MEM": "2G", "FAKECUDA_DIR": tmp})
        gpus = sorted({i.rsplit("-u", 1)[0] for i in n.kubelet.healthy()})
        self.assertEqual(len(gpus), 2)
        self.assertTrue(all(g.startswith("GPU-") for g in gpus), gpus)
        with self.assertRaises(grpc.RpcError) as e:
            n.kubelet.allocate_ids([gpus[0] + "-u0", gpus[1] + "-u0"])
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("2 units of gpupool.io/memory on 2 GPUs", e.exception.details())
        self.assertEqual(n.reservations(), {})
        ids, answer = n.kubelet.allocate("job", "main", 3)
        gpu = ids[0].rsplit("-u", 1)[0]
        self.assertTrue(all(i.startswith(gpu) for i in ids), ids)
        self.assertEqual([c.name for c in answer.cdi_devices], ["nvidia.com/gpu=" + gpu])
        (r,) = n.reservations().values()
        self.assertEqual(r["device_uuid"], gpu)


class PodClient:
    """A process in a pod's cgroup that connects with env and allocates size bytes: its result ("0", or
    "-ERRNO sentence") in .result; it holds its block until close()."""

    CODE = """
import ctypes, os, sys
with open(sys.argv[1] + "/cgroup.procs", "w") as f:
    f.write(str(os.getpid()))
lib = ctypes.CDLL(sys.argv[2])
c, p, buf = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.create_string_buffer(600)
r = lib.gpupool_connect(os.environ["GPUPOOL_SOCKET"].encode(), b"in-pod", ctypes.byref(c))
if r == 0:
    r = lib.gpupool_alloc(c, 0, ctypes.c_size_t(int(sys.argv[3])), ctypes.byref(p))
lib.gpupool_last_error(c if r != 0 and c.value else None, buf, 600)
print(r if r == 0 else "%d %s" % (r, buf.value.decode()), flush=True)
for line in sys.stdin:
    if line.strip() == "free":
        print(lib.gpupool_free(c, p), flush=True)
"""

    def __init__(self, cgroup, env, size):
        preload = os.environ.get("GPUPOOL_TEST_PRELOAD", "").strip()
        extra = {"LD_PRELOAD": preload, "ASAN_OPTIONS": "detect_leaks=0"} if preload else {}
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE, cgroup, os.path.join(BUILD, "libgpupool.so.1"),
                                      str(size)], env=dict(os.environ, **env, **extra), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.result = self.proc.stdout.readline().strip()

    def free(self):
        """Frees its block: the process keeps the segment free, for the daemon to ask back."""
        self.proc.stdin.write("free\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(20)
        for f in (self.proc.stdin, self.proc.stdout):
            if not f.closed:
                f.close()


if __name__ == "__main__":
    unittest.main()
