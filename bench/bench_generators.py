"""Speed of the speech and talking-head generators; prints numbers only.

    python bench/bench_generators.py                      # offline generators (CPU)
    python bench/bench_generators.py --dreamtalk --device cuda

DreamTalk runs at its official sizes with random weights (and a randomly initialised
wav2vec2-XLSR-sized audio model), so the timings are those of the real architecture.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from empatheia.generators.avatar_face import default_portrait  # noqa: E402
from empatheia.generators.avatar_renderer import AvatarRenderer  # noqa: E402
from empatheia.generators.base import Avatar, Waveform  # noqa: E402

TEXT = "I am so sorry to hear that. It sounds like a really hard week, and you handled it with a lot of patience."


def _timed(fn, repeats: int = 3):
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    return out, (time.perf_counter() - start) / repeats


def offline() -> None:
    from empatheia.generators.piper_speech import PiperSpeech

    speech, head = PiperSpeech(), AvatarRenderer()
    profile = {"age": "young", "gender": "female", "timbre": "high"}
    avatar = Avatar("bench", default_portrait(profile, 1), "auto", profile)
    style = torch.zeros(speech.features.style_dim)
    wave, seconds = _timed(lambda: speech.synthesize(TEXT, None, style, avatar))
    print(f"piper: {wave.duration:.2f} s of speech in {seconds:.3f} s ({wave.duration / seconds:.0f}x real time)")
    video_style = torch.zeros(head.features.style_dim)
    video_style[1], video_style[7] = 1.0, 1.0
    frames, seconds = _timed(lambda: head.animate(wave, None, video_style, avatar.portrait))
    count = frames.frames.shape[0]
    print(f"avatar renderer: {count} frames in {seconds:.3f} s ({count / seconds:.0f} frames/s)")


def dreamtalk(device: str, seconds_of_speech: float) -> None:
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    from empatheia.generators.dreamtalk import DreamTalk, DreamTalkConfig

    # wav2vec2-XLSR-53's size: 24 layers of width 1024.
    audio_model = Wav2Vec2Model(Wav2Vec2Config(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                               intermediate_size=4096, feat_extract_norm="layer", do_stable_layer_norm=True))
    start = time.perf_counter()
    model = DreamTalk(DreamTalkConfig(device=device), wav2vec2=audio_model.to(device).eval())
    print(f"dreamtalk build: {time.perf_counter() - start:.1f} s on {device}")
    t = torch.arange(int(16000 * seconds_of_speech)) / 16000
    speech = Waveform((0.3 * torch.sin(2 * torch.pi * 180 * t) * (1 + torch.sin(2 * torch.pi * 3 * t))).float(), 16000)
    portrait = default_portrait({"gender": "male"}, 2)
    style = torch.randn(256)

    def run():
        out = model.animate(speech, None, style, portrait)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return out

    frames, seconds = _timed(run, repeats=2)
    count = frames.frames.shape[0]
    print(f"dreamtalk animate ({model.config.ddim_steps} DDIM steps): {count} frames for {speech.duration:.1f} s of "
          f"speech in {seconds:.2f} s ({count / seconds:.1f} frames/s, {speech.duration / seconds:.2f}x real time)")
    if device.startswith("cuda"):
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dreamtalk", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    if args.dreamtalk:
        dreamtalk(args.device, args.seconds)
    else:
        offline()


if __name__ == "__main__":
    main()
