"""Early fusion on the tiny preset: InfoNCE on hand-computed cases, the joint embedding
binding one utterance's modalities, both stages end to end, and QLoRA's clear refusal
without a GPU."""

from __future__ import annotations

import math

import pytest
import torch

from empatheia.config import EmpatheiaConfig
from empatheia.data import read_dataset
from empatheia.prompts import PromptMode
from empatheia.language_model import build_language_model, build_tokenizer, special_token_ids
from empatheia.variants.build import build_trained_variant
from empatheia.variants.early_fusion import EarlyFusionOptions, EarlyFusionSystem, JointEmbedding, info_nce
from empatheia.variants.models import build_variant_model, load_variant_model
from empatheia.variants.prefix import UtteranceDataset

from .training_helpers import read_metrics
from .variant_helpers import train_stage, write_speaker_dataset


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    return write_speaker_dataset(tmp_path_factory.mktemp("fusion_data"))


def test_info_nce_on_a_hand_computed_case():
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    b = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    # logits = s * a b^T = [[s, 0], [0, s]]: each row's loss is -log(e^s / (e^s + 1)), both ways.
    s = torch.tensor(2.0)
    expected = -math.log(math.exp(2.0) / (math.exp(2.0) + 1.0))
    assert info_nce(a, b, s).item() == pytest.approx(expected)
    # Swapped partners: the right one is now the far one.
    assert info_nce(a, b.flip(0), s).item() == pytest.approx(-math.log(1.0 / (math.exp(2.0) + 1.0)))


def test_fusion_sums_the_modalities_a_row_has():
    embeddings = {"audio": torch.tensor([[1.0, 0.0], [1.0, 0.0]]), "video": torch.tensor([[0.0, 2.0], [0.0, 2.0]])}
    present = {"audio": torch.tensor([True, True]), "video": torch.tensor([True, False])}
    assert torch.equal(JointEmbedding.fuse(embeddings, present), torch.tensor([[1.0, 2.0], [1.0, 0.0]]))


def test_the_modalities_option_chooses_the_heads():
    model = build_variant_model("early_fusion", "tiny", {"modalities": ["audio", "video"]})
    assert set(model.joint.heads) == {"audio", "video"}
    with pytest.raises(ValueError, match="modalities must be some of"):
        EarlyFusionOptions(modalities=["smell"])


def test_the_joint_embedding_binds_each_utterances_modalities(train):
    torch.manual_seed(0)
    model = build_variant_model("early_fusion", "tiny")
    model.set_stage("early_fusion_joint")
    corpus = read_dataset(train, labels=model.label_sets())
    dataset = UtteranceDataset(corpus.dialogues, model.processor, "early_fusion_joint", model.label_sets())
    batch = dataset.collator()([dataset[i] for i in range(len(dataset))])
    features, present = model.utterance_features(batch)

    def matched() -> float:
        """How often audio picks its own utterance's video among all eight."""
        with torch.no_grad():
            embeddings = model.joint(features)
        return float((embeddings["audio"] @ embeddings["video"].T).argmax(1).eq(torch.arange(8)).float().mean())

    optimizer = torch.optim.Adam(model.joint.parameters(), lr=1e-2)
    first = None
    for _ in range(60):
        loss = model.joint.contrastive_loss(model.joint(features), present)
        first = first if first is not None else float(loss.detach())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(loss.detach()) < 0.5 * first
    assert matched() >= 0.75  # chance: 1 in 8


def test_both_stages_train_save_load_and_answer(train, tmp_path):
    joint = train_stage("early_fusion_joint", tmp_path / "joint", train, **{"optim.batch_size": 8})
    assert "loss_joint" in read_metrics(joint.parent)[0]
    text = train_stage("early_fusion_text", tmp_path / "text", train, init=joint.parent)
    assert "loss_emp" in read_metrics(text.parent)[0]
    before, after = load_variant_model(joint), load_variant_model(text)
    assert before.core.config.language_model.lora.r == 8  # the paper's LoRA, from the first stage on
    moved = {after.group_of(n) for n, v in after.trained_state_dict().items()
             if not torch.equal(v, before.trained_state_dict()[n])}
    assert moved == {"lora", "soft_prompts"}  # the joint embedding stays as stage 1 left it
    system = build_trained_variant("early_fusion", checkpoint=text)
    assert isinstance(system, EarlyFusionSystem)
    dialogues = read_dataset(train).dialogues[:2]
    prefix = system.fusion.prefix(system.fusion.inference_batch(dialogues, PromptMode.PIPELINE))
    assert prefix.shape == (2, 4, system.config.language_model.hidden_size)
    for response in system.respond(dialogues, max_new_tokens=6):
        assert response.system == "Early fusion" and response.emotion.label in system.styles.speech


