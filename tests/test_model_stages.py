"""Forward and backward in each stage, and exactly each stage's parameters train."""

from __future__ import annotations

import pytest
import torch

from empatheia.stages import STAGES

from .conftest import add_generator_targets, full_batch, make_dialogue

EXPECTED_TERMS = {
    1: {"loss", "loss_emp"},
    2: {"loss", "loss_ccl", "loss_ccl_speech", "loss_ccl_video", "kl_content"},
    3: {"loss", "loss_sac", "loss_sal", "loss_sal_speech", "loss_sal_video", "loss_cls", "loss_cls_emotion",
        "loss_cls_age", "loss_cls_gender", "loss_cls_timbre", "kl_style"},
}
EXPECTED_TERMS[4] = EXPECTED_TERMS[1] | EXPECTED_TERMS[2] | EXPECTED_TERMS[3] | {
    "weighted_emp", "weighted_ccl", "weighted_sal", "weighted_cls", "weighted_kl"}


@pytest.mark.parametrize("stage", [1, 2, 3, 4])
def test_stage_trains_exactly_its_parameters(model, stage):
    # LoRA's B matrices and the projectors' last layers start at zero, which makes the
    # gradient of the layers before them exactly zero; give them a value so that
    # "receives a gradient" means a non-zero gradient everywhere.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.02)
        for projector in (model.speech_projector, model.video_projector):
            projector.output_layer.weight.normal_(std=0.02)
    model.set_stage(stage)
    model.train()
    batch = full_batch(model)
    # One row without a Chain-of-Empathy emotion step (as stage 3's media-only prompts
    # have none): the Style Disentangler reads its stand-in token there, the slot's
    # state elsewhere, so both get a gradient.
    batch["emotion_slot"][0] = False
    out = model(batch, stage=stage)
    assert set(out) == EXPECTED_TERMS[stage]
    assert all(torch.isfinite(v) for v in out.values())
    out["loss"].backward()

    trainable = set(STAGES[stage].trains)
    for group, params in model.parameter_groups().items():
        for name, param in params:
            if group in trainable:
                assert param.requires_grad, name
                assert param.grad is not None and param.grad.abs().sum() > 0, f"stage {stage}: {name} got no gradient"
            else:
                assert not param.requires_grad, name
                assert param.grad is None, f"stage {stage}: frozen {name} got a gradient"


def test_each_stage_is_one_object_that_the_model_reads(model):
    from empatheia.stages import PARAMETER_GROUPS, get_stage

    assert list(model.parameter_groups()) == list(PARAMETER_GROUPS) + ["frozen"]
    assert STAGES[4].trains == PARAMETER_GROUPS and set().union(*(s.trains for s in STAGES.values())) == set(PARAMETER_GROUPS)
    # forward asks for exactly the batch keys its stage names, and names the missing one.
    batch = full_batch(model)
    for number, stage in STAGES.items():
        for key in stage.batch_keys:
            with pytest.raises(KeyError, match=rf"stage {number} needs batch keys \['{key}'\]"):
                model({k: v for k, v in batch.items() if k != key}, stage=number)
    assert STAGES[2].gold_features == ("speech_content", "video_content") and not STAGES[1].gold_features
    assert [s.name for s in STAGES.values()] == ["stage1_coe", "stage2_ccl", "stage3_sac", "stage4_joint"]
    assert get_stage(STAGES[3]) is STAGES[3]
    with pytest.raises(ValueError, match=r"stage must be one of \[1, 2, 3, 4, 'pipeline_text', 'meria_pdr', .*\], got 5"):
        model.set_stage(5)


def test_projectors_start_at_zero_and_learn_in_stage_four(model):
    # Media tokens enter a text-trained core as zero embeddings until stage 4 trains the
    # projectors; the last layer's own gradient is not zero, so training can move it.
    batch = full_batch(model)
    audio, video = model.encode_media(batch)
    assert audio.abs().sum() == 0 and video.abs().sum() == 0
    model.set_stage(4)
    model.train()
    model(batch, stage=4)["loss"].backward()
    for projector in (model.speech_projector, model.video_projector):
        assert projector.output_layer.weight.grad.abs().sum() > 0
        assert projector[0].weight.grad.abs().sum() == 0  # behind a zero layer, until it moves


