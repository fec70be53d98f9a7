"""Stage 4: joint training (Appendix D.3, step 4).

LoRA, the signal tokens' rows and both heads train together on
L = L_emp + α L_ccl + β L_sac (eq. 13) over full multimodal prompts, with every gold
feature and label. Starts from stage 3's output directory; its ``final/`` is the model
``Empatheia.from_pretrained`` and ``empatheia respond --checkpoint`` load.
"""

from empatheia.training import TrainConfig, TrainResult, build_stage_data, label_sets, start_model, train

STAGE = 4


def run(config: TrainConfig, resume: bool = False) -> TrainResult:
    model = start_model(config, require_init=True)
    data = build_stage_data(config, model.processor, label_sets(config, model.label_sets()))
    return train(config, model, data, resume)
