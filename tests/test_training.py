"""The training recipe on the tiny preset, in this process: each stage learns and changes
exactly its own parameters, the stages chain into a model that responds, fine-tuning on a
new avatar dataset with its own labels, and every clear failure the recipe promises."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from empatheia import Dialogue, Empatheia, Turn
from empatheia.data import DataError
from empatheia.labels import LabelSets
from empatheia.stages import STAGES
from empatheia.training import ConfigError, TrainingDiverged, build_stage_data, load_train_config, start_model
from empatheia.training import train as train_loop  # `train` is the data file in these tests

from empatheia.recipes import recipe

from .training_helpers import (
    STAGE_CONFIGS,
    extract_tiny_gold_features,
    final_weights,
    read_metrics,
    tiny_config,
    tiny_settings,
    write_avatar_dataset,
)

def _snapshot(model: Empatheia):
    return {key: {n: p.detach().clone() for n, p in params} for key, params in model.parameter_groups().items()}


@pytest.mark.parametrize("stage", [1, 2, 3, 4])
def test_each_stage_learns_and_changes_only_its_parameters(stage, avatar, stage1_output, tmp_path):
    train, gold = avatar
    config = tiny_config(
        stage, tmp_path / "run", train, gold=gold if stage > 1 else None, init=stage1_output if stage > 1 else None
    )
    model = start_model(config, require_init=stage > 1)
    before = _snapshot(model)
    data = build_stage_data(config, model.processor, model.label_sets())
    result = train_loop(config, model, data)

    losses = [row["loss"] for row in read_metrics(tmp_path / "run")]
    assert len(losses) == config.max_steps
    assert sum(losses[-2:]) < 0.97 * sum(losses[:2]), losses

    after = _snapshot(result.model)
    changed_groups = set()
    for key, params in before.items():
        for name, value in params.items():
            if torch.equal(value, after[key][name]):
                continue
            assert key in STAGES[stage].trains, f"stage {stage} changed {name} of the {key} group"
            changed_groups.add(key)
    # What each stage's loss reaches; stage 1's text prompts hold no media (its target ends
    # with the signal tokens, so their rows train).
    expected = {1: {"lora", "signal_rows"}, 2: {"content_synchronizer"}, 3: {"projectors", "style_disentangler"},
                4: {"lora", "signal_rows", "projectors", "content_synchronizer", "style_disentangler"}}[stage]
    assert expected <= changed_groups, (stage, changed_groups)

    reloaded = Empatheia.from_pretrained(tmp_path / "run" / "final")
    for name, value in reloaded.state_dict().items():
        assert torch.equal(value, result.model.state_dict()[name]), name


def test_stages_chain_into_a_model_that_responds(avatar, tmp_path):
    train, gold = avatar
    previous = None
    for stage in (1, 2, 3, 4):
        out = tmp_path / f"stage{stage}"
        config = tiny_config(stage, out, train, gold=gold if stage > 1 else None, init=previous, max_steps=3)
        recipe.run(config)
        assert (out / "final" / "empatheia.safetensors").is_file()
        previous = out
    # Each stage started from the last one: stage 2 kept stage 1's LoRA, and so on.
    lora = [k for k in final_weights(tmp_path / "stage1") if "lora_" in k]
    for key in lora:
        assert torch.equal(final_weights(tmp_path / "stage1")[key], final_weights(tmp_path / "stage3")[key])
    assert any(not torch.equal(final_weights(tmp_path / "stage3")[k], final_weights(tmp_path / "stage4")[k]) for k in lora)

    model = Empatheia.from_pretrained(tmp_path / "stage4" / "final")
    response = model.respond(Dialogue([Turn("speaker", "I lost my wallet on the bus today.")]), max_new_tokens=8)
    assert isinstance(response.text, str)
    assert response.emotion.label in model.config.style_disentangler.emotion_labels
    assert response.speech_content.shape[-1] == model.config.content_synchronizer.speech_content_dim


def _ed_file(path):
    path.write_text(
        json.dumps(
            {
                "conv_id": "hit:1_conv:2",
                "situation": "My sister visited after two years abroad.",
                "emotion": "joyful",
                "utterances": ["My sister came home today!", "That is lovely, you must have missed her.",
                               "So much, we talked all night.", "Enjoy every minute with her."],
            }
        )
        + "\n"
    )
    return path


def test_stage_one_reads_a_text_only_file(tmp_path):
    conversations = _ed_file(tmp_path / "ed.jsonl")
    config = tiny_config(1, tmp_path / "run", conversations, max_steps=2, **{"optim.batch_size": 2})
    result = recipe.run(config)
    assert result.state.step == 2 and result.state.examples == 4
    assert [row["step"] for row in read_metrics(tmp_path / "run")] == [1, 2]


def test_the_recipe_runs_a_stage_from_its_yaml_on_the_command_line(tmp_path, avatar, capsys):
    train, _ = avatar
    sets = tiny_settings(1, tmp_path / "run", train, max_steps=1)
    assert recipe.main(["--config", str(STAGE_CONFIGS[1]), *[a for s in sets for a in ("--set", s)]]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == {"final": str(tmp_path / "run" / "final"), "steps": 1, "examples": 4}
    with pytest.raises(SystemExit, match=r"error: .*unknown config key 'optim.lr'"):
        recipe.main(["--config", str(STAGE_CONFIGS[1]), "--set", "optim.lr=1e-4"])
    # A config written when every stage had a recipe module of its own still reads.
    old = tmp_path / "old.yaml"
    old.write_text("recipe: stage2_ccl\n" + STAGE_CONFIGS[2].read_text())
    assert load_train_config(old).to_dict() == load_train_config(STAGE_CONFIGS[2]).to_dict()


def test_stage_four_trains_on_text_dialogues_beside_the_rendered_ones(tmp_path, avatar, stage1_output):
    train, gold = avatar
    text = _ed_file(tmp_path / "ed.jsonl")
    config = tiny_config(4, tmp_path / "run", train, gold=gold, init=stage1_output, max_steps=2,
                         **{"data.text_train": str(text)})
    model = start_model(config, require_init=True)
    data = build_stage_data(config, model.processor, model.label_sets())
    media = len(data.train.dialogues)
    assert len(data.train.text_dialogues) == 2 and len(data.train) == media + 2
    result = train_loop(config, model, data)
    assert result.state.step == 2
    with pytest.raises(ConfigError, match="data.text_train: text dialogues join stage 4"):
        recipe.run(tiny_config(3, tmp_path / "run3", train, gold=gold, init=stage1_output, **{"data.text_train": str(text)}))


def test_finetuning_on_an_avatar_dataset_with_its_own_labels(tmp_path, stage1_output):
    labels_file = tmp_path / "labels.yaml"
    labels_file.write_text(
        "emotions: [calm, stressed, upbeat]\n"
        "profile: {gender: [male, female], accent: [us, uk]}\n"
        "emotion_fold: {excited: upbeat, sad: stressed, angry: stressed, afraid: stressed}\n"
    )
    labels = LabelSets.from_yaml(labels_file)
    profiles = {"gender": "female", "accent": "uk"}
    train = write_avatar_dataset(tmp_path / "data", listener=profiles)
    gold = extract_tiny_gold_features(train, tmp_path / "gold", labels=labels)
    config = tiny_config(
        "finetune", tmp_path / "run", train, gold=gold, init=stage1_output, **{"data.labels": str(labels_file)}
    )
    # Fine-tuning is stage 4 with the dataset's own labels.
    assert config.stage == 4 and config.data.labels == str(labels_file)
    assert load_train_config(STAGE_CONFIGS["finetune"]).data.labels is not None
    start = Empatheia.from_pretrained(stage1_output / "final")
    result = recipe.run(config)

    model = Empatheia.from_pretrained(tmp_path / "run" / "final")
    sd = model.config.style_disentangler
    assert sd.emotion_labels == ["calm", "stressed", "upbeat"]
    assert sd.profile_labels == {"gender": ["male", "female"], "accent": ["us", "uk"]}
    assert model.style_disentangler.emotion_classifier.out_features == 3
    assert set(model.style_disentangler.profile_classifiers) == {"gender", "accent"}
    losses = read_metrics(tmp_path / "run")
    assert "loss_cls_accent" in losses[0] and "loss_cls_age" not in losses[0]
    assert losses[-1]["loss"] < losses[0]["loss"]
    # The Content Synchronizer and the rest carried over from the starting model and trained on.
    assert not torch.equal(start.content_synchronizer.speech_out.weight, model.content_synchronizer.speech_out.weight)
    response = model.respond(Dialogue([Turn("speaker", "Work has been a lot lately.")]), max_new_tokens=4)
    assert response.emotion.label in {"calm", "stressed", "upbeat"}
    assert result.final_dir == tmp_path / "run" / "final"


def test_set_label_sets_keeps_the_rows_of_known_classes():
    model = Empatheia.from_preset("tiny")
    old = model.style_disentangler.emotion_classifier.weight.detach().clone()
    old_gender = model.style_disentangler.profile_classifiers["gender"].weight.detach().clone()
    model.set_label_sets(LabelSets(["happy", "calm", "sad"], {"gender": ["female", "male", "other"]}))
    new = model.style_disentangler.emotion_classifier.weight
    assert torch.equal(new[0], old[1]) and torch.equal(new[2], old[0])  # happy, sad kept
    gender = model.style_disentangler.profile_classifiers["gender"].weight
    assert torch.equal(gender[0], old_gender[1]) and torch.equal(gender[1], old_gender[0])
    assert gender.shape[0] == 3 and list(model.style_disentangler.profile_classifiers) == ["gender"]


# ---------------------------------------------------------------------- failures
def test_unknown_config_keys_and_bad_values_name_the_key(tmp_path):
    base = STAGE_CONFIGS[1]
    with pytest.raises(ConfigError, match=r"unknown config key 'optim.lr'; known keys: \[.*'optim.learning_rate'"):
        load_train_config(base, ["optim.lr=1e-4"])
    with pytest.raises(ConfigError, match=r"unknown config key 'optim.learning_rat'; did you mean 'optim.learning_rate'"):
        load_train_config(base, ["optim.learning_rat=1e-4"])
    with pytest.raises(ConfigError, match=r"unknown config key 'max_step'"):
        load_train_config(base, ["max_step=3"])
    with pytest.raises(ConfigError, match=r"max_steps must be an integer"):
        load_train_config(base, ["max_steps=three"])
    with pytest.raises(ConfigError, match=r"expected key=value"):
        load_train_config(base, ["max_steps"])
    assert load_train_config(base, ["optim.learning_rate=1e-4"]).optim.learning_rate == 1e-4  # YAML's "1e-4" string
    bad = tmp_path / "bad.yaml"
    bad.write_text("recipe: stage1_coe\nstage: 1\ndata: {train: x.jsonl, shuffle: true}\n")
    with pytest.raises(ConfigError, match=rf"{bad}: unknown config key 'data.shuffle'"):
        load_train_config(bad)


def test_deepspeed_files_that_contradict_the_stage_config_are_refused(tmp_path, avatar):
    from empatheia.training.distributed import deepspeed_config

    train, _ = avatar
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 8}))
    config = tiny_config(1, tmp_path / "run", train, deepspeed=str(ds))
    with pytest.raises(ConfigError, match=r"train_micro_batch_size_per_gpu is 8 but the stage config gives 4"):
        deepspeed_config(config, world_size=1, precision="no")
    ds.write_text(json.dumps({"optimizer": {"type": "Adam"}}))
    with pytest.raises(ConfigError, match=r"'optimizer' section"):
        deepspeed_config(config, world_size=1, precision="no")
    shipped = tiny_config(1, tmp_path / "run", train, deepspeed=str(STAGE_CONFIGS[1].parents[1] / "deepspeed/zero2.json"))
    resolved = deepspeed_config(shipped, world_size=2, precision="bf16")
    assert resolved["zero_optimization"]["stage"] == 2
    assert resolved["train_batch_size"] == 4 * 1 * 2 and resolved["bf16"]["enabled"] and not resolved["fp16"]["enabled"]


def test_precision_on_the_cpu_is_autocast_bf16_where_the_processor_has_it(tmp_path, avatar, monkeypatch):
    from empatheia.training import distributed
    from empatheia.training.distributed import autocast, deepspeed_precision, resolve_precision

    train, _ = avatar
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    auto = tiny_config(1, tmp_path / "run", train)
    for native, expected in ((True, "bf16"), (False, "no")):
        monkeypatch.setattr(distributed, "cpu_computes_bf16", lambda native=native: native)
        assert resolve_precision(auto, cpu) == expected
    assert resolve_precision(tiny_config(1, tmp_path / "run", train, mixed_precision="bf16"), gpu) == "bf16"
    assert load_train_config(STAGE_CONFIGS[1], ["mixed_precision=no"]).mixed_precision == "no"  # not YAML's false
    with pytest.raises(ConfigError, match="fp16 needs a GPU"):
        resolve_precision(tiny_config(1, tmp_path / "run", train, mixed_precision="fp16"), cpu)
    # DeepSpeed keeps fp32 weights on the CPU; the forward runs in bf16 under autocast.
    assert deepspeed_precision("bf16", cpu) == "no" and deepspeed_precision("bf16", gpu) == "bf16"
    a, b = torch.randn(4, 8), torch.randn(8, 2)
    with autocast("bf16", cpu):
        assert (a @ b).dtype == torch.bfloat16
    with autocast("no", cpu):
        assert (a @ b).dtype == torch.float32


def test_a_bf16_cpu_run_learns_in_bf16_and_keeps_fp32_weights(tmp_path, avatar, capsys, monkeypatch):
    train, _ = avatar
    seen = []
    scored = Empatheia.language_modeling_loss

    def record(self, hidden, labels):
        # The residual stream stays fp32 under autocast (only matmuls run in bf16), so
        # ask autocast itself.
        enabled = torch.is_autocast_enabled("cpu")
        seen.append(torch.get_autocast_dtype("cpu") if enabled else torch.float32)
        return scored(self, hidden, labels)

    monkeypatch.setattr(Empatheia, "language_modeling_loss", record)
    recipe.run(tiny_config(1, tmp_path / "fp32", train, mixed_precision="no", max_steps=1))
    assert set(seen) == {torch.float32}
    seen.clear()
    result = recipe.run(tiny_config(1, tmp_path / "run", train, mixed_precision="bf16"))
    assert set(seen) == {torch.bfloat16}  # the forward ran under autocast
    losses = [row["loss"] for row in read_metrics(tmp_path / "run")]
    assert "precision bf16" in capsys.readouterr().out
    assert losses[-1] < losses[0]
    assert all(v.dtype == torch.float32 for v in final_weights(tmp_path / "run").values() if v.is_floating_point())
    assert all(p.dtype == torch.float32 for p in result.model.parameters())


def test_table9_values_are_the_stage_defaults():
    for stage in (1, 2, 3, 4):
        optim = load_train_config(STAGE_CONFIGS[stage]).optim
        assert (optim.batch_size, optim.gradient_accumulation_steps) == (4, 8)
        assert (optim.learning_rate, optim.weight_decay) == (5e-5, 0.001)
        assert load_train_config(STAGE_CONFIGS[stage]).deepspeed == "configs/deepspeed/zero2.json"


def test_a_stage_without_previous_output_says_so(tmp_path, avatar):
    train, gold = avatar
    config = tiny_config(2, tmp_path / "run", train, gold=gold, init=tmp_path / "runs" / "stage1_coe")
    with pytest.raises(ConfigError, match=r"stage1_coe does not exist; stage 2 starts from the previous stage's output"):
        recipe.run(config)
    (tmp_path / "runs" / "stage1_coe" / "checkpoint-5").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"holds no trained model .* wrote no checkpoint, so there is nothing to resume"):
        recipe.run(config)
    (tmp_path / "runs" / "stage1_coe" / "checkpoint-5" / "trainer_state.json").write_text('{"step": 5}')
    with pytest.raises(ConfigError, match=r"holds no trained model .* stopped at checkpoint-5 before finishing: "
                                          r"continue it with `empatheia train .* --resume`"):
        recipe.run(config)
    with pytest.raises(ConfigError, match=r"model.init: stage 3 starts from the previous stage's output directory"):
        recipe.run(tiny_config(3, tmp_path / "run", train, gold=gold))


def test_a_previous_stage_of_another_preset_is_refused(tmp_path, avatar, stage1_output):
    train, gold = avatar
    config = tiny_config(2, tmp_path / "run", train, gold=gold, init=stage1_output, **{"model.preset": "paper"})
    with pytest.raises(ConfigError, match=r"model.preset is 'paper' but .* was trained from the 'tiny' preset"):
        recipe.run(config)


def test_data_without_the_stage_targets_is_refused(tmp_path, avatar, stage1_output):
    train, gold = avatar
    with pytest.raises(ConfigError, match=r"data.gold_features: stage 2 trains on gold generator features"):
        recipe.run(tiny_config(2, tmp_path / "run", train, init=stage1_output))
    test_form = tmp_path / "test.json"
    test_form.write_text(json.dumps([{"conversation_id": "00001", "turns": [{"turn_id": 0, "context": "c",
        "dialogue_history": [{"index": 0, "role": "speaker", "utterance": "I passed my exam!"}]}]}]))
    with pytest.raises(DataError, match=r"none of its 1 examples has what stage 1 trains on.*no gold response"):
        recipe.run(tiny_config(1, tmp_path / "run", test_form))
    # Gold features for only some examples: the first one without is named.
    partial = tmp_path / "partial.jsonl"
    lines = train.read_text().splitlines()
    partial.write_text("\n".join(lines + [lines[0].replace('"avatar/0"', '"avatar/new"')]) + "\n")
    with pytest.raises(DataError, match=r"record avatar/new, field 'gold features': has no gold features"):
        recipe.run(tiny_config(2, tmp_path / "run2", partial, gold=gold, init=stage1_output, **{"data.media_root": str(train.parent)}))
    result = recipe.run(tiny_config(2, tmp_path / "run3", partial, gold=gold, init=stage1_output, max_steps=1,
                                    **{"data.on_error": "skip", "data.media_root": str(train.parent)}))
    skipped = [json.loads(line) for line in (tmp_path / "run3" / "skipped.jsonl").read_text().splitlines()]
    assert [(s["record"], s["field"]) for s in skipped] == [("avatar/new", "gold features")]
    assert result.state.step == 1


def test_a_nan_loss_stops_naming_the_step_and_batch_and_keeps_the_last_checkpoint(tmp_path, avatar, monkeypatch):
    train, _ = avatar
    config = tiny_config(1, tmp_path / "run", train, max_steps=6, save_steps=2, **{"optim.batch_size": 2})
    forward = Empatheia.forward
    calls = []

    def failing_forward(self, batch, stage=None):
        out = forward(self, batch, stage)
        calls.append(batch["ids"])
        if len(calls) == 4:
            out["loss"] = out["loss"] * float("nan")
        return out

    monkeypatch.setattr(Empatheia, "forward", failing_forward)
    with pytest.raises(TrainingDiverged) as error:
        recipe.run(config)
    message = str(error.value)
    assert "at step 4 (micro-batch 1 of 1" in message and str(calls[3]) in message
    assert f"the last good checkpoint is {tmp_path / 'run' / 'checkpoint-2'}" in message
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-2"]
    assert not (tmp_path / "run" / "final").exists()


def test_an_existing_run_is_not_overwritten_and_resume_keeps_its_settings(tmp_path, avatar):
    train, _ = avatar
    recipe.run(tiny_config(1, tmp_path / "run", train, max_steps=2, save_steps=1))
    with pytest.raises(ConfigError, match=r"already holds checkpoint-2; pass --resume"):
        recipe.run(tiny_config(1, tmp_path / "run", train, max_steps=2))
    with pytest.raises(ConfigError, match=r"differs from this config in \['optim'\]"):
        recipe.run(tiny_config(1, tmp_path / "run", train, max_steps=4, **{"optim.learning_rate": 5e-3}), resume=True)
    # Growing max_steps continues the same run.
    result = recipe.run(tiny_config(1, tmp_path / "run", train, max_steps=4, save_steps=1), resume=True)
    assert result.state.step == 4
    assert [row["step"] for row in read_metrics(tmp_path / "run")] == [1, 2, 3, 4]


def test_resume_drops_a_torn_last_metrics_line_and_names_a_torn_earlier_one(tmp_path, avatar):
    """A kill or a full disk can cut the last line of metrics.jsonl; resuming drops it (and
    logs those steps again). A broken line before the last is an error naming the file."""
    from empatheia.cli import main

    train, _ = avatar
    recipe.run(tiny_config(1, tmp_path / "run", train, max_steps=2, save_steps=1))
    metrics = tmp_path / "run" / "metrics.jsonl"
    good = metrics.read_text()
    metrics.write_text(good + '{"step": 3, "split": "tr')
    result = recipe.run(tiny_config(1, tmp_path / "run", train, max_steps=3, save_steps=1), resume=True)
    assert result.state.step == 3 and [row["step"] for row in read_metrics(tmp_path / "run")] == [1, 2, 3]
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], "not json", *lines[1:]]) + "\n")
    config = tmp_path / "run" / "train_config.yaml"
    with pytest.raises(SystemExit, match=r"metrics.jsonl.*line 2 is not a metrics record"):
        main(["train", str(config), "--set", "max_steps=4", "--resume"])


def test_evaluation_tensorboard_and_what_a_crash_mid_write_leaves(tmp_path, avatar, stage1_output):
    from empatheia.training import latest_checkpoint

    train, gold = avatar
    out = tmp_path / "run"
    config = tiny_config(3, out, train, gold=gold, init=stage1_output, max_steps=4, save_steps=2, eval_steps=2,
                         tensorboard=True, **{"data.eval": str(train), "data.eval_gold_features": str(gold)})
    recipe.run(config)
    evals = read_metrics(out, "eval")
    assert [row["step"] for row in evals] == [2, 4]
    assert {"loss", "loss_sac", "loss_sal", "loss_cls_emotion", "kl_style"} <= set(evals[0])
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert (out / "checkpoint-4" / "model" / "empatheia.safetensors").is_file()
    assert Empatheia.from_pretrained(out / "checkpoint-4" / "model") is not None

    # A run killed while writing checkpoint 6 leaves a hidden folder; one without its
    # state file is not complete either. Neither is taken for the newest checkpoint.
    (out / ".checkpoint-6.tmp" / "model").mkdir(parents=True)
    (out / "checkpoint-5" / "model").mkdir(parents=True)
    assert latest_checkpoint(out).name == "checkpoint-4"
    result = recipe.run(tiny_config(3, out, train, gold=gold, init=stage1_output, max_steps=6, save_steps=2,
                                    eval_steps=2, **{"data.eval": str(train), "data.eval_gold_features": str(gold)}),
                        resume=True)
    assert result.state.step == 6 and not (out / ".checkpoint-6.tmp").exists()
    assert [row["step"] for row in read_metrics(out, "eval")] == [2, 4, 6]


def test_a_media_cache_is_filled_once_and_gives_the_same_training(tmp_path, avatar, stage1_output):
    train, gold = avatar
    # In fp32, so that "the same" is exact: bf16 rounding differs with the batch's layout.
    fp32 = {"mixed_precision": "no"}
    recipe.run(tiny_config(3, tmp_path / "plain", train, gold=gold, init=stage1_output, max_steps=3, **fp32))
    cache = tmp_path / "cache"
    recipe.run(tiny_config(3, tmp_path / "cached", train, gold=gold, init=stage1_output, max_steps=3, **fp32,
                           **{"data.media_cache": str(cache)}))
    stored = {path: path.stat().st_mtime_ns for path in cache.rglob("*.safetensors")}
    assert len(stored) >= 8  # every turn's audio and video of the four dialogues
    recipe.run(tiny_config(3, tmp_path / "again", train, gold=gold, init=stage1_output, max_steps=3, **fp32,
                           **{"data.media_cache": str(cache)}))
    # The third run read every feature: nothing was encoded or written again.
    assert {path: path.stat().st_mtime_ns for path in cache.rglob("*.safetensors")} == stored
    losses = [[r["loss"] for r in read_metrics(tmp_path / name)] for name in ("plain", "cached", "again")]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5) and losses[2] == pytest.approx(losses[0], rel=1e-5)
    # Attention key biases get only rounding noise as gradient (softmax ignores a shift
    # shared by all keys), which Adam scales up to lr-sized steps; everything else agrees
    # to float precision.
    for key, value in final_weights(tmp_path / "plain").items():
        tolerance = 1e-3 if key.endswith("in_proj_bias") else 1e-5
        torch.testing.assert_close(final_weights(tmp_path / "again")[key], value, rtol=1e-5, atol=tolerance)


def _join_a_group_and_report(queue) -> None:
    from empatheia.training.distributed import init_processes

    try:
        info = init_processes()
        queue.put((info.rank, info.world_size, os.environ["MASTER_PORT"]))
    except Exception as error:  # reported, so the test fails with the child's error
        queue.put(repr(error))


def test_a_process_spawned_after_training_starts_a_lone_group_of_its_own():
    """`training/small_preset.py` spawns each stage from a process that may have trained
    already (a notebook, this suite): the child inherits MASTER_PORT, which the parent's
    group still listens on, and must not try to bind it."""
    import multiprocessing

    from empatheia.training.distributed import init_processes

    init_processes()  # this process's own lone group, as after any training run here
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_join_a_group_and_report, args=(queue,))
    child.start()
    reported = queue.get(timeout=300)
    child.join(timeout=60)
    assert isinstance(reported, tuple), reported
    rank, world_size, port = reported
    assert (rank, world_size) == (0, 1) and port != os.environ["MASTER_PORT"]
    assert child.exitcode == 0


def test_the_environments_ninja_comes_first_on_the_path(tmp_path, monkeypatch):
    """DeepSpeed builds its CPU collective with the first ``ninja`` on PATH: a process that
    finds the system's where another found the environment's rebuilt it (24 s on 2 cores
    here), and one that finds none could not train. Every CPU group starts with the
    environment's first."""
    import shutil
    import sysconfig

    from empatheia.training.distributed import use_this_environments_ninja

    scripts = sysconfig.get_path("scripts")
    ours = shutil.which("ninja", path=scripts)
    if ours is None:
        pytest.skip("no ninja installed with this environment (DeepSpeed installs one)")
    system = tmp_path / "system"
    system.mkdir()
    (system / "ninja").write_text("#!/bin/sh\n")
    (system / "ninja").chmod(0o755)
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (str(system), str(empty)):  # another ninja first; none at all
        monkeypatch.setenv("PATH", path)
        use_this_environments_ninja()
        assert shutil.which("ninja") == ours and os.environ["PATH"] == f"{scripts}{os.pathsep}{path}"
    first = f"{scripts}{os.pathsep}{system}"
    monkeypatch.setenv("PATH", first)
    use_this_environments_ninja()
    assert os.environ["PATH"] == first  # already first: left as it is

    # A CPU process group puts it first before DeepSpeed starts (a group of one here,
    # which this process may already hold: it is not started again).
    from empatheia.training import distributed

    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", os.environ.get("MASTER_PORT", "29500"))):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("EMPATHEIA_LONE_GROUP", raising=False)
    monkeypatch.setattr(distributed.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 1)
    monkeypatch.setenv("PATH", str(system))
    assert distributed.init_processes().device.type == "cpu"
    assert shutil.which("ninja") == ours


