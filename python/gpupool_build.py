"""A PEP 517 build backend for the gpupool package, kept in the tree.

The package is pure Python, so a wheel is a zip of its files and its metadata; building it
here means "pip install ./python" needs neither network access nor setuptools and wheel.
"""
import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

NAME = "gpupool"
ROOT = os.path.dirname(os.path.abspath(__file__))


def _version():
    with open(os.path.join(ROOT, NAME, "__init__.py"), encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M).group(1)


def _metadata():
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {NAME}\n"
        f"Version: {_version()}\n"
        "Summary: Python bindings of libgpupool, the client of gpupoold (node-wide GPU memory pool), "
        "with PyTorch and CuPy allocator hooks\n"
        "License: see the gpupool source tree\n"
        "Requires-Python: >=3.8\n"
    )


_WHEEL = "Wheel-Version: 1.0\nGenerator: gpupool_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _sources():
    """The package's files, relative to ROOT, in a stable order."""
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, NAME)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py") and f != "_built.py":
                out.append(os.path.relpath(os.path.join(dirpath, f), ROOT))
    return out


def _built():
    """gpupool/_built.py of the wheel: the library of the checkout the package is built from
    ($GPUPOOL_BUILD_DIR, else build/ beside python/), which the package loads before the
    dynamic loader's, so that "pip install ./python" after "make" works with nothing installed."""
    build = os.environ.get("GPUPOOL_BUILD_DIR") or os.path.join(os.path.dirname(ROOT), "build")
    library = os.path.join(os.path.abspath(build), "libgpupool.so.1")
    return (f'"""Written by gpupool_build.py when this wheel was built."""\nLIBRARY = {library!r}\n').encode()


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    dist_info = f"{NAME}-{_version()}.dist-info"
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    for name, text in (("METADATA", _metadata()), ("WHEEL", _WHEEL)):
        with open(os.path.join(metadata_directory, dist_info, name), "w", encoding="utf-8") as f:
            f.write(text)
    return dist_info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    filename = f"{NAME}-{version}-py3-none-any.whl"
    dist_info = f"{NAME}-{version}.dist-info"
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w", zipfile.ZIP_DEFLATED) as whl:
        for rel in _sources():
            with open(os.path.join(ROOT, rel), "rb") as f:
                data = f.read()
            whl.writestr(rel, data)
            records.append(_record_line(rel, data))
        rel = f"{NAME}/_built.py"
        data = _built()
        whl.writestr(rel, data)
        records.append(_record_line(rel, data))
        for name, text in (("METADATA", _metadata()), ("WHEEL", _WHEEL)):
            data = text.encode()
            whl.writestr(f"{dist_info}/{name}", data)
            records.append(_record_line(f"{dist_info}/{name}", data))
        records.append(f"{dist_info}/RECORD,,")
        whl.writestr(f"{dist_info}/RECORD", "\n".join(records) + "\n")
    return filename


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{_version()}"
    filename = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz") as tar:
        for rel in ["pyproject.toml", "gpupool_build.py"] + _sources():
            tar.add(os.path.join(ROOT, rel), arcname=f"{base}/{rel}")
        data = _metadata().encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return filename