def test_every_group_is_populated_and_frozen_parts_are_frozen(model):
    groups = model.parameter_groups()
    assert all(groups[g] for g in ("lora", "signal_rows", "projectors", "content_synchronizer", "style_disentangler"))
    frozen = {name for name, _ in groups["frozen"]}
    assert any(n.startswith("speech_encoder.") for n in frozen)
    assert any(n.startswith("video_encoder.") for n in frozen)
    assert any("embed_tokens" in n and "trainable_tokens" not in n for n in frozen)
    # two signal-row tensors: embedding rows and (untied) LM-head rows, 32 rows each
    assert sorted(p.shape[0] for _, p in groups["signal_rows"]) == [32, 32]


def test_stage_four_is_equation_13(model):
    model.eval()  # the VAEs use their means: every term is deterministic
    batch = full_batch(model)
    with torch.no_grad():
        out4 = model(batch, stage=4)
        parts = {k: model(batch, stage=k) for k in (1, 2, 3)}
    w = model.config.loss
    expected = (
        out4["loss_emp"] + w.alpha * out4["loss_ccl"] + w.beta * out4["loss_sac"]
        + w.kl_weight * (out4["kl_content"] + out4["kl_style"])
    )
    torch.testing.assert_close(out4["loss"], expected)
    torch.testing.assert_close(out4["loss_emp"], parts[1]["loss"])
    torch.testing.assert_close(parts[2]["loss"], out4["loss_ccl"] + w.kl_weight * out4["kl_content"])
    torch.testing.assert_close(parts[3]["loss"], out4["loss_sac"] + w.kl_weight * out4["kl_style"])
    torch.testing.assert_close(out4["loss_sac"], out4["loss_sal"] + out4["loss_cls"])
    assert (w.alpha, w.beta) == (0.2, 0.3)
    # The logged weighted terms are eq. 13's summands and add up to the loss.
    torch.testing.assert_close(out4["weighted_ccl"], w.alpha * out4["loss_ccl"])
    torch.testing.assert_close(out4["weighted_sal"] + out4["weighted_cls"], w.beta * out4["loss_sac"])
    weighted = sum(v for k, v in out4.items() if k.startswith("weighted_"))
    torch.testing.assert_close(weighted, out4["loss"])


def test_content_and_style_losses_are_squared_distances_summed_over_features(model):
    # Eqs. 9-10: ||C - C_hat||^2 per unit (averaged over the valid units) and ||S - S_hat||^2
    # per item, so each term grows with the feature width as the paper's distance does.
    model.eval()
    batch = full_batch(model)
    with torch.no_grad():
        out = model(batch, stage=4)
        hidden = model.hidden_states(batch)
        style = model.style_disentangler(*model.style_inputs(hidden, batch))
    expected = ((style.speech_style - batch["speech_style_target"]) ** 2).sum(-1).mean()
    torch.testing.assert_close(out["loss_sal_speech"], expected)
    expected = ((style.video_style - batch["video_style_target"]) ** 2).sum(-1).mean()
    torch.testing.assert_close(out["loss_sal_video"], expected)


def test_language_loss_counts_only_target_tokens(model):
    model.eval()
    batch = full_batch(model)
    with torch.no_grad():
        base = model(batch, stage=1)["loss_emp"]
        # Changing a prompt token that is not a target must not change which tokens are
        # scored; changing a label to -100 must.
        labels = batch["labels"].clone()
        first_target = int((labels[0] != -100).nonzero()[0])
        labels[0, first_target] = -100
        fewer = model({**batch, "labels": labels}, stage=1)["loss_emp"]
    assert not torch.isclose(base, fewer)
    logits = model._hf_model()(input_ids=None, inputs_embeds=model.embed_inputs(batch["input_ids"], *model.encode_media(batch)),
                               attention_mask=batch["attention_mask"]).logits
    reference = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1), ignore_index=-100
    )
    torch.testing.assert_close(base, reference, rtol=1e-4, atol=1e-5)


def test_stage_three_on_its_own_placeholder_layout(model):
    dialogues = [make_dialogue(3, seed=4), make_dialogue(1, seed=5)]
    batch = add_generator_targets(model, model.processor(dialogues, stage=3))
    text = model.tokenizer.decode(batch["input_ids"][0])
    assert "I finally got the keys" not in text  # style layout: placeholders only
    model.set_stage(3)
    out = model(batch)
    out["loss"].backward()
    assert torch.isfinite(out["loss"])


