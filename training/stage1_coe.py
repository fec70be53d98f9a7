"""Stage 1: Chain-of-Empathy learning (§5.1; Appendix D.3, step 1).

Trains LoRA on the language model, with the signal tokens' rows and the input projectors,
on the negative log-likelihood of the chain of empathy and the response (L_emp, eq. 8).
Reads dialogue text only, so a text-only file serves: EmpatheticDialogues conversations
JSONL, AvaMERG JSON without media, or avatar JSONL. Starts from ``model.preset``.
"""

from empatheia.training import TrainConfig, TrainResult, build_stage_data, label_sets, start_model, train

STAGE = 1


def run(config: TrainConfig, resume: bool = False) -> TrainResult:
    model = start_model(config, require_init=False)
    data = build_stage_data(config, model.processor, label_sets(config, model.label_sets()))
    return train(config, model, data, resume)
