"""The training recipe: any stage of the curriculum (§5), or fine-tuning, from its YAML.

    python -m empatheia.recipes.recipe --config configs/train/stage2_ccl.yaml [--set KEY=VALUE ...] [--resume]

(``empatheia train CONFIG.yaml`` runs the same; a ``CONFIG.yaml`` that is not a file in the
current folder names the config the package ships, ``configs/train/x.yaml`` its
``train/x.yaml``.) The config's ``stage`` says what trains and on which examples
(:mod:`empatheia.stages`): stage 1 starts from ``model.preset``, every later stage from a
trained model (``model.init``: the previous stage's output directory, a saved model, or a
preset's trained model by name), and its ``final/`` is what the next stage or
``Empatheia.from_pretrained`` reads. A run that fails leaves ``failed.json`` in its
``output_dir`` for the next stage to report. A config with ``data.labels`` (fine-tuning on your own avatar dataset,
``configs/train/finetune_avatar.yaml``) first resizes the Style Disentangler's classifiers
to those classes: classes the model already knows keep their rows, new ones start fresh.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence, Union

from empatheia.config_loader import add_set_argument
from empatheia.stages import get_stage
from empatheia.training import TrainConfig, TrainResult, build_stage_data, label_sets, start_model, train


def run(config: TrainConfig, resume: bool = False) -> TrainResult:
    """Train ``config.stage`` as ``config`` says; with ``resume``, from the newest
    checkpoint in ``config.output_dir``."""
    stage = get_stage(config.stage)
    if stage.system != "empatheia":
        # MERIA and early fusion train models of their own (docs/variants.md).
        from empatheia.variants.models import start_variant_model, variant_stage_data

        model = start_variant_model(config)
        return train(config, model, variant_stage_data(config, model), resume)
    model = start_model(config, require_init=not stage.starts_from_preset)
    labels = label_sets(config, model.label_sets())
    if config.data.labels is not None:
        model.set_label_sets(labels)
    data = build_stage_data(config, model.processor, labels)
    return train(config, model, data, resume)


def run_file(path: Union[str, Path], sets: Sequence[str] = (), resume: bool = False) -> int:
    """Run the config at ``path`` with ``--set`` items ``sets``; a config, data or
    divergence error ends the process with its message. The main process prints the final
    folder, steps and examples as JSON."""
    from empatheia.errors import DataError
    from empatheia.training import ConfigError, TrainingDiverged, load_train_config

    try:
        result = run(load_train_config(path, sets), resume=resume)
    except (ConfigError, DataError, TrainingDiverged) as error:
        raise SystemExit(f"error: {error}")
    if result.is_main:
        print(json.dumps({"final": str(result.final_dir), "steps": result.state.step, "examples": result.state.examples}))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True, metavar="CONFIG.yaml", help="e.g. configs/train/stage1_coe.yaml")
    add_set_argument(parser, "override a config key by its dotted name, e.g. optim.learning_rate=1e-4")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir")
    args = parser.parse_args(argv)
    return run_file(args.config, args.set or [], args.resume)


if __name__ == "__main__":
    raise SystemExit(main())
