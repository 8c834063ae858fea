"""tirl's benchmarks: `python -m bench --list`; each module runs as `python -m bench.NAME` (bench/registry.py)."""
