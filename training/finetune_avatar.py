"""Downstream fine-tuning on a new avatar dataset (docs/training.md).

Starts from a trained Empatheia directory (``model.init``: a stage-4 output or any
``save_pretrained`` folder) and trains stage ``config.stage`` (4 by default: LoRA, signal
rows and both heads) on avatar JSONL with the dataset's own label sets (``data.labels``).
The Style Disentangler's classifiers are resized to those labels: classes the model
already knows keep their rows, new ones start fresh.
"""

from empatheia.training import TrainConfig, TrainResult, build_stage_data, label_sets, start_model, train

STAGE = None  # any stage; 4 in configs/train/finetune_avatar.yaml


def run(config: TrainConfig, resume: bool = False) -> TrainResult:
    model = start_model(config, require_init=True)
    labels = label_sets(config, model.label_sets())
    model.set_label_sets(labels)
    data = build_stage_data(config, model.processor, labels)
    return train(config, model, data, resume)
