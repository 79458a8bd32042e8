"""Executors: how a worker runs a leased task (a process today; Docker, Slurm, ... later)."""

from workers.executors.base import RUNNING, Executor, Exited, Running, StartError

__all__ = ["RUNNING", "Executor", "Exited", "Running", "StartError", "make_executor"]


def make_executor(name: str, **kwargs) -> Executor:
    if name == "process":
        from workers.executors.process import ProcessExecutor
        return ProcessExecutor(**kwargs)
    raise ValueError(f"unknown executor {name!r}: the choices are: process")
