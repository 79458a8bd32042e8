"""GPU inventory of a worker and the placement of whole and fractional tasks on it.

Amounts are kept as integer milli-GPUs (the API's GPU numbers have at most 3 decimals), so
that fractions add up exactly: no GPU ever holds more than 1000 milli-GPUs of tasks.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from dataclasses import dataclass

from klique_util.gpufit import choose_gpus, per_gpu
from klique_util.units import MILLI
from workers.errors import GpuDiscoveryError, PlacementError


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    memory_mb: int | None
    model: str | None = None
    """nvidia-smi's name (``NVIDIA H100 80GB HBM3``); None for GPUs declared by --gpus. The
    control plane compares it with the pool's gpu_type (capacity truth, issue 15)."""

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "memory_mb": self.memory_mb,
            "model": self.model,
        }


NVIDIA_SMI_QUERY = ["--query-gpu=index,uuid,memory.total,name", "--format=csv,noheader,nounits"]


def parse_nvidia_smi(text: str) -> list[Gpu]:
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",", 3)]
        if len(parts) not in (3, 4):
            raise GpuDiscoveryError(f"unexpected nvidia-smi line {line!r}")
        index, uuid, memory = parts[:3]
        model = parts[3] if len(parts) == 4 and parts[3] and parts[3] != "[N/A]" else None
        try:
            mem = int(float(memory))
        except ValueError:  # "[N/A]" on some MIG setups
            mem = None
        gpus.append(Gpu(int(index), uuid, mem, model))
    return gpus


def parse_gpu_list(spec: str) -> list[int] | None:
    """``auto`` → None; ``0,1,3`` → [0, 1, 3]; ``none`` or empty → []."""
    spec = spec.strip().lower()
    if spec == "auto":
        return None
    if spec in ("", "none"):
        return []
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part.isdigit():
            raise GpuDiscoveryError(
                f"--gpus {spec!r}: expected `auto` or GPU indices like `0,1,2,3`"
            )
        if int(part) in out:
            raise GpuDiscoveryError(f"--gpus {spec!r}: GPU {part} is listed twice")
        out.append(int(part))
    return out


def discover(spec: str, nvidia_smi: str | None = None) -> tuple[list[Gpu], str]:
    """The worker's GPUs and where they came from.

    nvidia-smi present: its GPUs, restricted to the declared indices if a list is given.
    nvidia-smi absent: the declared list (fake GPUs: `uuid` says so, memory unknown);
    `auto` without nvidia-smi is an error that says to declare the list.
    """
    wanted = parse_gpu_list(spec)
    smi = nvidia_smi or shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=30, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise GpuDiscoveryError(f"{smi} failed: {exc}") from exc
        found = parse_nvidia_smi(out)
        if wanted is None:
            return found, f"nvidia-smi ({len(found)} GPUs)"
        by_index = {g.index: g for g in found}
        missing = [i for i in wanted if i not in by_index]
        if missing:
            raise GpuDiscoveryError(
                f"--gpus lists {missing} but nvidia-smi shows only {sorted(by_index)}"
            )
        return [by_index[i] for i in wanted], f"nvidia-smi, restricted by --gpus to {wanted}"
    if wanted is None:
        raise GpuDiscoveryError(
            "no nvidia-smi on this machine: declare the GPUs with --gpus 0,1,... "
            "(or --gpus none for a worker without GPUs)"
        )
    return [Gpu(i, f"declared-{i}", None) for i in wanted], f"declared by --gpus {wanted}"


