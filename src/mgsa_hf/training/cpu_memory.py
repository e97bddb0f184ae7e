"""glibc's allocator told to keep what a CPU process frees, training or decoding (no import beyond the standard
library)."""


def reuse_freed_cpu_memory() -> bool:
    """
    Make glibc's allocator keep what the process frees, for the process's lifetime: every allocation comes from its
    heap (`M_MMAP_MAX` 0: none is mapped alone) and the heap is not trimmed below 2 GiB of free space
    (`M_TRIM_THRESHOLD`). By default a block over the mapping threshold (128 KiB, rising to at most 32 MiB as mapped
    blocks are freed) is mapped when allocated and unmapped when freed, so a CPU training step that allocates and frees
    the same large tensors (a 4k-token batch's logits over the vocabulary are tens of MiB) has the kernel zero and
    fault in hundreds of MiB of fresh pages every step: 16% of the default
    `mgsa-hf train` step on 2 cores (`benchmarks/HISTORY.md`, "Earlier runs of the previous recipe"). The same as the
    environment variables `MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=...` set before the process starts; jemalloc or
    tcmalloc preloaded do it too. Returns whether it applied (False off Linux or without glibc's `mallopt`).
    """
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))