_ORPHAN_SCRIPT = """
import os, sys, time, multiprocessing
from empatheia.recipes.small_preset import _exit_with_parent

def stage(path):
    _exit_with_parent()
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(300)

if __name__ == "__main__":
    child = multiprocessing.get_context("spawn").Process(target=stage, args=(sys.argv[1],))
    child.start()
    child.join()
"""


def _running(pid: int) -> bool:
    try:
        state = [line for line in open(f"/proc/{pid}/status") if line.startswith("State:")][0]
    except (FileNotFoundError, IndexError):
        return False
    return "zombie" not in state  # "State:\tZ (zombie)": ended, not yet reaped


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process states from /proc")
def test_a_stage_process_ends_when_its_recipe_is_killed(tmp_path):
    """`kill` on the recipe's process must not leave its stage training unseen, holding
    the memory a resumed run needs."""
    import subprocess
    import time

    script, pid_file, log = tmp_path / "recipe.py", tmp_path / "stage.pid", tmp_path / "stderr.txt"
    script.write_text(_ORPHAN_SCRIPT)
    with open(log, "w") as stderr:
        recipe_process = subprocess.Popen([sys.executable, str(script), str(pid_file)], stderr=stderr)
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        stage_pid = int(pid_file.read_text())
        assert _running(stage_pid)
        recipe_process.kill()  # SIGKILL: the recipe runs no clean-up of its own
        recipe_process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _running(stage_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(stage_pid), "the stage kept running after its recipe was killed"
        assert f"the recipe (pid {recipe_process.pid}) ended" in log.read_text()
    finally:
        recipe_process.kill()
        if pid_file.is_file() and pid_file.read_text() and _running(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), 9)


