"""gpupool-device-plugin: GPU memory as the kubelet's extended resource gpupool.io/memory.

Each GPU's memory that gpupoold can still promise (its capacity less the config's tenants'
guarantees) is advertised as units of --unit bytes, each unit a device of the device plugin
API (v1beta1) named "<GPU>-u<N>". The scheduler counts units; the kubelet picks which
(GetPreferredAllocation packs a container's units on one GPU) and calls Allocate, which turns
them into a reservation in the daemon: a guarantee and a limit of units x --unit on that GPU,
bound by a token to the first pod whose process presents it ($GPUPOOL_RESERVATION, which the
answer sets with $GPUPOOL_SOCKET, the socket's directory mounted, and the GPU itself).
Reservations whose units no container holds any more (PodResources List) are deleted.

Everything the plugin decides is kept in the daemon (its reservations, keyed by the units they
hold): a plugin, daemon or kubelet restart loses none and leaves none behind.
"""
import argparse
import concurrent.futures
import hashlib
import logging
import os
import re
import secrets
import signal
import sys
import threading
import time

import grpc

import deviceplugin_pb2 as dp
import deviceplugin_pb2_grpc as dp_grpc
import podresources_pb2 as pr
import podresources_pb2_grpc as pr_grpc
from gpupool_kubelet.daemon import DEFAULT_SOCKET, Daemon, DaemonError

RESOURCE = "gpupool.io/memory"
API_VERSION = "v1beta1"
ENDPOINT = "gpupool.sock"
KEY_PREFIX = "dp-"
UNITS_MAX = 4096                # per GPU: ListAndWatch answers stay far below the kubelet's 4 MiB
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

log = logging.getLogger("gpupool-device-plugin")


