"""Floor 2 - measuring this machine: numpy/CuPy kernels, per-layer executors, the profiler and
the machine probe. Imports core and model."""
