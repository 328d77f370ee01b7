"""Runtime: what a running stage needs from the machine and the process, apart from its
configuration and records (``core/``): NVML behind a reader interface (``gpu.py``),
process groups silenced once interrupted (``processes.py``) and the guard that kills them
when the stage dies (``guard.py``), SIGINT/SIGTERM as one exception (``signals.py``), the
copy of a stage's uncached outputs that comes back when a rerun fails (``keep.py``), the
repair of an output sharing its inode with DVC's cache (``dvc_cache.py``), and the
test-only fault switches read from the environment (``faults.py``).

Why apart from ``core/``: a stage's code deps are the modules it imports, and a stage that
only reads its configuration and writes records should not rerun when process handling
changes.
"""
