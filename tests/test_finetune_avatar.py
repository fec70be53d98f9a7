"""Fine-tuning on your own avatar (issue 26), the training side: what a new user with a
dozen dialogues of their own met following docs/training.md, one defect at a time. The whole
documented path, run as written, is tests/test_finetune_docs.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from empatheia import Empatheia
from empatheia.labels import EMOTION_FOLD, EMOTION_LABELS, LabelSets, UnknownEmotionError

REPO = Path(__file__).resolve().parents[1]

USER_LABELS = dict(emotions=["calm", "stressed", "upbeat"], profile={"gender": ["male", "female"], "accent": ["us", "uk"]},
                   emotion_fold={"worried": "stressed", "relaxed": "calm", "happy": "upbeat", "fear": "stressed"})


# ---------------------------------------------------------------------- 6: the emotion fold
def test_a_users_fold_extends_the_built_in_one():
    labels = LabelSets(**USER_LABELS)
    # Their own names and fold first...
    assert labels.emotion_class("Worried") == "stressed" and labels.emotion_class("calm") == "calm"
    # ...then ED's labels through the built-in fold, whose class the user's fold maps.
    for label in ("anxious", "afraid", "terrified", "Apprehensive."):
        assert labels.emotion_class(label) == "stressed"
    assert labels.emotion_class("joyful") == "upbeat" and labels.emotion_index("excited") == 2
    # A built-in class that the user's fold does not map ends nowhere among their emotions.
    with pytest.raises(UnknownEmotionError) as error:
        labels.emotion_class("devastated")
    message = str(error.value)
    assert "'devastated'" in message and "['calm', 'stressed', 'upbeat']" in message
    assert "worried" in message and "fear" in message and "32 EmpatheticDialogues" not in message


def test_a_replacing_fold_is_the_only_one_and_its_error_lists_what_it_knows(tmp_path):
    path = tmp_path / "labels.yaml"
    path.write_text("emotions: [calm, stressed, upbeat]\nemotion_fold: {worried: stressed, fear: stressed}\n"
                    "emotion_fold_replace: true\n")
    labels = LabelSets.from_yaml(path)
    assert labels.emotion_fold_replace and labels.emotion_class("worried") == "stressed"
    with pytest.raises(UnknownEmotionError, match=r"unknown emotion 'anxious': .*\['calm', 'stressed', 'upbeat'\].*worried"):
        labels.emotion_class("anxious")
    with pytest.raises(ValueError, match="emotion_fold_replace must be true or false"):
        LabelSets(emotion_fold_replace="yes")


def test_a_long_list_of_known_labels_is_shortened():
    many = {f"word{i}": "calm" for i in range(40)}
    with pytest.raises(UnknownEmotionError) as error:
        LabelSets(["calm"], {}, many, emotion_fold_replace=True).emotion_class("bananas")
    assert "and 28 more" in str(error.value) and "word39" not in str(error.value)


def test_default_label_sets_fold_as_before():
    labels = LabelSets()
    assert {label: labels.emotion_class(label) for label in EMOTION_FOLD} == EMOTION_FOLD
    assert [labels.emotion_index(name) for name in EMOTION_LABELS] == list(range(7))
    with pytest.raises(UnknownEmotionError, match="'neutral'"):
        labels.emotion_class("neutral")


def test_a_saved_model_keeps_a_replacing_fold(tmp_path):
    model = Empatheia.from_preset("tiny")
    model.set_label_sets(LabelSets(**{**USER_LABELS, "emotion_fold_replace": True}))
    model.save_pretrained(tmp_path / "model")
    labels = Empatheia.from_pretrained(tmp_path / "model").label_sets()
    assert labels.emotion_fold_replace and labels.emotion_class("worried") == "stressed"
    with pytest.raises(UnknownEmotionError):
        labels.emotion_class("anxious")
    model.set_label_sets(LabelSets(**USER_LABELS))
    assert model.label_sets().emotion_class("anxious") == "stressed"


# ---------------------------------------------------------------------- 4: any profile attribute
def _style_output(model: Empatheia, batch_size: int = 2):
    """The Style Disentangler's output on random signal states ``(B, n, H)``."""
    n, hidden = len(model.token_ids.audio_signals), model._hf_model().config.hidden_size
    generator = torch.Generator().manual_seed(0)
    return model.style_disentangler(torch.randn(batch_size, n, hidden, generator=generator),
                                    torch.randn(batch_size, n, hidden, generator=generator))


