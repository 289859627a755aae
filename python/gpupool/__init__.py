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
    "DeviceBuffer",
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

    def publish(self, name, data, device=None, readers=None):
        """Publishes a copy of data as the named object name, which outlives this process until
        unpublished (gpupool_publish_to in gpupool.h); readers ("*", or tenants' names, a
        list or a comma-separated string) may attach it besides the publisher's uid and tenant.
        Host backend: anything with the buffer protocol (bytes, a NumPy array). cuda and
        cuda-vmm: a contiguous PyTorch CUDA tensor or CuPy array, copied on its device (device:
        the CUDA ordinal, default the data's). The copy is made once, here; attaching it copies
        nothing."""
        if self.backend == "host":
            view = memoryview(data).cast("B")
            nbytes, device = view.nbytes, device or 0
        else:
            nbytes, device = _device_nbytes(data, device)
        if not nbytes:
            raise ValueError(f"gpupool.Client.publish: {name}: an object is at least 1 byte")
        # A published block has its segment to itself: over 10 MiB, a block always has.
        ptr = self.alloc(max(nbytes, _OWN_SEGMENT), device)
        try:
            if self.backend == "host":
                ctypes.memmove(ptr, (ctypes.c_char * nbytes).from_buffer_copy(view), nbytes)
            else:
                _device_copy(ptr, data, nbytes)
            # On a GPU the library waits for the device's work before the memory becomes read-only.
            if readers is not None and not isinstance(readers, str):
                readers = ",".join(readers)
            self._check(lib.gpupool_publish_to(self._live(), name.encode(), ptr, nbytes,
                                               readers.encode() if readers else None))
        except BaseException:
            self.free(ptr)
            raise
        # Attached here read-only by the publish: this process does not need it mapped.
        self._check(lib.gpupool_detach(self._live(), ptr))

    def attach(self, name, publisher=None):
        """Maps the named object name without a copy, detached when what this returns (and every
        array made over it) is gone: this uid's object of that name (names are each publisher
        uid's), else its tenant's; with publisher (a uid), that uid's. Host backend: a read-only
        memoryview of its bytes. cuda and cuda-vmm: a DeviceBuffer, its bytes in device memory
        (__cuda_array_interface__; read-only on cuda-vmm, where a write is an illegal address)."""
        ptr, size = ctypes.c_void_p(), ctypes.c_size_t()
        backend = self.backend
        if publisher is None:
            self._check(lib.gpupool_attach(self._live(), name.encode(), ctypes.byref(ptr), ctypes.byref(size)))
        else:
            self._check(lib.gpupool_attach_of(self._live(), name.encode(), int(publisher), ctypes.byref(ptr),
                                              ctypes.byref(size)))
        handle = self._handle

        def detach(ptr=ptr.value):
            if self._handle == handle:
                lib.gpupool_detach(handle, ptr)

        if backend != "host":
            buf = DeviceBuffer(ptr.value, size.value, backend == "cuda-vmm")
            weakref.finalize(buf, detach)
            return buf
        buf = (ctypes.c_char * size.value).from_address(ptr.value)
        view = memoryview(buf).cast("B").toreadonly()
        weakref.finalize(buf, detach)
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


def publish(name, data, readers=None):
    """Client.publish() on the handle the hooks share in this process: a copy of data (host:
    anything with the buffer protocol; a GPU backend: a PyTorch CUDA tensor or CuPy array)
    becomes the named object name, for readers too ("*", or tenants' names)."""
    Client._shared().publish(name, data, readers=readers)


def attach(name, dtype=None, shape=None, like=None, publisher=None):
    """Client.attach() on the handle the hooks share: the named object name (of uid publisher,
    where given), without a copy.
    Host backend: with dtype (and shape), a read-only NumPy array over it. cuda and cuda-vmm:
    with dtype (and shape), a PyTorch tensor (like="torch"), a CuPy array (like="cupy"), or
    where like is None whichever of the two this process has imported, else a DeviceBuffer;
    neither framework has read-only arrays, so theirs look writable (on cuda-vmm a write is an
    illegal address that ends the process's CUDA context; on cuda it changes the object)."""
    client = Client._shared()
    numpy = None
    if dtype is not None and client.backend == "host":
        # Before attaching: a refusal leaves nothing attached.
        try:
            import numpy
        except ImportError as e:
            raise ImportError(
                f"gpupool.attach({name!r}, dtype=...) on the host backend gives a NumPy array, and NumPy is not "
                "installed (pip install numpy); attach() without dtype gives a read-only memoryview") from e
    view = client.attach(name, publisher)
    if dtype is None:
        return view
    if isinstance(view, DeviceBuffer):
        return view.as_array(dtype, shape, like)
    array = numpy.frombuffer(view, dtype=dtype)
    return array.reshape(shape) if shape is not None else array


