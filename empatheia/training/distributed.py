"""Process group set-up and the DeepSpeed config of a run.

Every run goes through DeepSpeed, from one process on a laptop CPU to N GPUs launched by
``deepspeed`` or ``torchrun``: one code path, with ZeRO stage 0 when no DeepSpeed file is
given. On machines without GPUs the collectives use gloo.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sysconfig
from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist

from .config import ConfigError, TrainConfig, find_config_file

_LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Set beside the launcher variables when this module made them up for a lone process:
# "<pid>:<MASTER_PORT>" of that process. The port tells a launcher's own variables (a
# torchrun started from a notebook that trained) from the lone group's.
_LONE_GROUP = "EMPATHEIA_LONE_GROUP"


@dataclass
class ProcessInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_processes() -> ProcessInfo:
    """Join the process group a launcher set up (``RANK``, ``WORLD_SIZE``, ... in the
    environment), or start a group of one. DeepSpeed reads ``LOCAL_RANK`` from the
    environment even for one process, so a lone process gets the launcher's variables.
    A process started by one that set up its own lone group (a notebook or script that
    trained, then spawns a stage) inherits those variables, whose ``MASTER_PORT`` the
    parent's group still listens on: it starts a lone group of its own instead."""
    try:
        import deepspeed
    except ImportError as error:
        raise ImportError(f"training runs on DeepSpeed, which is not installed: pip install 'empatheia[train]' ({error})") from None

    owner, _, port = os.environ.get(_LONE_GROUP, "").partition(":")
    inherited = bool(owner) and owner != str(os.getpid()) and port == os.environ.get("MASTER_PORT")
    if "RANK" not in os.environ or inherited:
        port = str(_free_port())
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                          **{_LONE_GROUP: f"{os.getpid()}:{port}"})
    missing = [name for name in _LAUNCHER_VARIABLES if name not in os.environ]
    if missing:
        raise RuntimeError(f"the launcher set RANK but not {missing}; launch with torchrun or deepspeed")
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        use_this_environments_ninja()
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
    return ProcessInfo(dist.get_rank(), local_rank, dist.get_world_size(), device)


def use_this_environments_ninja() -> None:
    """Put the ``ninja`` installed with this Python environment (a DeepSpeed dependency)
    first on ``PATH``, where there is one.

    On the CPU, DeepSpeed compiles a shared-memory collective the first time a process
    group starts (24 s on 2 cores; cached under ``~/.cache/torch_extensions``) with whichever
    ``ninja`` comes first on ``PATH``. Run without activating the environment
    (``.venv/bin/empatheia train``) on a machine with no system ninja, that build fails and
    training cannot start; where a system ninja exists beside the environment's, the two
    versions each take the other's cached build for stale, so every process that finds the
    other one compiles it again. With the environment's own first, every process of the
    environment builds once and finds the build current."""
    scripts = sysconfig.get_path("scripts")
    ours = shutil.which("ninja", path=scripts) if scripts else None
    if ours is None or shutil.which("ninja") == ours:
        return
    os.environ["PATH"] = os.pathsep.join([scripts, os.environ.get("PATH", "")]).rstrip(os.pathsep)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def resolve_precision(config: TrainConfig, device: torch.device) -> str:
    """``bf16``, ``fp16`` or ``no``. On the CPU, ``auto`` is ``bf16`` where the processor
    computes it natively (AVX-512 BF16 or AMX: a ``small`` stage-1 step took 10 s instead
    of fp32's 19 s on 2 EPYC cores), else ``no``; fp16 needs a GPU."""
    if device.type != "cuda":
        if config.mixed_precision == "fp16":
            raise ConfigError("mixed_precision: fp16 needs a GPU; on the CPU use bf16 or no")
        if config.mixed_precision == "auto":
            return "bf16" if cpu_computes_bf16() else "no"
        return config.mixed_precision
    if config.mixed_precision != "auto":
        return config.mixed_precision
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def cpu_computes_bf16() -> bool:
    """Whether this CPU has native bfloat16 matrix instructions (else bf16 is emulated,
    slower than fp32)."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def autocast(precision: str, device: torch.device):
    """The forward pass's precision context. DeepSpeed's bf16 mode (bf16 weights with fp32
    master copies) is for GPUs; on the CPU, ``bf16`` keeps fp32 weights and runs the
    forward under ``torch.autocast``. Elsewhere a no-op: DeepSpeed casts."""
    enabled = precision == "bf16" and device.type == "cpu"
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def deepspeed_precision(precision: str, device: torch.device) -> str:
    """What DeepSpeed itself is told: ``no`` on the CPU, where :func:`autocast` does it."""
    return precision if device.type == "cuda" else "no"


# Keys of a DeepSpeed file that the stage config decides; the file may say "auto" or the
# same value, and anything else is a contradiction worth stopping for.
def _decided_by_stage_config(config: TrainConfig, world_size: int, precision: str) -> Dict[str, Any]:
    optim = config.optim
    return {
        "train_micro_batch_size_per_gpu": optim.batch_size,
        "gradient_accumulation_steps": optim.gradient_accumulation_steps,
        "train_batch_size": optim.batch_size * optim.gradient_accumulation_steps * world_size,
        "gradient_clipping": optim.max_grad_norm,
        "bf16.enabled": precision == "bf16",
        "fp16.enabled": precision == "fp16",
    }


def deepspeed_config(config: TrainConfig, world_size: int, precision: str) -> Dict[str, Any]:
    """The DeepSpeed config of a run: the file named by ``config.deepspeed`` (or ZeRO stage
    0) with the batch, accumulation, clipping and precision of the stage config filled in.

    The optimizer and LR schedule are built by the recipe, so a file that defines its own
    ``optimizer`` or ``scheduler`` is refused rather than silently ignored.
    """
    if config.deepspeed is None:
        ds: Dict[str, Any] = {"zero_optimization": {"stage": 0}}
        source = "the default DeepSpeed config"
    else:
        path = find_config_file(config.deepspeed, "deepspeed")
        source = str(config.deepspeed)
        try:
            ds = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}: not valid JSON: {error}") from None
    for section in ("optimizer", "scheduler"):
        if section in ds:
            raise ConfigError(
                f"{source}: has an {section!r} section; the recipe builds the optimizer and schedule from the "
                f"stage config's optim section, so remove it and set optim.* instead"
            )
    for dotted, value in _decided_by_stage_config(config, world_size, precision).items():
        *path, leaf = dotted.split(".")
        node = ds
        for part in path:
            node = node.setdefault(part, {})
        current = node.get(leaf, "auto")
        if current != "auto" and current != value:
            raise ConfigError(
                f"{source}: {dotted} is {current!r} but the stage config gives {value!r}; "
                f"write \"auto\" in the DeepSpeed file to take the stage config's value"
            )
        node[leaf] = value
    # A client optimizer (torch AdamW) under ZeRO is fine; DeepSpeed asks to be told.
    ds.setdefault("zero_allow_untested_optimizer", True)
    ds.setdefault("steps_per_print", 10**9)
    ds.setdefault("wall_clock_breakdown", False)
    return ds


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def all_reduce_mean(values: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size() > 1:
        values = values.clone()
        dist.all_reduce(values)
        values /= dist.get_world_size()
    return values


def any_process(flag: bool, device: torch.device) -> bool:
    """True on every process when ``flag`` is True on any of them."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def gather_objects(obj: Any) -> list:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def zero_stage(ds_config: Optional[Dict[str, Any]]) -> int:
    return int((ds_config or {}).get("zero_optimization", {}).get("stage", 0))
