"""libgpupool through ctypes: loading it, the prototypes, and errors as exceptions."""
import ctypes
import errno
import os

LIBRARY_ENV = "GPUPOOL_LIBRARY"
SONAME = "libgpupool.so.1"


class GpupoolError(OSError):
    """A failed libgpupool call: errno is the (positive) error number, strerror gpupoold's
    sentence about it (which limit or state refused it), or the library's description."""


class OutOfMemoryError(GpupoolError, MemoryError):
    """An allocation refused for a limit (EDQUOT) or a full device (ENOMEM)."""


class _Counts(ctypes.Structure):
    """A struct of the library's counters, read as a dict."""

    def as_dict(self):
        return {name: getattr(self, name) for name, _ in self._fields_}


class Stats(_Counts):
    _fields_ = [
        ("live_blocks", ctypes.c_uint64),
        ("live_bytes", ctypes.c_uint64),
        ("cached_bytes", ctypes.c_uint64),
        ("mapped_segments", ctypes.c_uint64),
        ("mapped_bytes", ctypes.c_uint64),
        ("round_trips", ctypes.c_uint64),
        ("segments_imported", ctypes.c_uint64),
    ]


class GrowStats(_Counts):
    _fields_ = [
        ("granules_held", ctypes.c_uint64),
        ("granules_free", ctypes.c_uint64),
        ("granules_mapped", ctypes.c_uint64),
        ("granules_unmapped", ctypes.c_uint64),
    ]


# make install's default prefix: the dynamic loader finds a library there only after ldconfig.
INSTALL_DEFAULT = os.path.join("/usr/local/lib", SONAME)


def checkout_library():
    """The libgpupool.so.1 that "make" builds in the source checkout this package sits in
    (python/gpupool/ beside build/, as with PYTHONPATH=python), whether it exists or not."""
    package = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(os.path.dirname(package)), "build", SONAME)


def installed_from_library():
    """The library of the checkout "pip install ./python" built this package from (recorded in
    the wheel by python/gpupool_build.py: $GPUPOOL_BUILD_DIR, else the checkout's build/), or
    None when the package was not installed that way."""
    try:
        from . import _built
    except ImportError:
        return None
    return _built.LIBRARY


def _candidates():
    """(what to load, where it comes from, what a missing file is) in the order they are tried:
    the checkout the package sits in, the checkout it was installed from (the library of its own
    version), the dynamic loader (make install, then ldconfig; a distribution's package), make
    install's default prefix."""
    yield checkout_library(), "this checkout's build", "not built"
    built = installed_from_library()
    if built:
        yield built, "the checkout this package was installed from", "not built"
    yield SONAME, "the dynamic loader", None
    yield INSTALL_DEFAULT, "make install's default prefix", "not there"


_loaded = None


def library_path():
    """The library this package loaded: $GPUPOOL_LIBRARY, else the first of the candidates
    (_candidates()) that loads; a path, or the soname where the dynamic loader found it."""
    return _loaded


def _open():
    """(path, CDLL) of the library to use, or ImportError listing what was tried and why."""
    if os.environ.get(LIBRARY_ENV):
        path = os.environ[LIBRARY_ENV]
        try:
            return path, ctypes.CDLL(path)
        except OSError as e:
            raise ImportError(f"gpupool: cannot load libgpupool: ${LIBRARY_ENV}={path}: {e}") from e
    tried = [f"${LIBRARY_ENV} (unset)"]
    for path, where, missing in _candidates():
        if missing and not os.path.isfile(path):
            tried.append(f"{path} ({where}: {missing})")
            continue
        try:
            return path, ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({where}: {e})")
    raise ImportError(
        "gpupool: cannot load libgpupool: tried " + "; ".join(tried) + ". Build it (make, in the checkout "
        f"the package was installed from), install it (make install, then ldconfig), or set ${LIBRARY_ENV} to "
        f"the path of {SONAME}")


def _load():
    global _loaded
    path, lib = _open()
    _loaded = path
    p, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    protos = {
        "gpupool_connect": (i, [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(p)]),
        "gpupool_disconnect": (None, [p]),
        "gpupool_alloc": (i, [p, i, sz, ctypes.POINTER(p)]),
        "gpupool_free": (i, [p, p]),
        "gpupool_trim": (i, [p]),
        "gpupool_cached_bytes": (sz, [p]),
        "gpupool_stats": (i, [p, ctypes.POINTER(Stats)]),
        "gpupool_grow_stats": (i, [p, ctypes.POINTER(GrowStats)]),
        "gpupool_last_error": (sz, [p, ctypes.c_char_p, sz]),
        "gpupool_backend": (ctypes.c_char_p, [p]),
        "gpupool_strerror": (ctypes.c_char_p, [i]),
        "gpupool_hook_client": (i, [ctypes.POINTER(p)]),
        "gpupool_hook_last_error": (i, [ctypes.c_char_p, sz]),
        "gpupool_torch_promise": (i, [ctypes.c_uint]),
        "gpupool_hook_capture": (i, [i]),
        "gpupool_torch_set_throw": (i, [i]),
        "gpupool_torch_alloc": (p, [ctypes.c_ssize_t, i, p]),
        "gpupool_torch_free": (None, [p, ctypes.c_ssize_t, i, p]),
        "gpupool_cupy_malloc": (p, [p, sz, i]),
        "gpupool_cupy_free": (None, [p, p, i]),
        "gpupool_cupy_stream": (None, [p]),
        "gpupool_release_wait": (i, [p, i]),
        "gpupool_release_done": (i, [p]),
        "gpupool_release_report": (i, [p, i, ctypes.c_uint64]),
        "gpupool_publish": (i, [p, ctypes.c_char_p, p, sz]),
        "gpupool_publish_to": (i, [p, ctypes.c_char_p, p, sz, ctypes.c_char_p]),
        "gpupool_attach": (i, [p, ctypes.c_char_p, ctypes.POINTER(p), ctypes.POINTER(sz)]),
        "gpupool_attach_of": (i, [p, ctypes.c_char_p, ctypes.c_uint, ctypes.POINTER(p), ctypes.POINTER(sz)]),
        "gpupool_detach": (i, [p, p]),
        "gpupool_unpublish": (i, [p, ctypes.c_char_p]),
    }
    for name, (restype, argtypes) in protos.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise ImportError(f"gpupool: {path} has no {name}: it is older than this package") from None
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


lib = _load()


def error(err, message=""):
    """The exception for a negative errno err from the library, with gpupoold's message."""
    code = -err
    text = message or lib.gpupool_strerror(err).decode()
    cls = OutOfMemoryError if code in (errno.EDQUOT, errno.ENOMEM) else GpupoolError
    return cls(code, text)


def hook_last_error():
    """(negative errno, sentence) of this thread's latest failed hook call; (0, "") if none."""
    buf = ctypes.create_string_buffer(1024)
    err = lib.gpupool_hook_last_error(buf, len(buf))
    return err, buf.value.decode(errors="replace")


def function_address(name):
    """The address of one of the library's functions, for frameworks that take C pointers."""
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