def test_frozen_language_model_builds_a_graph_only_where_gradients_pass_through_it(model):
    # Stage 2 reads the language model's states; stage 3's projectors train through it.
    batch = full_batch(model)
    for stage, graph in ((2, False), (3, True)):
        model.set_stage(stage)
        hidden_requires_grad = []
        handle = model._hf_model().base_model.register_forward_hook(
            lambda module, args, output: hidden_requires_grad.append(output.last_hidden_state.requires_grad)
        )
        model(batch)
        handle.remove()
        assert hidden_requires_grad == [graph]
        assert not any(p.requires_grad for _, p in model.parameter_groups()["lora"])


def test_missing_targets_name_the_keys(model):
    batch = full_batch(model)
    del batch["video_style_target"]
    with pytest.raises(KeyError, match="video_style_target"):
        model(batch, stage=3)
    with pytest.raises(ValueError, match="stage"):
        model(batch, stage=5)


def test_unlabelled_items_are_ignored_by_the_classifiers(model):
    batch = full_batch(model)
    batch["age_label"] = torch.full_like(batch["age_label"], -100)
    out = model(batch, stage=3)
    assert out["loss_cls_age"] == 0
    assert torch.isfinite(out["loss"])


def _emotion_weighted_model(weight: float):
    from empatheia import Empatheia
    from empatheia.config import EmpatheiaConfig

    return Empatheia(EmpatheiaConfig.from_preset("tiny", {"loss.chain_emotion_weight": weight})).eval()


def test_chain_emotion_term_is_the_token_loss_of_the_emotion_at_its_slot():
    model = _emotion_weighted_model(0.5)
    dialogues = [make_dialogue(3, seed=0), make_dialogue(2, seed=1), make_dialogue(2, seed=2)]
    dialogues[1].chain.speaker_emotion = "sad"
    dialogues[2].chain.speaker_emotion = None  # no emotion step: no slot, no term
    batch = full_batch(model, dialogues)
    with torch.no_grad():
        out1 = model(batch, stage=1)
        out4 = model(batch, stage=4)
        logits = model._hf_model()(inputs_embeds=model.embed_inputs(batch["input_ids"], *model.encode_media(batch)),
                                   attention_mask=batch["attention_mask"]).logits
    slots = [int(batch["emotion_slot"][row].nonzero()) for row in (0, 1)]
    assert not batch["emotion_slot"][2].any()
    firsts = [model.tokenizer.encode(f" {e}", add_special_tokens=False)[0] for e in ("anxious", "sad")]
    assert [int(batch["labels"][row, at + 1]) for row, at in zip((0, 1), slots)] == firsts
    # Over the whole vocabulary: every other word at the slot is pushed down too.
    expected = torch.nn.functional.cross_entropy(
        torch.stack([logits[row, at] for row, at in zip((0, 1), slots)]), torch.tensor(firsts)
    )
    torch.testing.assert_close(out1["loss_chain_emotion"], expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out1["loss"], out1["loss_emp"] + 0.5 * out1["loss_chain_emotion"])
    # Stage 4 adds it beside eq. 13's terms; stages 2 and 3 never see it.
    w = model.config.loss
    torch.testing.assert_close(out4["loss_chain_emotion"], out1["loss_chain_emotion"])
    torch.testing.assert_close(out4["loss"], out4["loss_emp"] + w.alpha * out4["loss_ccl"] + w.beta * out4["loss_sac"]
                               + w.kl_weight * (out4["kl_content"] + out4["kl_style"]) + 0.5 * out4["loss_chain_emotion"])
    with torch.no_grad():
        assert all("loss_chain_emotion" not in model(batch, stage=s) for s in (2, 3))


def test_chain_emotion_term_leaves_out_slots_whose_emotion_is_not_a_target():
    model = _emotion_weighted_model(1.0)
    dialogues = [make_dialogue(2, seed=0), make_dialogue(2, seed=1)]
    dialogues[1].chain.speaker_emotion = "sad"
    batch = full_batch(model, dialogues)
    with torch.no_grad():
        both = model(batch, stage=1)["loss_chain_emotion"]
        only_sad = model(full_batch(model, [dialogues[1]]), stage=1)["loss_chain_emotion"]
        # Row 0's emotion is no longer a target: only row 1 counts.
        labels = batch["labels"].clone()
        labels[0] = -100
        untrained = model({**batch, "labels": labels}, stage=1)["loss_chain_emotion"]
        # No trained slot left gives 0, not NaN.
        last = int((batch["labels"][1] != -100).nonzero()[-1])  # keep one target so L_emp is defined
        labels[1] = -100
        labels[1, last] = batch["labels"][1, last]
        none_left = model({**batch, "labels": labels}, stage=1)
    assert not torch.isclose(both, only_sad)
    torch.testing.assert_close(untrained, only_sad, rtol=1e-4, atol=1e-5)
    assert none_left["loss_chain_emotion"] == 0
    torch.testing.assert_close(none_left["loss"], none_left["loss_emp"])


