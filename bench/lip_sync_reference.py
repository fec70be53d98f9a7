"""Lip sync of a model's talking heads against the same renderer driven by the speech.

Two ways to get the clips:

* ``RUN``: every clip an ``empatheia eval --animate`` run wrote (``predictions.jsonl``
  lines with ``audio``, ``video`` and ``video_style``) against the avatar renderer
  animating the same speech again with ``content=None`` (the mouth follows the speech's own
  loudness, the reference a content signal can at best match), the same video style and
  the same avatar.
* ``--data FILE`` (no eval run needed): the ``small`` preset answers the first ``--limit``
  dialogues of a dataset (any format ``empatheia eval --data`` reads) and speaks; each
  answer is animated twice, with its per-unit C^v spread by the speech's alignment (the
  model's path) and with ``content=None``, under each face of ``--faces``: ``model`` (the
  model's own S^v) and any of the seven emotions alone at intensity 1.0 (no gaze or head
  motion), so strong expressions are measured on the same speech. ``--gold`` replaces the
  model's C^v with the speech's own per-unit C^v (what a perfect Content Synchronizer
  would give), which separates the renderer from the model's content.

Both clips go through the same H.264 encoding and are scored with
:func:`empatheia.evaluation.video.lip_sync`. Prints the share of clips whose best offset is
within +-1 frame and the mean confidence of each path, and their ratio.

    python bench/lip_sync_reference.py runs/small/eval_animate [--limit N]
    python bench/lip_sync_reference.py --data ../shared/data/ed/ed_valid_response_examples.jsonl \\
        --limit 24 [--faces model sad happy ...] [--gold]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FACES = ("model", "sad", "happy", "angry", "fear", "surprised", "contempt", "disgusted")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, nargs="?", help="an eval --out folder with predictions.jsonl and media/")
    parser.add_argument("--data", type=Path, help="answer this dataset with the small preset instead of reading a run")
    parser.add_argument("--limit", type=int, help="clips (answers with --data; default 24 there)")
    parser.add_argument("--faces", nargs="+", choices=FACES, default=list(FACES), help="with --data: the faces to animate")
    parser.add_argument("--gold", action="store_true", help="with --data: the speech's own per-unit C^v, not the model's")
    parser.add_argument("--preset", default="small", help="whose model and avatar renderer sizes to use")
    args = parser.parse_args(argv)
    if (args.run is None) == (args.data is None):
        parser.error("give either RUN (an eval --animate folder) or --data FILE")

    from empatheia.config import EmpatheiaConfig
    from empatheia.generators.avatar_renderer import AvatarRenderer

    config = EmpatheiaConfig.from_preset(args.preset)
    renderer = AvatarRenderer(config.content_synchronizer.video_content_dim, config.style_disentangler.video_style_dim)
    if args.run is not None:
        model_sync, speech_sync = from_run(args.run, args.limit, renderer)
        report({"model": (model_sync, speech_sync)}, "model (C^v + alignment)")
    else:
        results = from_answers(args.data, args.limit or 24, args.faces, args.gold, args.preset, renderer)
        report(results, "gold per-unit C^v" if args.gold else "model's per-unit C^v")


def from_run(run: Path, limit, renderer):
    """``(model, speech-driven)`` lip-sync results of the clips of an eval run."""
    import torch

    from empatheia.evaluation.video import lip_sync
    from empatheia.generators.avatars import AvatarRegistry
    from empatheia.generators.base import Waveform
    from empatheia.media import load_audio

    registry = AvatarRegistry()
    lines = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines() if line.strip()]
    lines = [line for line in lines if line.get("audio") and line.get("video") and line.get("video_style")][:limit]
    if not lines:
        raise SystemExit(f"{run / 'predictions.jsonl'}: no line with audio, video and video_style")
    model_sync, speech_sync = [], []
    for line in lines:
        audio_path, video_path = run / line["audio"], run / line["video"]
        model_sync.append(lip_sync(video_path, audio_path))
        samples = load_audio(audio_path, 16000)
        avatar = registry.get(line["avatar"]) if line.get("avatar") else None
        avatar = avatar or registry.for_profile(None)
        style = torch.tensor(line["video_style"], dtype=torch.float32)
        speech = Waveform(samples, 16000)
        speech_sync.append(encoded_sync(renderer.animate(speech, None, style, avatar.portrait), speech))
    return model_sync, speech_sync


def from_answers(data: Path, limit: int, faces, gold: bool, preset: str, renderer):
    """``{face: (per-unit results, speech-driven results)}`` over the model's answers to the
    first ``limit`` dialogues of ``data``."""
    import torch

    from empatheia import Empatheia
    from empatheia.data.readers import read_dataset
    from empatheia.generators.avatar_renderer import EMOTIONS

    dialogues = read_dataset(data, require_media=False).dialogues[:limit]
    model = Empatheia.from_preset(preset)
    model.eval()
    answers = []
    for start in range(0, len(dialogues), 8):
        batch = dialogues[start : start + 8]
        for dialogue, response in zip(batch, model.respond(batch, speak=True)):
            avatar = model.avatars().for_profile(dialogue.listener_profile)
            answers.append((response, avatar.portrait))
    results = {face: ([], []) for face in faces}
    for response, portrait in answers:
        speech = response.audio
        content = renderer.unit_content(speech, response.video_content.shape[0]) if gold else response.video_content
        for face in faces:
            if face == "model":
                style = response.video_style
            else:
                style = torch.zeros(renderer.features.style_dim)
                style[EMOTIONS.index(face)], style[len(EMOTIONS)] = 1.0, 1.0
            per_unit, driven = results[face]
            per_unit.append(encoded_sync(renderer.animate(speech, content, style, portrait), speech))
            driven.append(encoded_sync(renderer.animate(speech, None, style, portrait), speech))
    return results


def encoded_sync(video, speech):
    """Lip sync of a rendered clip after the H.264 round trip every eval clip takes."""
    from empatheia.evaluation.video import lip_sync
    from empatheia.media import write_mp4

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "clip.mp4"
        write_mp4(path, video.frames, video.fps, speech.samples, speech.sample_rate)
        return lip_sync(path, speech)


def report(results, label: str) -> None:
    import numpy as np

    def summary(syncs):
        return float(np.mean([abs(r.offset) <= 1 for r in syncs])), float(np.mean([r.confidence for r in syncs]))

    print(f"{'face':10s} {'clips':>5s} | {label + ': |offset| <= 1':>34s} {'confidence':>10s} | "
          f"{'speech-driven: |offset| <= 1':>29s} {'confidence':>10s} | ratio")
    pooled = ([], [])
    for face, (per_unit, driven) in results.items():
        (unit_share, unit_conf), (speech_share, speech_conf) = summary(per_unit), summary(driven)
        pooled[0].extend(per_unit)
        pooled[1].extend(driven)
        print(f"{face:10s} {len(per_unit):5d} | {unit_share:34.1%} {unit_conf:10.3f} | "
              f"{speech_share:29.1%} {speech_conf:10.3f} | {unit_conf / speech_conf:.1%}")
    if len(results) > 1:
        (unit_share, unit_conf), (speech_share, speech_conf) = summary(pooled[0]), summary(pooled[1])
        print(f"{'all':10s} {len(pooled[0]):5d} | {unit_share:34.1%} {unit_conf:10.3f} | "
              f"{speech_share:29.1%} {speech_conf:10.3f} | {unit_conf / speech_conf:.1%}")


if __name__ == "__main__":
    main()
