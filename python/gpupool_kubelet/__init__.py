"""gpupool_kubelet: the kubelet's plugins for gpupool, in Python on Debian's python3-grpcio.

gpupool-device-plugin (deviceplugin.py) advertises each GPU's memory that gpupoold can
reserve as units of the extended resource gpupool.io/memory, and turns the units the kubelet
allocates to a container into a reservation in the daemon (daemon.py speaks its protocol),
held to exactly what was scheduled. The kubelet's protocols are compiled at build time from
proto/kubelet/*.proto, written from the published API (Kubernetes v1.31).

Apart from the gpupool package: the plugins load no libgpupool.
"""