def test_stage_processes_preload_jemalloc_where_asked_and_found(monkeypatch):
    """The recipe's allocator choice: LD_PRELOAD of the library ctypes finds, added to any
    preload already set; jemalloc taken out for the system allocator; nothing where the
    preload is already so; a clear error when jemalloc is asked for and missing."""
    import ctypes.util

    from empatheia.recipes.small_preset import allocator_environment

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "libjemalloc.so.2" if name == "jemalloc" else None)
    assert allocator_environment("auto") == allocator_environment("jemalloc") == {"LD_PRELOAD": "libjemalloc.so.2"}
    assert allocator_environment("system") == {}
    monkeypatch.setenv("LD_PRELOAD", "libasan.so")
    assert allocator_environment("auto") == {"LD_PRELOAD": "libasan.so:libjemalloc.so.2"}
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")
    assert allocator_environment("jemalloc") == {}
    monkeypatch.setenv("LD_PRELOAD", "libasan.so /usr/lib/libjemalloc.so.2")
    assert allocator_environment("system") == {"LD_PRELOAD": "libasan.so"}
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert allocator_environment("auto") == {}
    with pytest.raises(FileNotFoundError, match="apt-get install libjemalloc2"):
        allocator_environment("jemalloc")
    with pytest.raises(ValueError, match="expected one of auto, jemalloc, system"):
        allocator_environment("tcmalloc")


