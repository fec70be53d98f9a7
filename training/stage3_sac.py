"""Stage 3: style alignment and consistency (§5.3; Appendix D.3, step 3).

The language model stays frozen; the Style Disentangler and its classifiers train on the
squared error to the gold speech and video style features (L_sal, eq. 10) and the
cross-entropy of the emotion and the avatar's profile (L_cls, eq. 11), and so do the
media projectors, through the frozen model. Prompts are the turns' speech and video
placeholders only, so every example needs media; starts from stage 2's output directory.
"""

from empatheia.training import TrainConfig, TrainResult, build_stage_data, label_sets, start_model, train

STAGE = 3


def run(config: TrainConfig, resume: bool = False) -> TrainResult:
    model = start_model(config, require_init=True)
    data = build_stage_data(config, model.processor, label_sets(config, model.label_sets()))
    return train(config, model, data, resume)
