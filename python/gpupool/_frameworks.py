"""Installing gpupool as PyTorch's and CuPy's allocator."""
import ctypes
import os
import threading
import time
import warnings

from ._lib import function_address, hook_last_error, lib, library_path


def _name_the_client():
    # The hooks connect with $GPUPOOL_CLIENT_NAME; without it they would all be "python3".
    from . import default_client_name

    os.environ.setdefault("GPUPOOL_CLIENT_NAME", default_client_name())


TORCH_MODES = ("allocator", "mempool")
_torch_pools = []       # mode "mempool": (device, torch.cuda.MemPool) per device, kept for the process's life
_torch_installed = {}   # "mode" and "allocator", once use_with_torch() has installed one


def use_with_torch(mode=None):
    """Makes PyTorch take its CUDA memory from gpupool. Returns the CUDAPluggableAllocator.

    mode (default $GPUPOOL_TORCH_MODE, else "allocator"):

    "allocator": gpupool is PyTorch's allocator, each tensor a block of gpupool's pool. Call it
    before the first CUDA tensor (PyTorch cannot swap an allocator it has used). A refused
    allocation raises RuntimeError("CUDA out of memory. gpupool refused ...") with gpupoold's
    reason. Tensor.record_stream() does nothing with a pluggable allocator: a tensor used on a
    side stream must be waited for (torch.cuda.current_stream().wait_stream(side)) before it is
    dropped. For NCCL this sets TORCH_NCCL_AVOID_RECORD_STREAMS=1 unless it is set already, so
    that process groups made afterwards keep their tensors until the collective ends instead of
    calling record_stream(). torch.cuda.memory_stats() and friends, and cuDNN's benchmark mode,
    do not work with a pluggable allocator: use gpupool.stats() for this process and
    gpupool.status() (gpupoolctl) for the node; gpupool.trim() does what
    torch.cuda.empty_cache() does for PyTorch's own cache.

    "mempool": PyTorch's own caching allocator stays, and takes its segments from gpupool: one
    torch.cuda.MemPool per device over the pluggable allocator, every allocation on the device
    routed to it (torch._C._cuda_beginAllocateToPool; PyTorch 2.8 or later). Blocks, streams,
    memory_stats(), snapshots and cuDNN's benchmark mode are PyTorch's own; a refusal is
    PyTorch's torch.cuda.OutOfMemoryError (gpupool.last_error() has gpupoold's reason). While a
    pool is routed PyTorch does less of its own (c10/cuda/CUDACachingAllocator.cpp, 2.8 to
    2.11), and in this mode one always is: a NULL raises at once, without PyTorch freeing its
    cache and trying again (gpupoold asks the process for it instead, below); and a block used
    on another stream (Tensor.record_stream()) is never reused or freed, its end deferred until
    no pool is routed. So, as in mode "allocator", this sets TORCH_NCCL_AVOID_RECORD_STREAMS=1
    unless it is set already, and a tensor used on a side stream is waited for instead. What
    PyTorch keeps in its cache goes back when gpupoold asks: a thread of this package, woken by
    the library (gpupool_release_wait()), moves allocations to a new pool and releases the old
    one, whose cached segments torch.cuda.empty_cache() then frees (it frees only pools nobody
    uses; its MemPool object is kept, since PyTorch's destructor would end the process while
    a pool is routed), and tells the library every 0.1 s what PyTorch holds unused
    (reserved less allocated), which gpupoold sees as this process's free memory. The price of
    a release: the new pool starts empty (its first allocations come from gpupool's pool in
    the process, or a lease), and the old pool's blocks still in use go back only as they are
    dropped, at the next release. CUDA graphs must not be captured (their allocations would
    land in this pool, not the graph's). It may be called after CUDA is in use; only later
    allocations come from gpupool.

    A process has one mode: a second call returns the same allocator, and one with the other
    mode raises RuntimeError.
    """
    try:
        import torch
    except ImportError as e:
        raise ImportError("gpupool.use_with_torch(): PyTorch is not installed") from e
    mode = mode or os.environ.get("GPUPOOL_TORCH_MODE") or "allocator"
    if mode not in TORCH_MODES:
        raise ValueError(f"gpupool.use_with_torch(): no mode {mode!r} (from the argument or "
                         f"$GPUPOOL_TORCH_MODE): one of {', '.join(TORCH_MODES)}")
    if _torch_installed:
        if _torch_installed["mode"] != mode:
            raise RuntimeError(f"gpupool.use_with_torch(): this process uses mode {_torch_installed['mode']!r} "
                               f"already; a process has one mode, not {mode!r} too")
        return _torch_installed["allocator"]
    _name_the_client()
    _promise_torch_streams(torch)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(library_path(), "gpupool_torch_alloc", "gpupool_torch_free")
    if mode == "mempool":
        _use_torch_mempool(torch, allocator)
        _torch_installed.update(mode=mode, allocator=allocator)
        return allocator
    # ProcessGroupNCCL reads it when a group is made; record_stream() would not reach gpupool.
    os.environ.setdefault("TORCH_NCCL_AVOID_RECORD_STREAMS", "1")
    # Refusals as C++ exceptions: PyTorch does not check its allocator for NULL.
    if lib.gpupool_torch_set_throw(1) < 0:
        warnings.warn(
            "gpupool: the C++ runtime is not loaded, so a refused allocation cannot raise; "
            "PyTorch would get a NULL pointer",
            RuntimeWarning,
            stacklevel=2,
        )
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise RuntimeError(
            f"gpupool.use_with_torch(): {e}: call it before anything allocates CUDA memory "
            "(the first .cuda() or torch.cuda call that allocates)"
        ) from e
    _torch_installed.update(mode=mode, allocator=allocator)
    return allocator