_MAPS_SCRIPT = """
import os, multiprocessing
from empatheia.recipes.small_preset import _environment, allocator_environment

def stage(queue):
    queue.put(open("/proc/self/maps").read())

if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=stage, args=(queue,))
    with _environment(allocator_environment("jemalloc")):
        child.start()
    maps = queue.get(timeout=120)
    child.join()
    print("child maps jemalloc:", "libjemalloc" in maps)
    print("recipe preloads:", os.environ.get("LD_PRELOAD"))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD and /proc are Linux's")
def test_a_stage_process_runs_on_jemalloc_and_the_recipe_does_not(tmp_path):
    """A stage process started as the recipe starts one has jemalloc mapped; the recipe's
    own environment is left as it was. `make test` installs libjemalloc2 (Debian)."""
    import ctypes.util
    import subprocess

    if ctypes.util.find_library("jemalloc") is None:
        pytest.skip("no jemalloc library installed (make test installs libjemalloc2 where apt-get works)")
    script = tmp_path / "recipe.py"
    script.write_text(_MAPS_SCRIPT)
    env = {name: value for name, value in os.environ.items() if name != "LD_PRELOAD"}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert "child maps jemalloc: True" in result.stdout
    assert "recipe preloads: None" in result.stdout


def test_heads_and_projectors_can_train_at_their_own_rate():
    from empatheia import Empatheia
    from empatheia.training.config import TrainConfig
    from empatheia.training.loop import _optimizer

    model = Empatheia.from_preset("tiny").set_stage(4)
    config = TrainConfig(stage=4)
    config.optim.learning_rate, config.optim.head_learning_rate = 1e-4, 5e-4
    optimizer = _optimizer(model, config)
    rate = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    groups = model.parameter_groups()
    assert {rate[id(p)] for key in ("projectors", "content_synchronizer", "style_disentangler") for _, p in groups[key]} == {5e-4}
    assert {rate[id(p)] for key in ("lora", "signal_rows") for _, p in groups[key]} == {1e-4}
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert sorted(rate) == sorted(id(p) for p in trainable)  # every trainable parameter, once
    config.optim.head_learning_rate = None
    assert {g["lr"] for g in _optimizer(model, config).param_groups} == {1e-4}


def test_media_are_cached_outside_cpu_autocast(monkeypatch):
    # bf16 autocast on the CPU wraps the training forward; the media cache's encoders must
    # run outside it (Whisper's mel front end failed on a bf16 tensor in stage 3).
    from types import SimpleNamespace

    from empatheia.training import loop

    seen = []

    class Cache:
        def complete(self, batch, model):
            seen.append(torch.is_autocast_enabled("cpu"))
            return batch

    data = SimpleNamespace(train=SimpleNamespace(media_cache=Cache()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loop._encode_media({"ids": ["a"]}, data, None, {"zero_optimization": {"stage": 0}})
        assert torch.is_autocast_enabled("cpu")
    assert seen == [False]
