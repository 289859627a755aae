"""gpupool: GPU memory from the node's gpupoold, for Python, PyTorch and CuPy.

Two lines make a framework take its device memory from gpupool (before its first CUDA
allocation)::

    import gpupool
    gpupool.use_with_torch()        # or gpupool.use_with_cupy()

For plain use, gpupool.Client allocates and frees blocks itself; gpupool.status() is what
"gpupoolctl status" shows. The socket is $GPUPOOL_SOCKET (else /run/gpupool/gpupool.sock),
the client's name $GPUPOOL_CLIENT_NAME (else the script's name). docs/frameworks.md in the
gpupool tree has the details and the limits.
"""
import ctypes
import errno
import json
import os
import re
import shutil
import subprocess
import sys
import weakref

from ._lib import GpupoolError, GrowStats, OutOfMemoryError, Stats, error, hook_last_error, lib, library_path
from ._frameworks import use_with_cupy, use_with_torch

__version__ = "0.1.0"
__all__ = [
    "Client",
    "GpupoolError",
    "OutOfMemoryError",
    "grow_stats",
    "last_error",
    "library_path",
    "stats",
    "status",
    "trim",
    "use_with_cupy",
    "use_with_torch",
]


def default_client_name():
    """$GPUPOOL_CLIENT_NAME, else the script's name (not "python3"), made a valid name."""
    name = os.environ.get("GPUPOOL_CLIENT_NAME")
    if name:
        return name
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    base = os.path.basename(argv0) or "python"
    base = re.sub(r"\.py$", "", base)
    return re.sub(r"[^\x21-\x7e]", "_", base)[:63] or "python"


# The smallest block that always has a segment of its own (over 10 MiB): what publish() allocates at least.
_OWN_SEGMENT = 10 * (1 << 20) + 512


class Client:
    """A connection to gpupoold of its own (one per process is usual), with its own pool.

    Pointers are integers: host memory on the host backend, device pointers (CUdeviceptr) in
    this process's CUDA primary context on the cuda backend. Raises GpupoolError (an OSError)
    on failure, OutOfMemoryError for a limit or a full device, always with gpupoold's reason.
    """

    def __init__(self, socket=None, name=None):
        handle = ctypes.c_void_p()
        r = lib.gpupool_connect(
            socket.encode() if socket else None, (name or default_client_name()).encode(), ctypes.byref(handle)
        )
        if r < 0:
            # No handle: the library keeps the reason for this thread (gpupool_last_error(NULL)).
            buf = ctypes.create_string_buffer(1024)
            lib.gpupool_last_error(None, buf, len(buf))
            # It names the socket and what to do, or carries the daemon's reason for refusing.
            why = buf.value.decode(errors="replace") or lib.gpupool_strerror(r).decode()
            raise error(r, why)
        self._handle = handle.value
        self._owned = True

    @classmethod
    def _shared(cls):
        """The framework hooks' handle of this process (not closed by close())."""
        handle = ctypes.c_void_p()
        r = lib.gpupool_hook_client(ctypes.byref(handle))
        if r < 0:
            raise error(r, hook_last_error()[1])
        self = cls.__new__(cls)
        self._handle = handle.value
        self._owned = False
        return self

    def _live(self):
        if not self._handle:
            raise ValueError("gpupool.Client: closed")
        return self._handle

    def last_error(self):
        """gpupoold's sentence about this handle's latest failure ("" when none)."""
        buf = ctypes.create_string_buffer(1024)
        lib.gpupool_last_error(self._live(), buf, len(buf))
        return buf.value.decode(errors="replace")

    def _check(self, r):
        if r < 0:
            raise error(r, self.last_error())

    @property
    def backend(self):
        """The daemon's backend: "host" (pointers are host memory), "cuda" or "cuda-vmm" (device pointers)."""
        return lib.gpupool_backend(self._live()).decode()

    def _host_objects(self, what):
        # A memoryview over a device pointer would crash the process at its first byte.
        if self.backend != "host":
            raise error(
                -errno.EOPNOTSUPP,
                f"gpupool.Client.{what}: named objects on {self.backend} are for the C API so far: the Python "
                "views (PyTorch tensors, CuPy arrays) are not built yet",
            )

    def alloc(self, size, device=0):
        """Allocates size bytes (at least 1) on device; returns the pointer as an int."""
        if size <= 0:
            raise ValueError(f"gpupool.Client.alloc: size {size}: a block is at least 1 byte")
        ptr = ctypes.c_void_p()
        self._check(lib.gpupool_alloc(self._live(), device, size, ctypes.byref(ptr)))
        return ptr.value

    def free(self, ptr):
        """Frees a block from alloc(); nothing (no device work) may still use it."""
        self._check(lib.gpupool_free(self._live(), ptr))

    def stats(self):
        """What this handle holds and has done: live_blocks, live_bytes, cached_bytes, mapped_segments,
        mapped_bytes, round_trips, segments_imported (see gpupool_stats in gpupool.h)."""
        st = Stats()
        self._check(lib.gpupool_stats(self._live(), ctypes.byref(st)))
        return st.as_dict()

    def grow_stats(self):
        """With GPUPOOL_SEGMENTS=grow, the granules under the process's ranges: granules_held,
        granules_free, granules_mapped, granules_unmapped (see gpupool_grow_stats in gpupool.h)."""
        st = GrowStats()
        self._check(lib.gpupool_grow_stats(self._live(), ctypes.byref(st)))
        return st.as_dict()

    def trim(self):
        """Gives every segment the process holds empty back to the daemon."""
        self._check(lib.gpupool_trim(self._live()))

    def publish(self, name, data, device=0):
        """Publishes a copy of data (anything with the buffer protocol: bytes, an array) as the
        named object name, which outlives this process until unpublished (gpupool_publish in
        gpupool.h). Host backend: the copy is made once, here; attaching it copies nothing."""
        self._host_objects("publish")
        view = memoryview(data).cast("B")
        if not view.nbytes:
            raise ValueError(f"gpupool.Client.publish: {name}: an object is at least 1 byte")
        # A published block has its segment to itself: over 10 MiB, a block always has.
        ptr = self.alloc(max(view.nbytes, _OWN_SEGMENT), device)
        try:
            ctypes.memmove(ptr, (ctypes.c_char * view.nbytes).from_buffer_copy(view), view.nbytes)
            self._check(lib.gpupool_publish(self._live(), name.encode(), ptr, view.nbytes))
        except BaseException:
            self.free(ptr)
            raise
        # Attached here read-only by the publish: this process does not need it mapped.
        self._check(lib.gpupool_detach(self._live(), ptr))

    def attach(self, name):
        """Maps the named object name read-only, without a copy: a read-only memoryview of its
        bytes, detached when the view (and every array made over it) is gone. Host backend."""
        self._host_objects("attach")
        ptr, size = ctypes.c_void_p(), ctypes.c_size_t()
        self._check(lib.gpupool_attach(self._live(), name.encode(), ctypes.byref(ptr), ctypes.byref(size)))
        buf = (ctypes.c_char * size.value).from_address(ptr.value)
        view = memoryview(buf).cast("B").toreadonly()
        handle = self._handle
        weakref.finalize(buf, lambda: lib.gpupool_detach(handle, ptr.value) if self._handle == handle else None)
        return view

    def unpublish(self, name):
        """Ends the named object name: its memory goes once the last process has detached it."""
        self._check(lib.gpupool_unpublish(self._live(), name.encode()))

    def close(self):
        """Gives everything back (every pointer is invalid afterwards). Idempotent."""
        if self._handle and self._owned:
            lib.gpupool_disconnect(self._handle)
        self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None) and getattr(self, "_owned", False) and lib is not None:
            self.close()


