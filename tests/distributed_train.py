"""Run the recipe in one process of a ``torchrun`` launch and write this rank's trained
weights to ``OUT/rank-R.safetensors`` (gathered first under ZeRO-3), so a test can compare
the ranks. Usage: torchrun ... tests/distributed_train.py OUT CONFIG.yaml KEY=VALUE...
"""

import sys
from pathlib import Path

import deepspeed
import torch.distributed as dist
from safetensors.torch import save_file

from empatheia.training import load_train_config
from empatheia.recipes.recipe import run


def main(out: str, config_path: str, *sets: str) -> None:
    config = load_train_config(config_path, sets)
    result = run(config)
    model = result.model
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        state = {k: v.detach().cpu().contiguous() for k, v in model.trained_state_dict().items()}
    save_file(state, str(Path(out) / f"rank-{dist.get_rank()}.safetensors"))
    dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:])
