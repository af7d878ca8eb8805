"""Host memory a GPU copies into at full speed: page-locked through the CUDA runtime.

The snapshot slots (runtime/snapshot.py) are files in /dev/shm (`shm_buffer`); for a state
on a GPU each slot is page-locked (``cudaHostRegister``) so the device-to-host copies run as DMA, off
the training thread's stream. Pinning gigabytes takes seconds, so it is called through
ctypes, which releases the GIL; a slot not pinned has its pages mapped ahead
(``populate``) so the first copy into it takes no page fault per page.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

_CUDART: Any = None
_PORTABLE = 1   # cudaHostRegisterPortable: pinned for every context (slots may be grown on a thread)


def _cudart() -> Any:
    """The CUDA runtime library this process already loaded, through ctypes: a ctypes
    call releases the GIL, so pinning gigabytes (seconds: every page is faulted in and
    locked) does not stop the heartbeat thread the way torch's binding would, which holds
    the GIL (its cudaHostRegister is a plain pybind11 function)."""
    global _CUDART
    if _CUDART is None:
        import ctypes

        torch.cuda.init()
        with open("/proc/self/maps") as maps:
            found = sorted({line.split()[-1] for line in maps if "libcudart.so" in line})
        _CUDART = ctypes.CDLL(found[0]) if found else False
    return _CUDART


def host_register(arr: np.ndarray) -> bool:
    """Page-lock ``arr`` for the CUDA driver (cudaHostRegister); False if the driver
    refused (the copies then still run, synchronously, through pageable memory)."""
    if arr.nbytes == 0:
        return False
    lib = _cudart()
    if lib:
        import ctypes

        err = lib.cudaHostRegister(ctypes.c_void_p(arr.ctypes.data), ctypes.c_size_t(arr.nbytes),
                                   _PORTABLE)
    else:   # a statically linked runtime: torch's binding (holds the GIL while it pins)
        err = int(torch.cuda.cudart().cudaHostRegister(arr.ctypes.data, arr.nbytes, _PORTABLE))
    return int(err) == 0


_MADV_POPULATE_WRITE = 23   # Linux >= 5.14 (asm-generic/mman-common.h)


def populate(arr: np.ndarray) -> bool:
    """Map every page of ``arr`` (a fresh /dev/shm slot, made on a thread) now, writable,
    with ``madvise(MADV_POPULATE_WRITE)``, so that the first snapshot copied into it does
    not take a page fault per 4 KiB page on the way (an 88 MB copy into fresh pages took
    26-46 ms here, into mapped ones 6.5: docs/benchmarks.md). False where the kernel
    does not know the advice (before 5.14): the first copy then maps the pages as before."""
    if arr.nbytes == 0:
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.madvise(ctypes.c_void_p(arr.ctypes.data), ctypes.c_size_t(arr.nbytes),
                        _MADV_POPULATE_WRITE) == 0


def host_unregister(arr: np.ndarray) -> None:
    lib = _cudart()
    if lib:
        import ctypes

        lib.cudaHostUnregister(ctypes.c_void_p(arr.ctypes.data))
    else:
        torch.cuda.cudart().cudaHostUnregister(arr.ctypes.data)


def shm_buffer(path: Path, nbytes: int, map_pages: bool = True) -> tuple[np.ndarray, bool]:
    """A snapshot slot's memory: ``nbytes`` reserved in the file ``path`` (in /dev/shm, so
    another process can read it without a copy), mapped, and page-locked where a GPU
    copies into it (seconds for gigabytes: call it off the training thread). Returns the
    mapping and whether it is page-locked; one that is not has its pages mapped now if
    ``map_pages`` (`populate`), else by the first copy into it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, max(nbytes, 1))
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise OSError(exc.errno, f"cannot reserve {nbytes / 2**20:.0f} MiB of host memory "
                      f"for snapshot slot {path}: {exc.strerror} (free space in /dev/shm, "
                      "or lower --snapshot-slots)") from exc
    finally:
        os.close(fd)
    arr = np.memmap(path, dtype=np.uint8, mode="r+", shape=(nbytes,))
    # page-locked so device->host copies run asynchronously on the side stream
    registered = torch.cuda.is_available() and host_register(arr)
    if map_pages and not registered:
        populate(arr)
    return arr, registered


def free_shm_buffer(path: Path, arr: np.ndarray, registered: bool) -> None:
    """Unpin ``arr`` (the driver would keep registered pages pinned past the unlink) and
    delete its file."""
    if registered:
        host_unregister(arr)
    path.unlink(missing_ok=True)
