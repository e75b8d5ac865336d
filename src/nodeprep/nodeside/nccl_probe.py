"""Which libnccl a process has mapped, and what that library says its version is: the part of
the torch probe (python.TORCH_PY) that runs ON the node after `import torch`. Its source is sent
as it is, so: stdlib only, no nodeprep import, Python 3.6 syntax. `torch.cuda.nccl.version()`
is the NCCL torch was BUILT with; a node's LD_LIBRARY_PATH or LD_PRELOAD can make it load
another (pytorch#72768). The health payload imports this module too: `train` ships it beside
the payload, so there is one copy of this code."""

import os
import re

_NCCL = re.compile(r"libnccl\.so(\.\d+)*$")  # libnccl.so, .so.2, .so.2.21.5; not libnccl-net*


def mapped(maps):
    """/proc/<pid>/maps text -> {'nccl': [libnccl.so* paths], 'net': [libnccl-net* plugin
    paths], 'torch_cuda': the first libtorch_cuda* path or None}, in the order first mapped.
    The kernel shows each file's real path (symlinks resolved); NCCL's /dev/shm/nccl-*
    segments and its tuner/profiler plugins are not libnccl."""
    out = {"nccl": [], "net": [], "torch_cuda": None}
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5]
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        base = path.rpartition("/")[2]
        if base.startswith("libtorch_cuda"):
            out["torch_cuda"] = out["torch_cuda"] or path
            continue
        key = "nccl" if _NCCL.match(base) else "net" if base.startswith("libnccl-net") else None
        if key and path not in out[key]:
            out[key].append(path)
    return out


def version_name(code):
    """ncclGetVersion's int -> "2.21.5": NCCL_VERSION_CODE is major*10000+minor*100+patch
    since 2.9, major*1000+minor*100+patch before."""
    major, rest = divmod(code, 10000 if code >= 10000 else 1000)
    minor, patch = divmod(rest, 100)
    return "%d.%d.%d" % (major, minor, patch)


def lib_version(path):
    """ncclGetVersion() of the copy of PATH already mapped (RTLD_NOLOAD: never a second one)."""
    import ctypes

    lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
    code = ctypes.c_int(0)
    rc = lib.ncclGetVersion(ctypes.byref(code))
    if rc != 0:
        raise OSError("ncclGetVersion returned %d" % rc)
    return version_name(code.value)


def describe(found, version_of):
    """The probe's answer from mapped()'s FOUND: {'path', 'version'} of the libnccl mapped
    (any other in 'also', each {'path', 'version'}: maps are in address order, not load order,
    so which one torch binds is not told), or, none mapped but libtorch_cuda is, NCCL linked
    into it ('static': True; a version only if it exports ncclGetVersion). 'version_error'
    when a mapped libnccl cannot tell its version."""
    if found["nccl"]:
        libs = [_one(p, version_of) for p in found["nccl"]]
        out = libs[0]
        if libs[1:]:
            out["also"] = libs[1:]
        return out
    if found["torch_cuda"]:
        out = _one(found["torch_cuda"], version_of)
        out.pop("version_error", None)  # static, no exported symbol: nothing to tell
        out.update(path="static (in %s)" % found["torch_cuda"].rpartition("/")[2], static=True)
        return out
    return {"path": "none mapped"}


def _one(path, version_of):
    try:
        return {"path": path, "version": version_of(path)}
    except Exception as e:  # a finding, never a crash of the probe
        return {"path": path, "version_error": "%s: %s" % (type(e).__name__, e)}


def runtime():
    with open("/proc/self/maps") as f:
        return describe(mapped(f.read()), lib_version)