# gpupool.h: GPUPOOL_STREAMS_KEPT | GPUPOOL_CAPTURES_TOLD
_TORCH_PROMISES = 1 | 2


def _promise_torch_streams(torch):
    """Tells the library what PyTorch guarantees of the streams its hooks are given, so that an
    allocation or free asks the driver nothing: they are PyTorch's (from its pool, never
    destroyed), and every graph capture goes through torch.cuda.CUDAGraph (torch.cuda.graph,
    make_graphed_callables, torch.compile's CUDA graphs), whose capture_begin and capture_end
    are wrapped to say so. A capture begun some other way (cudaStreamBeginCapture through
    another library) while the hooks allocate breaks the promise, as it breaks PyTorch's own
    allocator."""
    graph = getattr(torch.cuda, "CUDAGraph", None)
    if graph is None or not hasattr(graph, "capture_begin") or not hasattr(graph, "capture_end"):
        warnings.warn(f"gpupool: PyTorch {torch.__version__} has no torch.cuda.CUDAGraph.capture_begin/capture_end: "
                      "the library asks the driver about each stream", RuntimeWarning, stacklevel=3)
        return
    begin, end = graph.capture_begin, graph.capture_end
    if getattr(begin, "_gpupool", False):
        return

    def capture_begin(self, *args, **kwargs):
        lib.gpupool_hook_capture(1)
        try:
            return begin(self, *args, **kwargs)
        except BaseException:
            lib.gpupool_hook_capture(0)     # it never began
            raise

    def capture_end(self, *args, **kwargs):
        try:
            return end(self, *args, **kwargs)
        finally:
            lib.gpupool_hook_capture(0)

    capture_begin._gpupool = capture_end._gpupool = True
    graph.capture_begin, graph.capture_end = capture_begin, capture_end
    lib.gpupool_torch_promise(_TORCH_PROMISES)      # PyTorch's hooks' calls alone, not CuPy's


def _use_torch_mempool(torch, allocator):
    mem_pool = getattr(torch.cuda.memory, "MemPool", None)
    begin = getattr(torch._C, "_cuda_beginAllocateToPool", None)
    if mem_pool is None or begin is None:
        raise RuntimeError(
            f"gpupool.use_with_torch(mode='mempool'): PyTorch {torch.__version__} has no torch.cuda.MemPool "
            "or torch._C._cuda_beginAllocateToPool (PyTorch 2.8 or later): use mode='allocator'"
        )
    # PyTorch's allocator checks for NULL and raises its own torch.cuda.OutOfMemoryError (it
    # would free its cache and try again first, but not while a pool is routed). A C++
    # exception from the hook would skip its bookkeeping.
    lib.gpupool_torch_set_throw(0)
    # Blocks used on another stream are never freed while a pool is routed (see use_with_torch).
    os.environ.setdefault("TORCH_NCCL_AVOID_RECORD_STREAMS", "1")
    # The caching allocator's per-device state is made at CUDA's lazy initialization: a pool
    # routed before it, as the process's first CUDA use, ends the process (reported by another
    # project that routes a MemPool so; not yet seen here).
    torch.cuda.init()
    pools = []
    for device in range(torch.cuda.device_count()):
        with torch.cuda.device(device):
            pool = mem_pool(allocator.allocator())
        _keep(pool)
        begin(device, pool.id)
        pools.append((device, pool))    # a MemPool does not say its device (PyTorch 2.11)
    _torch_pools.extend(pools)
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    release = getattr(torch._C, "_cuda_releasePool", None)
    if end is None or release is None:
        warnings.warn(f"gpupool: PyTorch {torch.__version__} has no torch._C._cuda_endAllocateToPool or "
                      "_cuda_releasePool: what its cache holds does not go back when gpupoold asks",
                      RuntimeWarning, stacklevel=3)
        return
    threading.Thread(target=_torch_releases, args=(torch, allocator, mem_pool, begin, end, release),
                     name="gpupool-torch-release", daemon=True).start()