def _style_batch(model: Empatheia, attributes, batch_size: int = 2) -> dict:
    sd = model.config.style_disentangler
    batch = {"speech_style_target": torch.zeros(batch_size, sd.speech_style_dim),
             "video_style_target": torch.zeros(batch_size, sd.video_style_dim),
             "emotion_label": torch.zeros(batch_size, dtype=torch.long)}
    return {**batch, **{f"{name}_label": torch.zeros(batch_size, dtype=torch.long) for name in attributes}}


def test_style_losses_train_the_attributes_a_batch_labels_and_name_those_it_cannot():
    model = Empatheia.from_preset("tiny")  # classifies age, gender and timbre
    style = _style_output(model)
    # Data without an attribute's labels (the user's labels drop age and timbre): nothing to learn for them.
    terms = model.style_losses(style, _style_batch(model, ["gender"]))
    assert "loss_cls_gender" in terms and "loss_cls_age" not in terms
    assert torch.allclose(terms["loss_cls"], terms["loss_cls_emotion"] + terms["loss_cls_gender"])
    # Labels of an attribute the classifiers do not have (accent) are not dropped in silence.
    with pytest.raises(ValueError, match=r"labels of profile attribute\(s\) \['accent'\].*classif.*"
                                         r"\['age', 'gender', 'timbre'\].*set_label_sets.*data\.labels") as error:
        model.style_losses(style, _style_batch(model, ["gender", "accent"]))
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------------- helpers: tiny runs
USER_LABELS_YAML = ("emotions: [calm, stressed, upbeat]\nprofile: {gender: [male, female], accent: [us, uk]}\n"
                    "emotion_fold: {excited: upbeat, sad: stressed, angry: stressed, afraid: stressed}\n")


@pytest.fixture(scope="module")
def user_data(tmp_path_factory):
    """The four generated dialogues of the training tests, their listener with an accent and
    no age or timbre, the user's labels file and tiny gold features: ``(train, labels, gold)``."""
    from .training_helpers import extract_tiny_gold_features, write_avatar_dataset

    root = tmp_path_factory.mktemp("user")
    train = write_avatar_dataset(root, listener={"gender": "female", "accent": "uk"})
    labels = root / "labels.yaml"
    labels.write_text(USER_LABELS_YAML)
    return train, labels, extract_tiny_gold_features(train, root / "gold", labels=LabelSets.from_yaml(labels))


KEEP = object()
"""A ``_finetune_config`` value: keep the packaged config's own value of that key."""


def _finetune_config(tmp_path, user_data, stage="finetune", run="run", **extra):
    """The packaged fine-tuning (or stage) config as a seconds-long tiny run on ``user_data``,
    starting from the tiny preset's model."""
    from empatheia.training import load_train_config

    from .training_helpers import STAGE_CONFIGS, tiny_settings

    train, labels, gold = user_data
    sets = {"model.init": "tiny", "model.preset": None, "data.labels": str(labels), "max_steps": 2, **extra}
    kept = {key for key, value in sets.items() if value is KEEP}
    items = tiny_settings(stage, tmp_path / run, train, gold=gold, **{k: v for k, v in sets.items() if k not in kept})
    return load_train_config(STAGE_CONFIGS[stage], [item for item in items if item.partition("=")[0] not in kept])


# ---------------------------------------------------------------------- 4 (continued): every stage
@pytest.mark.parametrize("stage", ["stage3", "stage4"])
def test_every_stage_trains_the_users_profile_attributes(stage, tmp_path, user_data):
    from empatheia.recipes import recipe

    from .training_helpers import read_metrics

    recipe.run(_finetune_config(tmp_path, user_data, stage=int(stage[-1])))
    first = read_metrics(tmp_path / "run")[0]
    assert "loss_cls_accent" in first and "loss_cls_age" not in first and "loss_cls_timbre" not in first
    saved = Empatheia.from_pretrained(tmp_path / "run" / "final").label_sets()
    assert saved.profile == {"gender": ["male", "female"], "accent": ["us", "uk"]}


# ---------------------------------------------------------------------- 2: where fine-tuning starts
def test_model_init_names_a_presets_trained_model(tmp_path, user_data, monkeypatch):
    from empatheia.training import ConfigError, start_model

    model = start_model(_finetune_config(tmp_path, user_data), require_init=True)
    assert model.config.preset == "tiny"
    # small: the model Empatheia.from_preset("small") gives, with the weights the package ships.
    calls = []
    monkeypatch.setattr(Empatheia, "from_preset", classmethod(lambda cls, name, overrides=None, dtype=None, trained=True:
                                                              calls.append((name, trained)) or model))
    start_model(_finetune_config(tmp_path, user_data, **{"model.init": "small"}), require_init=True)
    assert calls == [("small", True)]
    with pytest.raises(ConfigError, match=r"model.init is the 'small' preset but model.preset is 'tiny'"):
        start_model(_finetune_config(tmp_path, user_data, **{"model.init": "small", "model.preset": "tiny"}), True)
    # A folder of that name is what it names.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"model.init: small holds no trained model"):
        (tmp_path / "small").mkdir()
        start_model(_finetune_config(tmp_path, user_data, **{"model.init": "small"}), require_init=True)


