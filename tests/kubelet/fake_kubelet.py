"""A kubelet as the device plugin meets it, for the tests: the Registration service on
kubelet.sock in its device plugin directory, a ListAndWatch stream read from each plugin that
registers, the device manager's choice (GetPreferredAllocation, then Allocate, one container
at a time), and the PodResources List of what it allocated, on its own socket. It speaks the
protocols of proto/kubelet/, as the real kubelet does; what it decides is far simpler (no
scheduler, no checkpoint, no topology) and the tests say so.
"""
import concurrent.futures
import os
import threading

import grpc

import deviceplugin_pb2 as dp
import deviceplugin_pb2_grpc as dp_grpc
import podresources_pb2 as pr
import podresources_pb2_grpc as pr_grpc


class FakeKubelet(dp_grpc.RegistrationServicer, pr_grpc.PodResourcesListerServicer):
    def __init__(self, plugin_dir, pod_resources_path):
        self.dir = plugin_dir
        self.pod_resources_path = pod_resources_path
        self.lock = threading.Condition()
        self.registrations = []         # RegisterRequests, in order
        self.devices = {}               # the latest ListAndWatch list: ID -> health
        self.updates = 0                # ListAndWatch answers read
        self.allocated = {}             # (pod, container) -> device IDs
        self.servers = []
        self.channel = None
        self.watcher = None

    # --- serving --------------------------------------------------------------------------

    def start(self):
        os.makedirs(self.dir, exist_ok=True)
        reg = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        dp_grpc.add_RegistrationServicer_to_server(self, reg)
        reg.add_insecure_port("unix://" + os.path.join(self.dir, "kubelet.sock"))
        res = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        pr_grpc.add_PodResourcesListerServicer_to_server(self, res)
        res.add_insecure_port("unix://" + self.pod_resources_path)
        reg.start()
        res.start()
        self.servers = [reg, res]

    def stop(self):
        for s in self.servers:
            s.stop(grace=0).wait()
        self.servers = []
        if self.channel:
            self.channel.close()
            self.channel = None

    def restart(self):
        """As a kubelet restart does: every socket in its directory goes, its own comes back anew."""
        self.stop()
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            if not os.path.isdir(path):
                os.unlink(path)
        with self.lock:
            self.devices = {}
        self.start()

    def Register(self, request, context):
        with self.lock:
            self.registrations.append(request)
            self.lock.notify_all()
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unsupported version " + request.version)
        # The real kubelet dials the plugin's endpoint after answering; so does this one.
        threading.Thread(target=self._watch, args=(request.endpoint,), daemon=True).start()
        return dp.Empty()

    def _watch(self, endpoint):
        channel = grpc.insecure_channel("unix://" + os.path.join(self.dir, endpoint))
        self.channel = channel
        self.plugin = dp_grpc.DevicePluginStub(channel)
        try:
            for answer in self.plugin.ListAndWatch(dp.Empty()):
                with self.lock:
                    self.devices = {d.ID: d.health for d in answer.devices}
                    self.updates += 1
                    self.lock.notify_all()
        except grpc.RpcError:
            pass

    def List(self, request, context):
        out = pr.ListPodResourcesResponse()
        with self.lock:
            pods = {}
            for (pod, container), ids in self.allocated.items():
                pods.setdefault(pod, []).append((container, ids))
        for pod, containers in pods.items():
            p = out.pod_resources.add(name=pod, namespace="default")
            for container, ids in containers:
                c = p.containers.add(name=container)
                c.devices.add(resource_name="gpupool.io/memory", device_ids=ids)
        return out

    # --- what the tests do ----------------------------------------------------------------

    def wait(self, predicate, timeout=20):
        """Waits until predicate() (called with the lock held) is true; returns whether it was."""
        with self.lock:
            return self.lock.wait_for(predicate, timeout)

    def healthy(self):
        with self.lock:
            return sorted(i for i, h in self.devices.items() if h == "Healthy")

    def allocate(self, pod, container, n):
        """The device manager's way: n free healthy units, the plugin's preference among them, Allocate."""
        with self.lock:
            taken = {i for ids in self.allocated.values() for i in ids}
            free = [i for i, h in self.devices.items() if h == "Healthy" and i not in taken]
        pref = self.plugin.GetPreferredAllocation(dp.PreferredAllocationRequest(container_requests=[
            dp.ContainerPreferredAllocationRequest(available_deviceIDs=free, allocation_size=n)]), timeout=10)
        ids = list(pref.container_responses[0].deviceIDs)
        if len(ids) != n:
            raise AssertionError("the plugin preferred %d units of %d asked: %s" % (len(ids), n, ids))
        answer = self.allocate_ids(ids)
        with self.lock:
            self.allocated[(pod, container)] = ids
        return ids, answer

    def allocate_ids(self, *containers):
        """Allocate as asked, one list of device IDs per container; the AllocateResponse, or grpc.RpcError."""
        req = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids) for ids in containers])
        answer = self.plugin.Allocate(req, timeout=20)
        return answer.container_responses[0] if len(containers) == 1 else answer

    def remove_pod(self, pod):
        with self.lock:
            for k in [k for k in self.allocated if k[0] == pod]:
                del self.allocated[k]