# How often the release thread tells the library what PyTorch's cache holds unused.
_RELEASE_REPORT_MS = 100


def _keep(pool):
    """Keeps a MemPool for the life of the process: its destructor never runs. PyTorch's
    (~MemPool) releases the pool, then empties its cache by its id, which syncs the pool's events
    and asserts that no pool is routed (captures_underway.empty() in synchronize_and_free_events,
    PyTorch 2.8 to 2.11): in this mode one always is, so the destructor would end the process,
    at a rotation or as the interpreter exits."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(pool))


def _torch_rotate(torch, allocator, mem_pool, begin, end, release):
    """Routes each device's allocations to a new pool and lets the old one go: both its uses
    released here (the routing's, and its MemPool's, which is kept: see _keep), so that it is a
    pool nobody uses, whose cache torch.cuda.empty_cache() frees while another pool is routed
    (release_cached_blocks() frees those without syncing); what its blocks still in use hold
    goes back as they are dropped, at the next torch.cuda.empty_cache()."""
    for i, (device, old) in enumerate(_torch_pools):
        with torch.cuda.device(device):
            new = mem_pool(allocator.allocator())
        _keep(new)
        begin(device, new.id)
        end(device, old.id)
        release(device, old.id)         # the routing's use
        _torch_pools[i] = (device, new)
        if old.use_count() == 1:        # its MemPool's alone: nobody else holds it
            release(device, old.id)
        else:                           # (shown once: the warnings module's default)
            warnings.warn("gpupool: a PyTorch memory pool of gpupool's is used by something else too: "
                          "what it caches stays there", RuntimeWarning, stacklevel=2)
    torch.cuda.empty_cache()            # what the old pools cache, and what older pools' blocks left since


def _torch_releases(torch, allocator, mem_pool, begin, end, release):
    """The release thread of mode "mempool" (see use_with_torch)."""
    said, handle = {}, ctypes.c_void_p()
    # The hooks' handle, once it connects (a daemon that is not up yet is tried again, as the hooks do).
    while lib.gpupool_hook_client(ctypes.byref(handle)) < 0:
        time.sleep(1)
    handle = handle.value
    while True:
        r = lib.gpupool_release_wait(handle, _RELEASE_REPORT_MS)
        if r < 0:
            return
        if r == 1:
            try:
                _torch_rotate(torch, allocator, mem_pool, begin, end, release)
            finally:
                lib.gpupool_release_done(handle)
        for device in range(torch.cuda.device_count()):
            unused = max(torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device), 0)
            if said.get(device) != unused and lib.gpupool_release_report(handle, device, unused) == 0:
                said[device] = unused


def _cupy_out_of_memory(cupy, size, reason):
    base = cupy.cuda.memory.OutOfMemoryError

    class GpupoolCupyOutOfMemoryError(base):
        def __init__(self):
            MemoryError.__init__(self, f"Out of memory allocating {size:,} bytes: gpupool refused {reason}")
            self._size, self._total, self._limit = size, -1, 0

    return GpupoolCupyOutOfMemoryError()


def use_with_cupy(client=None):
    """Makes CuPy take its device memory from gpupool (through the shared handle, or client,
    a gpupool.Client). CuPy's own memory pool is bypassed: every allocation and free goes to
    gpupool, whose own pool in the process keeps repeats cheap. A refusal raises
    cupy.cuda.memory.OutOfMemoryError with gpupoold's reason. As with CuPy's own pool, an
    allocation is made on CuPy's current stream, and its free is ordered after the work queued
    on that stream: the stream's next allocations may reuse it at once, others once that work
    has ended. Returns the allocating function given to cupy.cuda.set_allocator().
    """
    try:
        import cupy
    except ImportError as e:
        raise ImportError("gpupool.use_with_cupy(): CuPy is not installed") from e
    if client is None:
        _name_the_client()
    param = client._live() if client is not None else 0
    c_allocator = cupy.cuda.memory.CFunctionAllocator(
        param,
        function_address("gpupool_cupy_malloc"),
        function_address("gpupool_cupy_free"),
        client if client is not None else lib,
    )

    # CuPy's allocator interface names no stream: tell the library this thread's current one
    # when it changes (a thread-local there too), before the allocation.
    current_stream = getattr(cupy.cuda, "get_current_stream", None)
    set_stream = lib.gpupool_cupy_stream
    said = threading.local()

    def malloc(size):
        if current_stream is not None:
            stream = current_stream().ptr
            if getattr(said, "stream", 0) != stream:
                set_stream(stream)
                said.stream = stream
        mem = c_allocator.malloc(size)
        if size and not mem.ptr:
            err, reason = hook_last_error()
            raise _cupy_out_of_memory(cupy, size, reason or "the allocation")
        return mem

    cupy.cuda.set_allocator(malloc)
    return malloc