def test_the_finetuning_config_starts_from_small_and_runs_on_a_cpu(tmp_path, monkeypatch):
    from empatheia.training import load_train_config
    from empatheia.training.distributed import deepspeed_config, resolve_precision

    monkeypatch.chdir(tmp_path)  # a user's folder, outside the repository
    config = load_train_config("configs/train/finetune_avatar.yaml")
    assert (config.model.init, config.model.preset, config.model.dtype) == ("small", None, None)
    assert config.data.labels == "my_avatar/labels.yaml" and config.data.train == "my_avatar/train.jsonl"
    optim = config.optim
    assert optim.head_learning_rate is not None and optim.head_learning_rate >= 5 * optim.learning_rate
    assert optim.warmup_steps <= config.max_steps // 10
    cpu = torch.device("cpu")
    assert resolve_precision(config, cpu) in ("bf16", "no")
    assert deepspeed_config(config, 1, "no")["zero_optimization"]["stage"] == 2


def test_the_finetuning_defaults_let_resized_classifiers_learn(tmp_path, user_data):
    """20 steps at the config's own learning rates and schedule move the new classifiers
    (2e-5 and 50 warm-up steps for everything left their loss within 1 % of where it
    started; these defaults take it down by about a quarter on the tiny preset)."""
    from empatheia.recipes import recipe

    from .training_helpers import read_metrics

    recipe.run(_finetune_config(tmp_path, user_data, **{
        "max_steps": 20, "optim.learning_rate": KEEP, "optim.head_learning_rate": KEEP, "optim.warmup_steps": KEEP,
        "optim.scheduler": KEEP, "optim.batch_size": 4, "optim.gradient_accumulation_steps": 1,
        "data.media_cache": str(tmp_path / "cache")}))
    rows = read_metrics(tmp_path / "run")
    first, last = rows[0]["loss_cls_emotion"], sum(r["loss_cls_emotion"] for r in rows[-3:]) / 3
    assert last < 0.85 * first, (first, last)


# ---------------------------------------------------------------------- 3: from any folder
def test_a_config_path_from_the_docs_finds_the_packaged_config_from_any_folder(tmp_path, monkeypatch):
    from empatheia.training import ConfigError, load_train_config

    monkeypatch.chdir(tmp_path)
    config = load_train_config("configs/train/stage3_sac.yaml", ["data.train=mine.jsonl"])
    assert config.stage == 3 and config.data.train == "mine.jsonl"  # user paths stay relative to here
    assert load_train_config("train/finetune_avatar.yaml").stage == 4
    # A file of that path here is the one read.
    (tmp_path / "configs" / "train").mkdir(parents=True)
    (tmp_path / "configs" / "train" / "stage3_sac.yaml").write_text("stage: 2\ndata: {train: here.jsonl}\n")
    assert load_train_config("configs/train/stage3_sac.yaml").stage == 2
    with pytest.raises(ConfigError, match=r"configs/train/stage9\.yaml not found in .*nor among the configs the "
                                          r"package ships \(train/stage9\.yaml in empatheia\.configs\)"):
        load_train_config("configs/train/stage9.yaml")


# ---------------------------------------------------------------------- 5: a failed run
def _fail_at_step(monkeypatch, step: int):
    """Make the model's forward raise at optimizer step ``step`` (1-based), as a bug would."""
    calls = {"n": 0}
    forward = Empatheia.forward

    def failing(self, batch, stage=None):
        calls["n"] += 1
        if calls["n"] >= step:
            raise RuntimeError("boom in the forward")
        return forward(self, batch, stage)

    monkeypatch.setattr(Empatheia, "forward", failing)


def test_a_run_that_failed_before_any_checkpoint_is_reported_as_failed_not_resumable(tmp_path, user_data, monkeypatch):
    from empatheia.recipes import recipe
    from empatheia.training import ConfigError, start_model

    config = _finetune_config(tmp_path, user_data)
    with monkeypatch.context() as patch:
        _fail_at_step(patch, 1)
        with pytest.raises(RuntimeError, match="boom"):
            recipe.run(config)
    run = tmp_path / "run"
    assert not (run / "final").exists() and not list(run.glob("checkpoint-*"))
    # The next stage names the failure and how to run it again; there is nothing to resume.
    following = _finetune_config(tmp_path, user_data, run="next", **{"model.init": str(run)})
    with pytest.raises(ConfigError) as error:
        start_model(following, require_init=True)
    message = str(error.value)
    assert "failed at step 0 with RuntimeError: boom in the forward" in message
    assert "nothing to resume" in message and f"empatheia train {run / 'train_config.yaml'}" in message
    assert "--resume" not in message and "\n" not in message
    # Run again (as the message says, or with --resume): it trains, and the record is gone.
    result = recipe.run(config, resume=True)
    assert result.final_dir.is_dir() and not (run / "failed.json").exists()