class DeviceBuffer:
    """A named object attached on a GPU: nbytes of device memory at ptr (a CUdeviceptr in this
    process's primary context), read-only where the backend enforces it (cuda-vmm). It has
    __cuda_array_interface__ (version 3, bytes), for Numba and any consumer that honours its
    read-only flag; as_array() gives a typed PyTorch tensor or CuPy array. Detached once it,
    and everything made over it, is gone."""

    def __init__(self, ptr, nbytes, readonly, typestr="|u1", shape=None, base=None):
        self.ptr, self.nbytes, self.readonly = ptr, nbytes, readonly
        self._base = base       # the attached buffer a typed view keeps alive
        self.__cuda_array_interface__ = {
            "shape": tuple(shape) if shape is not None else (nbytes,),
            "typestr": typestr,
            "data": (ptr, readonly),
            "version": 3,
            "strides": None,
            "stream": None,     # published and waited for: nothing to synchronize with
        }

    def view(self, dtype, shape=None, writable_flag=False):
        """The bytes as dtype (a name such as "float16", a NumPy or PyTorch dtype), of shape
        (default: as many as fit)."""
        typestr, itemsize = _typestr(dtype)
        shape = tuple(shape) if shape is not None else (self.nbytes // itemsize,)
        needed = itemsize
        for n in shape:
            needed *= n
        if needed > self.nbytes:
            raise ValueError(f"gpupool: shape {shape} of {dtype} needs {needed} bytes; the object has {self.nbytes}")
        # PyTorch refuses a read-only flag outright; CuPy has no read-only arrays either.
        return DeviceBuffer(self.ptr, needed, self.readonly and not writable_flag, typestr, shape, self._base or self)

    def as_array(self, dtype, shape=None, like=None):
        """A PyTorch tensor or CuPy array over the bytes as dtype (see gpupool.attach)."""
        like = like or ("torch" if "torch" in sys.modules else "cupy" if "cupy" in sys.modules else None)
        if like is None:
            return self.view(dtype, shape)
        if like == "torch":
            import torch

            return torch.as_tensor(self.view(dtype, shape, writable_flag=True))
        if like == "cupy":
            import cupy

            return cupy.asarray(self.view(dtype, shape, writable_flag=True))
        raise ValueError(f"gpupool: like={like!r}: 'torch', 'cupy' or None")


# The array interface's type strings (little-endian) of the element types the frameworks share.
_TYPESTRS = {
    "bool": "|b1", "int8": "|i1", "uint8": "|u1", "int16": "<i2", "uint16": "<u2", "int32": "<i4", "uint32": "<u4",
    "int64": "<i8", "uint64": "<u8", "float16": "<f2", "float32": "<f4", "float64": "<f8", "complex64": "<c8",
    "complex128": "<c16",
}


def _typestr(dtype):
    """(typestr, itemsize) of dtype: a name, a NumPy dtype, or a PyTorch one (torch.float16)."""
    name = str(getattr(dtype, "name", None) or dtype).replace("torch.", "")
    name = {"half": "float16", "float": "float32", "double": "float64", "int": "int32", "long": "int64"}.get(name, name)
    if name not in _TYPESTRS:
        raise TypeError(f"gpupool: dtype {dtype!r}: one of {', '.join(_TYPESTRS)}")
    typestr = _TYPESTRS[name]
    return typestr, int(typestr[2:])


def _device_nbytes(data, device):
    """The bytes of a contiguous CUDA array (PyTorch, CuPy) and its CUDA ordinal, for publish()."""
    cai = getattr(data, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError(
            "gpupool.publish: on a GPU backend, data is a PyTorch CUDA tensor or a CuPy array "
            f"(something with __cuda_array_interface__), not {type(data).__name__}"
        )
    itemsize = int(cai["typestr"][2:])
    nbytes, c_strides = itemsize, []
    for n in reversed(cai["shape"]):
        c_strides.insert(0, nbytes)
        nbytes *= n
    if cai.get("strides") is not None and tuple(cai["strides"]) != tuple(c_strides):
        raise ValueError("gpupool.publish: the array is not C-contiguous (make it so first: .contiguous(), ascontiguousarray())")
    if device is None:
        dev = getattr(data, "device", None)
        device = getattr(dev, "index", None)
        device = getattr(dev, "id", 0) if device is None else device
    return nbytes, device


def _device_copy(dst, data, nbytes):
    """Copies data (a PyTorch tensor or CuPy array) into the block at dst, with the framework."""
    target = DeviceBuffer(dst, nbytes, False)
    if type(data).__module__.split(".")[0] == "torch":
        import torch

        torch.as_tensor(target).copy_(data.reshape(-1).view(torch.uint8))
    elif type(data).__module__.split(".")[0] == "cupy":
        import cupy

        cupy.asarray(target)[...] = data.reshape(-1).view(cupy.uint8)
    else:
        raise TypeError(f"gpupool.publish: {type(data).__name__}: a PyTorch tensor or a CuPy array, on a GPU backend")


def unpublish(name):
    """Client.unpublish() on the handle the hooks share."""
    Client._shared().unpublish(name)
