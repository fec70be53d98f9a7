"""Stage 2: content consistency learning (§5.2; Appendix D.3, step 2).

The language model stays frozen; only the Content Synchronizer trains, on the squared
error between its speech and video content features and the gold ones pre-extracted from
the response (L_ccl, eq. 9, plus its VAE's KL). Reads the stage-1 text prompts and
``data.gold_features``; starts from stage 1's output directory (``model.init``).
"""

from empatheia.training import TrainConfig, TrainResult, build_stage_data, label_sets, start_model, train

STAGE = 2


def run(config: TrainConfig, resume: bool = False) -> TrainResult:
    model = start_model(config, require_init=True)
    data = build_stage_data(config, model.processor, label_sets(config, model.label_sets()))
    return train(config, model, data, resume)