class GpuAllocator:
    """Per-GPU allocated milli-GPUs. A task of 1 or more GPUs takes whole, entirely free GPUs
    (a non-integer amount above 1 is rounded up); a fraction below 1 shares one GPU with other
    fractions, best fit (the fullest GPU it fits on), so that whole GPUs stay free for whole
    tasks. Never more than one GPU's worth is placed on a GPU."""

    def __init__(self, indices: list[int]):
        self.used: dict[int, int] = {i: 0 for i in indices}

    def free(self) -> dict[int, int]:
        return {i: MILLI - u for i, u in self.used.items()}

    def fully_free(self) -> list[int]:
        return [i for i, u in self.used.items() if u == 0]

    def has_room(self) -> bool:
        return any(u < MILLI for u in self.used.values())

    def fits_ever(self, milli: int) -> bool:
        if milli < MILLI:
            return bool(self.used) or milli == 0
        return math.ceil(milli / MILLI) <= len(self.used)

    def place(self, milli: int) -> list[int] | None:
        """The GPU indices for a task of `milli` milli-GPUs, reserved; None if it does not
        fit now. The choice is klique_util.gpufit's, the one the daemon leases by."""
        chosen = choose_gpus(self.free(), milli)
        if chosen:
            per = per_gpu(milli)
            for i in chosen:
                self.used[i] += per
        return chosen

    def take(self, indices: list[int], milli: int) -> None:
        """Re-reserves a placement made before (a task taken back after a restart)."""
        if not indices:
            return
        per = per_gpu(milli)
        for i in indices:
            if i not in self.used:
                raise PlacementError(f"GPU {i} is not one of this worker's GPUs")
            if self.used[i] + per > MILLI:
                raise PlacementError(f"GPU {i} would hold more than one GPU's worth")
        for i in indices:
            self.used[i] += per

    def release(self, indices: list[int], milli: int) -> None:
        per = per_gpu(milli)
        for i in indices:
            if i in self.used:
                self.used[i] = max(0, self.used[i] - per)


# The memory cap of a fraction ----------------------------------------------------------------
# A fraction shares one GPU with other fractions. Nothing on a bare GPU enforces a memory
# share (only MIG, MPS or a container runtime with a memory limit do), so a fractional task is
# told its share and is expected to keep to it:
#
#   KLIQUE_GPU_MEMORY_MB               fraction x the GPU's memory (when the worker knows it:
#                                      nvidia-smi found the GPU); read it and cap yourself, e.g.
#                                      torch.cuda.set_per_process_memory_fraction or
#                                      XLA_PYTHON_CLIENT_MEM_FRACTION
#   KLIQUE_GPU_MEMORY_FRACTION         the fraction itself (0.5), always set for a fraction
#   CUDA_MPS_PINNED_DEVICE_MEM_LIMIT   "0=<MB>M": enforced by the CUDA driver for clients of an
#                                      MPS server (Volta+). The device is ordinal 0 because MPS
#                                      clients count the devices they see (a fraction sees exactly
#                                      one, through CUDA_VISIBLE_DEVICES)
#
# Whole-GPU tasks get none of these. docs/executors.md says which frameworks honour what.

MEMORY_MB_VAR = "KLIQUE_GPU_MEMORY_MB"
MEMORY_FRACTION_VAR = "KLIQUE_GPU_MEMORY_FRACTION"
MPS_LIMIT_VAR = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


def fraction_memory_mb(memory_mb: int | None, milli: int) -> int | None:
    """The memory share (MiB, rounded down) of a fraction of `milli` milli-GPUs on a GPU of
    `memory_mb` MiB; None for a whole GPU or an unknown memory size."""
    if memory_mb is None or milli <= 0 or milli >= MILLI:
        return None
    return memory_mb * milli // MILLI


def memory_cap_env(gpus: list[Gpu] | None, indices: list[int], milli: int) -> dict[str, str]:
    """The variables that tell a fractional task its memory share (see above); {} for a task of
    one or more whole GPUs."""
    if milli <= 0 or milli >= MILLI or len(indices) != 1:
        return {}
    env = {MEMORY_FRACTION_VAR: f"{milli / MILLI:g}"}
    memory = next((g.memory_mb for g in gpus or [] if g.index == indices[0]), None)
    mb = fraction_memory_mb(memory, milli)
    if mb is not None:
        env[MEMORY_MB_VAR] = str(mb)
        env[MPS_LIMIT_VAR] = f"0={mb}M"
    return env
