"""Foundations every layer may use: dataclass configs from YAML (`config`), atomic files (`io`), run directories
(`rundir`), the console and metrics loggers (`logging`), errors, sequence padding, progress bars, and the table of
recipe values behind `fidelity: recipe` (`fidelity`). Nothing here imports another tirl package."""
