"""How often an independent facial-expression reader names the emotion that the avatar
renderer was asked to draw.

For each of the seven emotions, at each intensity, a face style asking for that emotion
alone (S^v one-hot, intensity set, no gaze or head motion) animates two seconds of
silence on the portrait of each of four listener profiles (young/elderly x male/female);
the FER network of ``empatheia eval`` (mini-Xception on FER2013) reads each clip. FER has
no contempt class, so contempt is reported but not scored: chance over the six scored
classes is 1/6 when the reader guesses uniformly.

This bounds what the text-video agreement of ``empatheia eval --animate --multimodal`` can
reach with this renderer: a face drawn exactly as requested is read as requested only this
often.

    python bench/face_legibility.py [--preset small] [--intensities 0.6 1.0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROFILES = tuple({"age": age, "gender": gender} for age in ("young", "elderly") for gender in ("male", "female"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small", help="preset whose avatars and face style width are used")
    parser.add_argument("--intensities", type=float, nargs="+", default=[0.6, 1.0])
    args = parser.parse_args(argv)

    import torch

    from empatheia.config import EmpatheiaConfig
    from empatheia.evaluation.fer import FER_TO_EMPATHEIA, FacialExpressionClassifier
    from empatheia.generators.avatar_renderer import EMOTIONS, AvatarRenderer
    from empatheia.generators.avatars import AvatarRegistry
    from empatheia.generators.base import Waveform

    config = EmpatheiaConfig.from_preset(args.preset)
    width = config.style_disentangler.video_style_dim
    renderer, reader = AvatarRenderer(style_dim=width), FacialExpressionClassifier()
    registry = AvatarRegistry(config.generators.avatars)
    silence = Waveform(torch.zeros(2 * 16000), 16000, None)
    for intensity in args.intensities:
        correct = scored = 0
        print(f"intensity {intensity:g}")
        for index, emotion in enumerate(EMOTIONS):
            style = torch.zeros(width)
            style[index], style[len(EMOTIONS)] = 1.0, intensity
            reads = [reader.read(renderer.animate(silence, None, style, registry.for_profile(p).portrait).frames.numpy()).emotion
                     for p in PROFILES]
            hits = sum(read == emotion for read in reads)
            if emotion in FER_TO_EMPATHEIA.values():
                correct, scored = correct + hits, scored + len(reads)
            print(f"  {emotion:10s} read as {', '.join(reads)}")
        print(f"  read as requested: {correct} of {scored} scored clips ({100 * correct / scored:.0f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
