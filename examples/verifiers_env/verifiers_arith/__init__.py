"""A verifiers environment: a few arithmetic questions, a calculator toolset and a reward (`taskset.py`).

verifiers finds it by its module name: `vf-eval verifiers-arith`, and in tirl `task=verifiers:verifiers-arith`,
with `examples/verifiers_env` on the import path (the command is in `taskset.py`).
"""

from verifiers_arith.taskset import ArithTaskset

__all__ = ["ArithTaskset"]