def parse_size(text):
    """A size as gpupoolctl takes it: 512M, 1G, 1.5GiB (powers of 1024)."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError("'%s' is not a size (e.g. 512M, 1G)" % text)
    value = int(float(m.group(1)) * SIZE_UNITS[m.group(2).upper()])
    if value < (2 << 20):
        raise argparse.ArgumentTypeError("'%s' is less than one 2 MiB segment" % text)
    return value


def unit_key(ids):
    """The reservation's key of a container's units: the same units, the same key, whoever asks."""
    return KEY_PREFIX + hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:24]


class Gpus:
    """What the daemon can promise on each GPU, as units, read again at every poll."""

    def __init__(self, daemon, unit):
        self.daemon = daemon
        self.unit = unit
        self.by_name = {}       # the name in device IDs (its UUID, else "dev<index>") -> (index, uuid or None)
        self.units = {}         # name -> units advertised
        self.capacity = {}      # name -> the daemon's capacity there (bytes)
        self.up = False

    @staticmethod
    def name_of(index, uuid):
        return uuid if uuid else "dev%d" % index

    def read(self):
        """The daemon's status now, or the DaemonError that says why there is none (no lock needed)."""
        try:
            return self.daemon.status()
        except DaemonError as e:
            return e

    def apply(self, st):
        """Takes a read(): the units of each GPU from its capacity and the config's guarantees there.
        Returns whether what is advertised changed."""
        before = (self.up, dict(self.units))
        if isinstance(st, DaemonError):
            if self.up:
                log.warning("gpupoold is unreachable: units unhealthy until it is back (%s)", st)
            self.up = False
            return before != (self.up, self.units)
        by_name, units, capacity = {}, {}, {}
        for d in st.devices:
            name = self.name_of(d.index, d.uuid if d.HasField("uuid") else None)
            kept = 0
            for t in st.tenants:
                on = re.search(r"(?:^| )device=([0-9]+)(?: |$)", t.rules)
                if not on or int(on.group(1)) == d.index:
                    kept += t.guarantee_bytes
            by_name[name] = (d.index, d.uuid if d.HasField("uuid") else None)
            units[name] = min(UNITS_MAX, max(0, d.total_bytes - kept) // self.unit)
            capacity[name] = d.total_bytes
        if not self.up:
            log.info("gpupoold at %s: %s", self.daemon.path,
                     ", ".join("%s: %d units" % (n, u) for n, u in units.items()) or "no devices")
        self.by_name, self.units, self.capacity, self.up = by_name, units, capacity, True
        return before != (self.up, self.units)

    def devices(self, known):
        """The device list for ListAndWatch: every unit of every GPU, healthy while the daemon is up and the
        GPU there; units advertised before and gone now stay listed as unhealthy (the kubelet then fails
        pods that would land on them rather than place them)."""
        out = []
        for name, n in self.units.items():
            for k in range(n):
                out.append(dp.Device(ID="%s-u%d" % (name, k), health=HEALTHY if self.up else UNHEALTHY))
        listed = {d.ID for d in out}
        out.extend(dp.Device(ID=i, health=UNHEALTHY) for i in sorted(known - listed))
        return out

    def gpu_of(self, device_id):
        """The GPU name of a unit's device ID, or None for an ID this plugin does not make."""
        m = re.fullmatch(r"(.+)-u([0-9]+)", device_id)
        return m.group(1) if m and m.group(1) in self.by_name else None


class Plugin(dp_grpc.DevicePluginServicer):
    def __init__(self, args, daemon):
        self.args = args
        self.daemon = daemon
        self.gpus = Gpus(daemon, args.unit)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.generation = 0     # bumped at every change of the device list
        self.known = set()      # every device ID advertised since start
        self.stopping = False
        self.seen = {}          # our reservation key -> when this plugin first saw it (monotonic s)
        self.pending = set()    # keys whose Allocate has not answered yet

    # --- the device list -------------------------------------------------------------------

    def refresh(self):
        st = self.gpus.read()           # outside the lock: a slow daemon holds up no ListAndWatch
        with self.lock:
            if self.gpus.apply(st):
                self.known |= {d.ID for d in self.gpus.devices(set())}
                self.generation += 1
                self.changed.notify_all()

    def GetDevicePluginOptions(self, request, context):
        return dp.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request, context):
        sent = -1
        while context.is_active():
            with self.lock:
                while self.generation == sent and not self.stopping and context.is_active():
                    self.changed.wait(1.0)
                if self.stopping:
                    return
                sent = self.generation
                devices = self.gpus.devices(self.known)
            yield dp.ListAndWatchResponse(devices=devices)

    def PreStartContainer(self, request, context):
        return dp.PreStartContainerResponse()

    # --- allocation ------------------------------------------------------------------------

    def GetPreferredAllocation(self, request, context):
        out = dp.PreferredAllocationResponse()
        for c in request.container_requests:
            by_gpu = {}
            for i in c.available_deviceIDs:
                g = self.gpus.gpu_of(i)
                if g:
                    by_gpu.setdefault(g, []).append(i)
            must = list(c.must_include_deviceIDs)
            must_gpus = {self.gpus.gpu_of(i) for i in must}
            # One GPU: the one the required units are on, else the one with the fewest free units
            # that fit (the others keep room for larger containers).
            fits = [g for g, ids in by_gpu.items() if len(ids) >= c.allocation_size and (not must or must_gpus == {g})]
            pick = []
            if fits:
                g = min(fits, key=lambda g: (len(by_gpu[g]), g))
                rest = [i for i in sorted(by_gpu[g], key=self._unit_number) if i not in must]
                pick = must + rest[:max(0, c.allocation_size - len(must))]
            out.container_responses.add(deviceIDs=pick)
        return out

    @staticmethod
    def _unit_number(device_id):
        m = re.search(r"-u([0-9]+)$", device_id)
        return int(m.group(1)) if m else 0

    def _container(self, ids, context):
        """One container's answer: its reservation made (or found), what it gets."""
        if not ids:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an Allocate request for a container with no units")
        gpus = {}
        for i in ids:
            g = self.gpus.gpu_of(i)
            if g is None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              "unit '%s' is not one gpupool-device-plugin advertises (%s are '<GPU>-u<N>')" %
                              (i[:80], RESOURCE))
            gpus.setdefault(g, []).append(i)
        if len(set(ids)) != len(ids):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an Allocate request names a unit twice")
        if len(gpus) > 1:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "%d units of %s on %d GPUs (%s): a container's GPU memory is on one GPU; ask for at most "
                          "what one GPU has, or let the kubelet use GetPreferredAllocation" %
                          (len(ids), RESOURCE, len(gpus), ", ".join(sorted(gpus))))
        (gpu,) = gpus
        index, uuid = self.gpus.by_name[gpu]
        key = unit_key(ids)
        token = secrets.token_urlsafe(24)
        size = len(ids) * self.args.unit
        # With --burst its pods may use what no other tenant holds or is guaranteed, up to the GPU.
        limit = max(size, self.gpus.capacity.get(gpu, size)) if self.args.burst else size
        try:
            self.daemon.put(key, time.time_ns(), size, limit, device=index, device_uuid=uuid, token=token)
        except DaemonError as e:
            log.warning("Allocate of %d units on %s refused: %s", len(ids), gpu, e)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "gpupoold refused %s of %s on GPU %s: %s" %
                          (fmt_size(size), RESOURCE, gpu, e))
        with self.lock:
            self.pending.add(key)       # the reconcile leaves it alone while its Allocate runs
        try:
            why = self._ask_back(key, index, size)
        finally:
            with self.lock:
                self.pending.discard(key)
                self.seen[key] = time.monotonic()   # and for --grace after, until the kubelet lists it
        if why:
            try:
                self.daemon.delete(key)
            except DaemonError:
                pass                # the reconcile deletes it: no container holds its units
            log.warning("Allocate of %d units on %s failed: %s", len(ids), gpu, why)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "GPU %s: %s" % (gpu, why))
        log.info("reservation %s: %d units (%s) on %s for the container that presents its token", key, len(ids),
                 fmt_size(size), gpu)
        sock_dir = self.args.container_socket_dir
        resp = dp.ContainerAllocateResponse()
        resp.envs["GPUPOOL_SOCKET"] = os.path.join(sock_dir, os.path.basename(self.args.socket))
        resp.envs["GPUPOOL_RESERVATION"] = token
        resp.mounts.add(container_path=sock_dir, host_path=self.args.host_socket_dir, read_only=True)
        if uuid and self.args.device_nodes:
            for path in device_nodes(uuid):
                resp.devices.add(container_path=path, host_path=path, permissions="rw")
        elif uuid:
            resp.cdi_devices.add(name="%s=%s" % (self.args.cdi_kind, uuid))
        return resp

    def _ask_back(self, key, index, size):
        """Whether the new reservation's guarantee is there to lease: where others hold it (burst, or
        tenants past their guarantee), asks them for what they keep free (ladder step 3) and waits up to
        --burst-wait. Returns None, or why it is not there."""
        def state():
            rs = {r.key: r for r in self.daemon.reservations()}
            return rs.get(key), rs, self.daemon.status()

        end = time.monotonic() + self.args.burst_wait
        asked = False
        while True:
            try:
                mine, rs, st = state()
            except DaemonError as e:
                return "gpupoold: %s" % e
            if mine is None:
                return "the reservation was deleted while it waited for its memory"
            log.debug("reservation %s: %s of %s available", key, mine.available_bytes if mine.HasField("available_bytes")
                      else "?", size)
            if not mine.HasField("available_bytes") or mine.available_bytes >= size:
                return None
            over = {r.key: r.reserved_bytes - r.guarantee_bytes for r in rs.values()
                    if r.key != key and r.device == index and r.reserved_bytes > r.guarantee_bytes}
            for t in st.tenants:
                held = t.reserved_bytes[index] if index < len(t.reserved_bytes) else 0
                if held > t.guarantee_bytes:
                    over[t.name] = held - t.guarantee_bytes
            holders = ["%s %s (%s over its guarantee)" % ("reservation" if k in rs else "tenant", k, fmt_size(b))
                       for k, b in sorted(over.items(), key=lambda kv: -kv[1])]
            if not asked:
                for k in over:
                    self._flush(k, index)
                asked = True
            if time.monotonic() >= end:
                return ("only %s of the reservation's %s is free to lease: the rest is held by %s, which kept it in use "
                        "for %g s after being asked for what they keep free" %
                        (fmt_size(mine.available_bytes), fmt_size(size), ", ".join(holders) or "other processes",
                         self.args.burst_wait))
            time.sleep(0.1)

    def _flush(self, tenant, index):
        try:
            self.daemon.flush_tenant(tenant, index)
        except DaemonError as e:
            log.debug("flush of %s on device %d: %s", tenant, index, e)

    def Allocate(self, request, context):
        out = dp.AllocateResponse()
        for c in request.container_requests:
            out.container_responses.append(self._container(list(c.devices_ids), context))
        return out

    # --- reconciling with the kubelet ------------------------------------------------------

    def reconcile(self, pod_resources_path):
        """Deletes this plugin's reservations that no container's units name any more. Returns how many."""
        try:
            with grpc.insecure_channel("unix://" + pod_resources_path) as ch:
                listed = pr_grpc.PodResourcesListerStub(ch).List(pr.ListPodResourcesRequest(), timeout=10)
        except grpc.RpcError as e:
            log.debug("PodResources unreachable (%s): nothing deleted", e.code())
            return 0
        held = set()
        for pod in listed.pod_resources:
            for c in pod.containers:
                for d in c.devices:
                    if d.resource_name == RESOURCE and d.device_ids:
                        held.add(unit_key(list(d.device_ids)))
        try:
            ours = [r for r in self.daemon.reservations() if r.key.startswith(KEY_PREFIX)]
        except DaemonError:
            return 0
        now, deleted = time.monotonic(), 0
        with self.lock:
            for r in ours:
                self.seen.setdefault(r.key, now)
            self.seen = {k: v for k, v in self.seen.items() if k in {r.key for r in ours}}
        for r in ours:
            # A reservation Allocate made moments ago may not be in the kubelet's list yet.
            with self.lock:
                young = r.key in self.pending or now - self.seen.get(r.key, now) < self.args.grace
            if r.key in held or young:
                continue
            try:
                if self.daemon.delete(r.key):
                    deleted += 1
                    log.info("reservation %s deleted: no container holds its units any more", r.key)
            except DaemonError as e:
                log.warning("reservation %s: delete refused: %s", r.key, e)
        return deleted