def stats():
    """Stats of the handle PyTorch's and CuPy's hooks share in this process (connecting it)."""
    return Client._shared().stats()


def grow_stats():
    """Client.grow_stats() of the handle PyTorch's and CuPy's hooks share in this process."""
    return Client._shared().grow_stats()


def trim():
    """Gives the hooks' empty segments back to the daemon (what torch.cuda.empty_cache() cannot)."""
    Client._shared().trim()


def last_error():
    """(errno, sentence) of this thread's latest failed hook call; (0, "") if the latest worked."""
    err, msg = hook_last_error()
    return -err, msg


def _gpupoolctl():
    """$GPUPOOL_CTL, else the gpupoolctl beside the library this package loaded (a checkout's
    build/, or where "make install" put both), else the one on PATH."""
    if os.environ.get("GPUPOOL_CTL"):
        return os.environ["GPUPOOL_CTL"]
    loaded = library_path()
    if os.path.isabs(loaded):
        beside = os.path.join(os.path.dirname(loaded), "gpupoolctl")
        if os.access(beside, os.X_OK):
            return beside
    found = shutil.which("gpupoolctl")
    if not found:
        raise FileNotFoundError(
            f"gpupool.status(): no gpupoolctl beside {loaded} nor on PATH (install gpupool, or set $GPUPOOL_CTL)"
        )
    return found


def status(socket=None):
    """The daemon's state, as "gpupoolctl --json status" prints it: devices, tenants, clients."""
    cmd = [_gpupoolctl(), "--json"]
    if socket:
        cmd += ["--socket", socket]
    cmd.append("status")
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise GpupoolError(errno.EIO, f"gpupoolctl status: {run.stderr.strip() or 'exit status %d' % run.returncode}")
    return json.loads(run.stdout)


def publish(name, data):
    """Client.publish() on the handle the hooks share in this process: a copy of data (bytes,
    a NumPy array; anything with the buffer protocol) becomes the named object name."""
    Client._shared().publish(name, data)


def attach(name, dtype=None, shape=None):
    """Client.attach() on the handle the hooks share: the named object name, read-only and
    without a copy; with dtype (and shape), as a read-only NumPy array over it (host backend)."""
    view = Client._shared().attach(name)
    if dtype is None:
        return view
    import numpy

    array = numpy.frombuffer(view, dtype=dtype)
    return array.reshape(shape) if shape is not None else array


def unpublish(name):
    """Client.unpublish() on the handle the hooks share."""
    Client._shared().unpublish(name)