def test_chain_goal_term_is_the_token_loss_of_the_goal_step_alone():
    from empatheia import Empatheia
    from empatheia.config import EmpatheiaConfig

    model = Empatheia(EmpatheiaConfig.from_preset("tiny", {"loss.chain_goal_weight": 0.5})).eval()
    dialogues = [make_dialogue(3, seed=0), make_dialogue(2, seed=1), make_dialogue(2, seed=2)]
    dialogues[0].chain.goal_to_response = "Expressing sympathy and asking what happened."
    dialogues[1].chain.goal_to_response = "Congratulating the speaker."
    dialogues[2].chain.goal_to_response = None  # no goal step: nothing of it is marked
    batch = full_batch(model, dialogues)
    # The mask covers the goal's words exactly: not the lead-in's colon, not the line break.
    for row, goal in ((0, "Expressing sympathy and asking what happened."), (1, "Congratulating the speaker.")):
        assert model.tokenizer.decode(batch["input_ids"][row][batch["goal_mask"][row]]).strip() == goal
    assert not batch["goal_mask"][2].any()
    with torch.no_grad():
        out1 = model(batch, stage=1)
        out4 = model(batch, stage=4)
        logits = model._hf_model()(inputs_embeds=model.embed_inputs(batch["input_ids"], *model.encode_media(batch)),
                                   attention_mask=batch["attention_mask"]).logits
        rows, cols = batch["goal_mask"].nonzero(as_tuple=True)
        expected = torch.nn.functional.cross_entropy(logits[rows, cols - 1].float(), batch["input_ids"][rows, cols])
        torch.testing.assert_close(out1["loss_chain_goal"], expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(out1["loss"], out1["loss_emp"] + 0.5 * out1["loss_chain_goal"])
        torch.testing.assert_close(out4["loss_chain_goal"], out1["loss_chain_goal"])
        assert all("loss_chain_goal" not in model(batch, stage=s) for s in (2, 3))
        # Off by default: eq. 8 as the paper writes it.
        assert "loss_chain_goal" not in Empatheia(EmpatheiaConfig.from_preset("tiny")).eval()(batch, stage=1)
        # No goal token left as a target gives 0, not NaN.
        labels = batch["labels"].masked_fill(batch["goal_mask"], -100)
        assert model({**batch, "labels": labels}, stage=1)["loss_chain_goal"] == 0


def test_paper_eq_8_has_no_chain_emotion_term(model):
    from empatheia.config import EmpatheiaConfig

    assert EmpatheiaConfig.from_preset("paper").loss.chain_emotion_weight == 0.0
    assert EmpatheiaConfig.from_preset("small").loss.chain_emotion_weight == 1.0
    with torch.no_grad():
        out = model(full_batch(model), stage=1)
    assert set(out) == {"loss", "loss_emp"}


def test_frozen_encoders_keep_fp32_under_cpu_autocast(model):
    # bf16 training on the CPU runs the forward under autocast; the encoders' features
    # must stay the fp32 ones that inference and the media cache give.
    batch = full_batch(model)
    features = {}
    hooks = [getattr(model, name).register_forward_hook(lambda m, i, out, name=name: features.setdefault(name, []).append(out))
             for name in ("speech_encoder", "video_encoder")]
    try:
        with torch.no_grad():
            model.encode_media(batch)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                projected, _ = model.encode_media(batch)
    finally:
        for hook in hooks:
            hook.remove()
    assert projected.dtype == torch.bfloat16  # the trained projector does run in bf16
    for name, (plain, autocast) in features.items():
        plain, autocast = (x[0] if isinstance(x, tuple) else x for x in (plain, autocast))
        assert autocast.dtype == torch.float32, name
        torch.testing.assert_close(autocast, plain, rtol=0, atol=0)
    assert set(features) == {"speech_encoder", "video_encoder"}


def test_listener_echo_term_is_the_unlikelihood_of_the_copy_past_its_opening_and_the_target():
    import dataclasses

    from empatheia import Empatheia
    from empatheia.config import EmpatheiaConfig
    from empatheia.data.dataset import StageDataset
    from empatheia.prompts import PromptMode

    model = Empatheia(EmpatheiaConfig.from_preset("tiny", {"loss.listener_echo_weight": 0.5})).eval()
    with_listener, alone = make_dialogue(3, audio=False, video=False), make_dialogue(1, audio=False, video=False, seed=1)
    # The listener said "That's wonderful! How does it feel?". Its first three words are
    # no echo and are never pushed against; nor is what the target itself says.
    with_listener = dataclasses.replace(with_listener, response="That's a big step, and quiet nights get easier.")
    dataset = StageDataset([with_listener, alone], model.processor, 1)
    examples = [dataset[0], dataset[1]]
    assert examples[1].listener_echo is None  # no listener turn: nothing to echo
    echo = examples[0].listener_echo

    def marked(example):
        return model.tokenizer.decode(example.input_ids[example.labels != -100]).strip()

    assert model.tokenizer.decode(echo.input_ids[echo.response_mask]).strip() == "That's wonderful! How does it feel?"
    assert marked(echo) == "does it feel?"
    same_start = dataclasses.replace(with_listener, response="That's wonderful! How does it go?")
    assert marked(StageDataset([same_start], model.processor, 1)[0].listener_echo) == "feel?"
    short = dataclasses.replace(with_listener, turns=[*with_listener.turns[:1], dataclasses.replace(
        with_listener.turns[1], text="Oh, how awful."), with_listener.turns[2]])
    assert StageDataset([short], model.processor, 1)[0].listener_echo is None  # three words: no run of four
    with pytest.raises(ValueError, match="text prompts, not full ones"):
        model.processor.listener_echo_example(with_listener, examples[0].encoded, PromptMode.FULL)
    # Same prompt and chain as the target, up to the reply.
    start = int(echo.response_mask.nonzero()[0])
    assert torch.equal(echo.input_ids[:start], examples[0].encoded.input_ids[:start])

    batch = dataset.collator()(examples)
    assert batch["echo_input_ids"].shape[0] == 1
    with torch.no_grad():
        out = model(batch, stage=1)
        logits = model._hf_model()(input_ids=batch["echo_input_ids"]).logits[0]
    cols = (batch["echo_labels"][0] != -100).nonzero().squeeze(1)
    p = logits[cols - 1].float().softmax(-1).gather(1, batch["echo_input_ids"][0, cols].unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(out["loss_listener_echo"], -torch.log1p(-p).mean(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out["loss"], out["loss_emp"] + 0.5 * out["loss_listener_echo"])
    # A batch without a listener turn: no row, and 0; off by default; a batch built
    # without the echo while the term is on is an error, not a silent 0.
    lone = dataset.collator()([examples[1]])
    assert lone["echo_input_ids"].shape[0] == 0 and model(lone, stage=1)["loss_listener_echo"] == 0
    plain = Empatheia(EmpatheiaConfig.from_preset("tiny")).eval()
    assert "loss_listener_echo" not in plain(batch, stage=1)
    assert "echo_input_ids" not in StageDataset([with_listener], plain.processor, 1).collator()([examples[0]])
    with pytest.raises(KeyError, match="echo_input_ids"):
        model(model.processor([with_listener], 1), stage=1)
    assert StageDataset([with_listener], plain.processor, 1)[0].listener_echo is None


def test_training_on_the_listener_echo_term_makes_the_copy_less_likely():
    from empatheia import Empatheia
    from empatheia.config import EmpatheiaConfig
    from empatheia.data.dataset import StageDataset

    def trained(weight: float) -> float:
        """The copy's unlikelihood after 8 steps from the same start, with the term at ``weight``."""
        torch.manual_seed(0)
        model = Empatheia(EmpatheiaConfig.from_preset("tiny", {"loss.listener_echo_weight": 1.0}))
        with torch.no_grad():  # LoRA's B starts at 0, which would leave its A without a gradient
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(std=0.02)
        model.set_stage(1)
        dataset = StageDataset([make_dialogue(3, audio=False, video=False)], model.processor, 1)
        batch = dataset.collator()([dataset[0]])  # with the echo, built while the weight is 1
        model.config.loss.listener_echo_weight = weight
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        model.train()
        for _ in range(8):
            optimizer.zero_grad()
            model(batch, stage=1)["loss"].backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            return float(model.listener_echo_loss(batch))

    assert trained(5.0) < trained(0.0)


def test_loss_weights_must_be_finite_and_not_negative():
    from empatheia.config import EmpatheiaConfig

    for bad in (-0.1, float("inf"), True):
        with pytest.raises(ValueError, match="loss.listener_echo_weight"):
            EmpatheiaConfig.from_preset("tiny", {"loss.listener_echo_weight": bad})