def fmt_size(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= scale:
            return "%.1f %s" % (n / scale, unit)
    return "%d B" % n


def device_nodes(uuid):
    """The NVIDIA device nodes of a GPU (by UUID, from the driver's /proc), and the control nodes."""
    nodes = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    base = "/proc/driver/nvidia/gpus"
    try:
        for bus in os.listdir(base):
            with open(os.path.join(base, bus, "information")) as f:
                info = f.read()
            if uuid in info:
                m = re.search(r"Device Minor:\s*([0-9]+)", info)
                if m:
                    nodes.insert(0, "/dev/nvidia%s" % m.group(1))
    except OSError:
        pass
    return [n for n in nodes if os.path.exists(n)]


class Server:
    """The plugin's gRPC server on its socket in the kubelet's directory, registered with the kubelet."""

    def __init__(self, args, plugin):
        self.args = args
        self.plugin = plugin
        self.path = os.path.join(args.device_plugin_dir, ENDPOINT)
        self.kubelet = os.path.join(args.device_plugin_dir, "kubelet.sock")
        self.server = None
        self.kubelet_id = None

    def start(self):
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
        dp_grpc.add_DevicePluginServicer_to_server(self.plugin, self.server)
        self.server.add_insecure_port("unix://" + self.path)
        self.server.start()

    def stop(self):
        if self.server:
            self.server.stop(grace=1).wait()
            self.server = None

    def register(self):
        """Registers with the kubelet; returns whether it took it."""
        try:
            st = os.stat(self.kubelet)
            with grpc.insecure_channel("unix://" + self.kubelet) as ch:
                dp_grpc.RegistrationStub(ch).Register(dp.RegisterRequest(
                    version=API_VERSION, endpoint=ENDPOINT, resource_name=RESOURCE,
                    options=dp.DevicePluginOptions(get_preferred_allocation_available=True)), timeout=10)
        except (OSError, grpc.RpcError) as e:
            detail = e.details() if isinstance(e, grpc.RpcError) else str(e)
            log.warning("cannot register with the kubelet at %s: %s", self.kubelet, detail)
            return False
        self.kubelet_id = (st.st_dev, st.st_ino)
        log.info("registered %s with the kubelet at %s (endpoint %s)", RESOURCE, self.kubelet, self.path)
        return True

    def kubelet_restarted(self):
        """The kubelet's restart removes every socket in its directory and makes its own anew."""
        try:
            st = os.stat(self.kubelet)
        except OSError:
            return True
        return not os.path.exists(self.path) or (st.st_dev, st.st_ino) != self.kubelet_id


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="gpupool-device-plugin",
        description="Advertise each GPU's memory in gpupoold as units of the extended resource %s, and hold "
                    "each container to the units it was given (a reservation in the daemon)." % RESOURCE,
        epilog="A container asks for it as resources.limits: {%s: N}; it gets $GPUPOOL_SOCKET, $GPUPOOL_RESERVATION, "
               "the socket's directory and its GPU. docs/operations.md, 'Kubernetes: scheduling by memory'." % RESOURCE)
    p.add_argument("--socket", default=os.environ.get("GPUPOOL_SOCKET") or DEFAULT_SOCKET,
                   help="gpupoold's socket (default: $GPUPOOL_SOCKET, else %(default)s)")
    p.add_argument("--device-plugin-dir", default="/var/lib/kubelet/device-plugins",
                   help="the kubelet's device plugin directory (default %(default)s)")
    p.add_argument("--pod-resources", default="/var/lib/kubelet/pod-resources/kubelet.sock",
                   help="the kubelet's PodResources socket (default %(default)s)")
    p.add_argument("--unit", type=parse_size, default=1 << 30,
                   help="bytes of GPU memory per unit of %s (default 1G)" % RESOURCE)
    p.add_argument("--host-socket-dir", default=None,
                   help="the socket's directory on the node, mounted into containers (default: --socket's directory)")
    p.add_argument("--container-socket-dir", default="/run/gpupool",
                   help="where containers find it (default %(default)s)")
    p.add_argument("--cdi-kind", default="nvidia.com/gpu",
                   help="the CDI kind of the NVIDIA container toolkit's GPUs, given as KIND=UUID (default %(default)s)")
    p.add_argument("--device-nodes", action="store_true",
                   help="give the GPU's device nodes (/dev/nvidiaN and the control nodes) instead of its CDI name")
    p.add_argument("--burst", action="store_true",
                   help="let a container use memory of its GPU no one else holds or is guaranteed, beyond its units "
                        "(off by default): docs/operations.md says what burst can and cannot promise")
    p.add_argument("--burst-wait", type=float, default=10.0,
                   help="seconds Allocate waits for others to give back memory its units need (default %(default)s)")
    p.add_argument("--poll", type=float, default=2.0, help="seconds between reads of the daemon (default %(default)s)")
    p.add_argument("--reconcile", type=float, default=5.0,
                   help="seconds between PodResources reconciles (default %(default)s)")
    p.add_argument("--grace", type=float, default=60.0,
                   help="seconds a new reservation is kept before the kubelet must list its units (default %(default)s)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = p.parse_args(argv)
    if args.host_socket_dir is None:
        args.host_socket_dir = os.path.dirname(os.path.abspath(args.socket))
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="gpupool-device-plugin %(levelname)s: %(message)s")
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    daemon = Daemon(args.socket, name="gpupool-device-plugin")
    plugin = Plugin(args, daemon)
    plugin.refresh()
    server = Server(args, plugin)
    registered = False
    next_reconcile = 0.0
    while not stop.is_set():
        if not registered or server.kubelet_restarted():
            if registered:
                log.info("the kubelet restarted: serving and registering again")
            server.stop()
            server.start()
            registered = server.register()
        plugin.refresh()
        if time.monotonic() >= next_reconcile:
            plugin.reconcile(args.pod_resources)
            next_reconcile = time.monotonic() + args.reconcile
        stop.wait(args.poll if registered else 1.0)
    with plugin.lock:
        plugin.stopping = True
        plugin.changed.notify_all()
    server.stop()
    try:
        os.unlink(server.path)
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
