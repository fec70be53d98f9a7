"""Lip sync of a model's talking heads against the same renderer driven by the speech.

For every clip an ``empatheia eval --animate`` run wrote (``predictions.jsonl`` lines with
``audio`` and ``video``), the avatar renderer animates the same speech again with
``content=None`` (the mouth follows the speech's own loudness, the reference a content
signal can at best match), the same video style and the same avatar; both clips are
scored with :func:`empatheia.evaluation.video.lip_sync`. Prints the share of clips whose
best offset is within +-1 frame and the mean confidence of each, and their ratio.

    python bench/lip_sync_reference.py runs/small/eval_animate [--limit N]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="an eval --out folder with predictions.jsonl and media/")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--preset", default="small", help="whose avatar renderer sizes to use")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from empatheia.config import EmpatheiaConfig
    from empatheia.evaluation.video import lip_sync
    from empatheia.media import load_audio, write_mp4
    from empatheia.generators.avatar_renderer import AvatarRenderer
    from empatheia.generators.avatars import AvatarRegistry
    from empatheia.generators.base import Waveform

    config = EmpatheiaConfig.from_preset(args.preset)
    renderer = AvatarRenderer(config.content_synchronizer.video_content_dim, config.style_disentangler.video_style_dim)
    registry = AvatarRegistry()
    lines = [json.loads(line) for line in (args.run / "predictions.jsonl").read_text().splitlines() if line.strip()]
    lines = [line for line in lines if line.get("audio") and line.get("video") and line.get("video_style")][: args.limit]
    if not lines:
        raise SystemExit(f"{args.run / 'predictions.jsonl'}: no line with audio, video and video_style")
    model_sync, speech_sync = [], []
    for line in lines:
        audio_path, video_path = args.run / line["audio"], args.run / line["video"]
        model_sync.append(lip_sync(video_path, audio_path))
        samples = load_audio(audio_path, 16000)
        avatar = registry.get(line["avatar"]) if line.get("avatar") else None
        avatar = avatar or registry.for_profile(None)
        style = torch.tensor(line["video_style"], dtype=torch.float32)
        reference = renderer.animate(Waveform(samples, 16000), None, style, avatar.portrait)
        # Through the same H.264 encoding as the model's clip, so both are read alike.
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "reference.mp4"
            write_mp4(path, reference.frames, reference.fps, samples, 16000)
            speech_sync.append(lip_sync(path, audio_path))

    def summary(results):
        in_sync = float(np.mean([abs(r.offset) <= 1 for r in results]))
        return in_sync, float(np.mean([r.confidence for r in results]))

    model_share, model_conf = summary(model_sync)
    speech_share, speech_conf = summary(speech_sync)
    print(f"clips: {len(lines)}")
    print(f"{'':22s} {'|offset| <= 1':>14s} {'confidence':>11s}")
    print(f"{'model (C^v + alignment)':22s} {model_share:14.1%} {model_conf:11.3f}")
    print(f"{'speech-driven':22s} {speech_share:14.1%} {speech_conf:11.3f}")
    print(f"confidence ratio model / speech-driven: {model_conf / speech_conf:.1%}")


if __name__ == "__main__":
    main()
