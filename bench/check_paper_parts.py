"""Run the paper-size encoders and heads on the CPU; prints shapes, sizes and seconds.

    python bench/check_paper_parts.py

HuBERT-large, the CLIP ViT-L/14@336 tower and both heads at the paper's sizes, with random
weights; the language model is the tiny one, since a 7B model does not fit a CPU box in
fp32. Video uses 2 frames per utterance to keep the run near a minute.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from empatheia import Empatheia, EmpatheiaConfig  # noqa: E402
from tests.conftest import full_batch, make_dialogue  # noqa: E402


def main() -> None:
    tiny = EmpatheiaConfig.from_preset("tiny")
    config = EmpatheiaConfig.from_preset(
        "paper",
        {
            "speech_encoder.pretrained": None,
            "video_encoder.pretrained": None,
            "video_encoder.num_frames": 2,
            # The generated clips are flat colours with no face to crop.
            "video_encoder.face_crop": False,
            "language_model": dataclasses.asdict(tiny.language_model),
        },
    )
    start = time.perf_counter()
    model = Empatheia(config)
    print(f"build: {time.perf_counter() - start:.1f} s")
    for name in ("speech_encoder", "video_encoder", "content_synchronizer", "style_disentangler"):
        print(f"{name}: {sum(p.numel() for p in getattr(model, name).parameters()) / 1e6:.1f} M parameters")

    batch = full_batch(model, [make_dialogue(2, seed=0)])
    start = time.perf_counter()
    with torch.no_grad():
        audio = model.speech_encoder(batch["audio"], batch["audio_lengths"])
        video = model.video_encoder(batch["video"])
    print(
        f"encoders: {time.perf_counter() - start:.1f} s for audio {tuple(batch['audio'].shape)} and video "
        f"{tuple(batch['video'].shape)} -> {tuple(audio.shape)}, {tuple(video.shape)}"
    )
    model.set_stage(4)
    start = time.perf_counter()
    out = model(batch)
    out["loss"].backward()
    print(f"stage 4 forward+backward: {time.perf_counter() - start:.1f} s, loss {out['loss'].item():.3f}")
    response = model.respond(make_dialogue(1), max_new_tokens=4)
    print(
        "respond: speech content", tuple(response.speech_content.shape), "video content",
        tuple(response.video_content.shape), "styles", tuple(response.speech_style.shape),
        tuple(response.video_style.shape),
    )


if __name__ == "__main__":
    main()