def test_qlora_without_a_gpu_is_a_clear_error():
    config = EmpatheiaConfig.from_preset("tiny", {"language_model.load_in_4bit": True,
                                                  "language_model.pretrained": "some/model"})
    tokenizer = build_tokenizer(EmpatheiaConfig.from_preset("tiny").language_model)
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: 4-bit loading would be tried for real")
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        build_language_model(config.language_model, tokenizer, special_token_ids(tokenizer, config.language_model))


def test_qlora_asked_of_a_training_run_is_a_one_line_error(train, tmp_path):
    from empatheia.cli import main as cli_main

    with pytest.raises(SystemExit, match="error: model: language_model.load_in_4bit"):
        cli_main(["train", "configs/train/early_fusion_text.yaml", "--set", "model.preset=tiny",
                  "--set", f"data.train={train}", "--set", "model.dtype=null", "--set", "deepspeed=null",
                  "--set", 'model.variant={"joint_encoder": "imagebind", "imagebind_size": "tiny"}',
                  "--set", 'model.overrides={"language_model.load_in_4bit": true}', "--set", "model.init=null",
                  "--set", f"output_dir={tmp_path / 'q'}"])


def test_imagebind_stands_in_for_the_joint_embedding(train, tmp_path):
    """With joint_encoder imagebind (here its tiny random twin) there is no joint stage:
    the text stage starts from the preset, reads ImageBind's embeddings of the raw speech,
    frames and text, and ImageBind stays frozen and out of the saved weights."""
    options = {"joint_encoder": "imagebind", "imagebind_size": "tiny"}
    model = build_variant_model("early_fusion", "tiny", options)
    assert model.joint is None and not model.parameter_groups()["joint_embedding"]
    with pytest.raises(ValueError, match="skip early_fusion_joint"):
        model.set_stage("early_fusion_joint")
    corpus = read_dataset(train, labels=model.label_sets())
    dataset = UtteranceDataset(corpus.dialogues[:3], model.processor, "early_fusion_text", model.label_sets())
    batch = dataset.collator()([dataset[i] for i in range(3)])
    model.eval()
    embeddings, present = model.embed(batch)
    assert set(embeddings) == {"text", "audio", "video"}
    for modality, value in embeddings.items():
        assert value.shape == (3, model.imagebind.out_dim)
        assert torch.allclose(value.norm(dim=-1), torch.ones(3), atol=1e-5), modality
    final = train_stage("early_fusion_text", tmp_path / "ib", train, **{"model.variant": options})
    saved = load_variant_model(final)
    assert not any(name.startswith("imagebind.") for name in saved.trained_state_dict())
    # The projector trained (and was saved); ImageBind, frozen, is as the seed built it.
    assert not torch.equal(saved.projector.net.weight, model.projector.net.weight)
    assert all(torch.equal(a, b) for a, b in zip(saved.imagebind.state_dict().values(),
                                                  model.imagebind.state_dict().values()))
    system = build_trained_variant("early_fusion", checkpoint=final)
    response = system.respond(read_dataset(train).dialogues[0], max_new_tokens=5)
    assert response.system == "Early fusion"
    with pytest.raises(ValueError, match="needs imagebind_checkpoint"):
        EarlyFusionOptions(joint_encoder="imagebind")


def test_frames_are_renormalised_for_imagebind():
    from empatheia.encoders.imagebind import CLIP_MEAN, CLIP_STD
    from empatheia.variants.early_fusion import clip_frames

    config = EmpatheiaConfig.from_preset("small").video_encoder  # ImageNet statistics, 224 px
    pixel = torch.tensor([0.2, 0.5, 0.9])
    ours = ((pixel - torch.tensor(config.mean)) / torch.tensor(config.std)).view(1, 1, 3, 1, 1).expand(1, 2, 3, 8, 8)
    theirs = clip_frames(ours, config, 4)
    assert theirs.shape == (1, 2, 3, 4, 4)
    expected = (pixel - torch.tensor(CLIP_MEAN)) / torch.tensor(CLIP_STD)
    assert torch.allclose(theirs[0, 0, :, 0, 0], expected, atol=1e-5)