def test_a_run_that_failed_after_a_checkpoint_says_where_to_resume(tmp_path, user_data, monkeypatch):
    from empatheia.recipes import recipe
    from empatheia.training import ConfigError, start_model

    config = _finetune_config(tmp_path, user_data, **{"max_steps": 3, "save_steps": 1})
    with monkeypatch.context() as patch:
        _fail_at_step(patch, 2)
        with pytest.raises(RuntimeError, match="boom"):
            recipe.run(config)
    run = tmp_path / "run"
    following = _finetune_config(tmp_path, user_data, run="next", **{"model.init": str(run)})
    with pytest.raises(ConfigError, match=r"failed at step 1 with RuntimeError: boom in the forward; its last complete "
                                          r"checkpoint is checkpoint-1: fix the cause, then continue it with "
                                          r"`empatheia train .*train_config\.yaml --resume`"):
        start_model(following, require_init=True)
    assert recipe.run(config, resume=True).state.step == 3


# ---------------------------------------------------------------------- 8: features of another preset
def test_gold_features_of_another_presets_sizes_are_refused_naming_the_fix(tmp_path, user_data):
    from empatheia.recipes import recipe
    from empatheia.training import ConfigError

    train, labels, gold = user_data
    config = _finetune_config(tmp_path, user_data, **{"model.overrides": {"style_disentangler.speech_style_dim": 16,
                                                                           "content_synchronizer.video_content_dim": 32}})
    with pytest.raises(ConfigError) as error:
        recipe.run(config)
    message = str(error.value)
    assert message.startswith(f"data.gold_features: {gold} holds gold features of other sizes")
    assert "speech_style 16 values (found 12)" in message and "video_content 32 values (found 20)" in message
    assert (f"Re-extract them into a new folder with `empatheia data extract-features {train} --labels {labels} "
            f"--out {gold}-tiny --generators-of tiny`") in message
    assert "\n" not in message


# ---------------------------------------------------------------------- 7: Whisper under autocast
def test_the_small_speech_encoder_gives_fp32_frames_under_cpu_bf16_autocast():
    from empatheia.config import EmpatheiaConfig
    from empatheia.encoders import SpeechEncoder
    from empatheia.media import load_audio

    from .conftest import shared_data

    encoder = SpeechEncoder(EmpatheiaConfig.from_preset("small").speech_encoder)  # Whisper tiny.en in CTranslate2
    assert encoder.config.backend == "whisper_ct2"
    wave = load_audio(shared_data("media/speech/happy.wav"), 16000)[: 16000 * 2]
    waves = torch.stack([wave, torch.cat([wave[:16000], torch.zeros(16000)])])  # (2, T)
    lengths = torch.tensor([wave.shape[0], 16000])
    plain = encoder(waves, lengths)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = encoder(waves, lengths)
    assert mixed.dtype == torch.float32 and torch.equal(mixed, plain)


# ---------------------------------------------------------------------- 1: the documented extraction
def test_the_docs_extract_gold_features_with_extractors_that_exist(tmp_path):
    import importlib.util

    from empatheia.cli import main

    for name in ("training.md", "data.md"):
        text = (REPO / "docs" / name).read_text()
        for module in re.findall(r"--extractor\s+([a-z_][\w.]*):\w+", text):  # MODULE:NAME is a placeholder
            assert importlib.util.find_spec(module) is not None, f"docs/{name}: --extractor {module}:... does not exist"
        commands = re.findall(r"^empatheia data extract-features (?:\\\n|[^\n])*", text, re.M)
        assert commands and all("--generators-of" in command for command in commands), (name, commands)
    training = (REPO / "docs" / "training.md").read_text()
    assert "--generators-of small" in training[training.index("## Fine-tuning on your own avatar"):]
    # A module that does not exist points to the generators' own features.
    with pytest.raises(SystemExit, match=r"--extractor 'my_extractors:all': No module named 'my_extractors'; .*"
                                         r"--generators-of small"):
        main(["data", "extract-features", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "gold"),
              "--extractor", "my_extractors:all"])
