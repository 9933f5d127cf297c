"""Keep the CPU's OpenMP threads to one team, so that torch's parallel regions hand off by spinning.

torch's CPU ops run their parallel regions on GNU OpenMP (libgomp). libgomp keeps one pool of
worker threads for every thread that has started a parallel region, and the pool lives until that
thread exits. While the threads it manages outnumber the CPUs, libgomp's workers spin about 100
times instead of about 300,000 before they sleep on a futex, so each of the hundreds of parallel
regions in a decode step pays a futex wake-up (`libgomp/config/linux/wait.h`, `do_spin`).

A job loads its model on the main thread (a pool of one worker on two cores) and steps the engine
on another thread (a second pool): three managed threads on two CPUs, and every step throttled.
Worse, anyio's worker threads took turns stepping the engine, each keeping its own pool.
`release_openmp_threads` frees the calling thread's idle pool (OpenMP 5.0's
`omp_pause_resource_all(omp_pause_soft)`); a job calls it on the thread that loaded the model,
then steps the engine on one dedicated thread (`batchgen.engine.step_thread`).
"""

from __future__ import annotations

import ctypes

__all__ = ["OpenMPThreads", "release_openmp_threads"]

_OMP_PAUSE_SOFT = 1


def _libgomps() -> tuple[ctypes.CDLL, ...]:
    """Every libgomp this process has loaded now (torch's own copy; wheels such as sentencepiece
    bring another, possibly after the first call), or none (no GNU OpenMP, not Linux). Read anew
    each call: once per job, against the microseconds of /proc/self/maps."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            paths = dict.fromkeys(line.split()[-1] for line in maps if "libgomp" in line)
    except OSError:
        return ()
    libs = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(lib, "omp_pause_resource_all"):
            libs.append(lib)
    return tuple(libs)


def release_openmp_threads() -> bool:
    """Free the calling thread's idle OpenMP worker threads in every loaded libgomp; the next
    parallel region started on this thread starts a fresh pool. False where no libgomp (5.0 or
    later) is loaded, or one refused (called inside a parallel region)."""
    libs = _libgomps()
    return bool(libs) and all(int(lib.omp_pause_resource_all(_OMP_PAUSE_SOFT)) == 0 for lib in libs)



class OpenMPThreads:
    """The calling thread's OpenMP thread count (its `nthreads` setting, which the parallel
    regions of torch's ops and batchgen's kernels started on that thread follow), in every
    libgomp loaded when this was made. A count of 1 runs a thread's ops on the thread itself,
    starting no team."""

    def __init__(self) -> None:
        self._libs = _libgomps()

    @property
    def available(self) -> bool:
        """Whether a libgomp was loaded (else `set` changes nothing)."""
        return bool(self._libs)

    def set(self, num_threads: int) -> None:
        """Set the calling thread's count in each of them (torch's among them: which one it is,
        torch's own `get_num_threads` tells by its result)."""
        for lib in self._libs:
            lib.omp_set_num_threads(num_threads)
