"""How often an independent facial-expression reader names the emotion that the avatar
renderer was asked to draw.

For each of the seven emotions, at each intensity, a face style asking for that emotion
alone (S^v one-hot, intensity set, no gaze or head motion) animates two seconds of
silence (or, with ``--speech``, a sentence spoken by the packaged Piper voice, the mouth
driven by it) on the portrait of each of four listener profiles (young/elderly x
male/female); the FER network of ``empatheia eval`` (mini-Xception on FER2013) reads each
clip. FER has no contempt class, so contempt is reported but not scored: chance over the
six scored classes is 1/6 when the reader guesses uniformly.

This bounds what the text-video agreement of ``empatheia eval --animate --multimodal`` can
reach with this renderer: a face drawn exactly as requested is read as requested only this
often.

    python bench/face_legibility.py [--preset small] [--intensities 0.6 1.0] [--speech]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROFILES = tuple({"age": age, "gender": gender} for age in ("young", "elderly") for gender in ("male", "female"))
SENTENCE = "I hear you, and I am right here with you. Tell me what happened after that."


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small", help="preset whose avatars and face style width are used")
    parser.add_argument("--intensities", type=float, nargs="+", default=[0.6, 1.0])
    parser.add_argument("--speech", action="store_true", help="animate a spoken sentence instead of silence")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from empatheia.config import EmpatheiaConfig
    from empatheia.evaluation.fer import FER_TO_EMPATHEIA, FacialExpressionClassifier
    from empatheia.generators.avatar_renderer import EMOTIONS, AvatarRenderer
    from empatheia.generators.avatars import AvatarRegistry
    from empatheia.generators.base import Avatar, Waveform

    config = EmpatheiaConfig.from_preset(args.preset)
    width = config.style_disentangler.video_style_dim
    renderer, reader = AvatarRenderer(style_dim=width), FacialExpressionClassifier()
    registry = AvatarRegistry(config.generators.avatars)
    if args.speech:
        from empatheia.generators.piper_speech import PiperSpeech

        speech = PiperSpeech(style_dim=config.style_disentangler.speech_style_dim)
        plain = Avatar("plain", np.zeros((8, 8, 3), np.uint8), "en_US-joe-medium", {})
        clip = speech.synthesize(SENTENCE, None, torch.zeros(speech.features.style_dim), plain)
        clip = Waveform(clip.samples, clip.sample_rate)  # the mouth follows the sound itself
    else:
        clip = Waveform(torch.zeros(2 * 16000), 16000, None)
    scored_emotions = [e for e in EMOTIONS if e in FER_TO_EMPATHEIA.values()]
    for intensity in args.intensities:
        print(f"intensity {intensity:g}")
        hits = np.zeros((len(EMOTIONS), len(PROFILES)), dtype=bool)
        for index, emotion in enumerate(EMOTIONS):
            style = torch.zeros(width)
            style[index], style[len(EMOTIONS)] = 1.0, intensity
            reads = [reader.read(renderer.animate(clip, None, style, registry.for_profile(p).portrait).frames.numpy()).emotion
                     for p in PROFILES]
            hits[index] = [read == emotion for read in reads]
            print(f"  {emotion:10s} read as {', '.join(reads)}")
        scored = hits[[EMOTIONS.index(e) for e in scored_emotions]]
        per_portrait = ", ".join(f"{p['age']} {p['gender']} {n}" for p, n in zip(PROFILES, scored.sum(axis=0)))
        print(f"  read as requested: {scored.sum()} of {scored.size} scored clips ({100 * scored.mean():.0f} %); "
              f"of the {len(scored_emotions)} per portrait: {per_portrait}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
