"""How often the model's emotion reading follows a recorded face (or voice) when the
words say nothing about the emotion.

Each of a few neutral sentences is the speaker's only turn, once with nothing else, once
with each recorded face clip of the chosen actor (MEAD, ``--faces``: the actor held out
of ``small``'s training) and, with ``--speech``, once with each emotional speech clip.
The model answers (no speech or video is generated) and its readings are compared with
the emotion the clip shows, over the seven classes:

* the Style Disentangler's class (what styles the voice and face of the answer);
* the Chain of Empathy's emotion, folded to the seven classes.

Chance is 1/7 (14.3 %); the text-only rows show what the words alone give.

    python bench/face_reading.py --faces ../shared/data/media/mead_faces/video --actor W011 \\
        --speech ../shared/data/media/speech [--checkpoint DIR | --preset small]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NEUTRAL_TEXTS = (
    "Let me tell you what happened today.",
    "So that is where things stand right now.",
    "I just got back from the meeting.",
    "Here is what I wanted to talk about.",
    "That was my afternoon.",
)
SPEECH_EMOTIONS = {"angry": "angry", "disgust": "disgusted", "fearful": "fear", "happy": "happy", "sad": "sad",
                   "surprised": "surprised", "contempt": "contempt"}


def speech_clips(folder: Path):
    """``(emotion, path)`` of clips named ``<emotion><n>.wav`` (EmoTalk's names)."""
    out = []
    for path in sorted(folder.glob("*.wav")):
        name = path.stem.rstrip("0123456789")
        if name not in SPEECH_EMOTIONS:
            raise SystemExit(f"{path}: cannot tell its emotion from the name (expected one of {sorted(SPEECH_EMOTIONS)})")
        out.append((SPEECH_EMOTIONS[name], path))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faces", type=Path, required=True, help="folder of MEAD-style face clips")
    parser.add_argument("--actor", default="W011", help="the actor whose clips are read (held out of training)")
    parser.add_argument("--speech", type=Path, help="folder of emotional speech clips (<emotion><n>.wav)")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--checkpoint", type=Path, help="a saved model instead of the preset")
    parser.add_argument("--out", type=Path, help="write the per-item readings here as JSON")
    args = parser.parse_args(argv)

    from empatheia import Dialogue, Empatheia, Turn
    from empatheia.labels import fold_emotion
    from empatheia.data.render import read_face_clips

    model = Empatheia.from_pretrained(args.checkpoint) if args.checkpoint else Empatheia.from_preset(args.preset)
    faces = [c for c in read_face_clips(args.faces) if c.actor == args.actor and c.emotion != "neutral"]
    if not faces:
        raise SystemExit(f"{args.faces}: no clip of actor {args.actor}")
    conditions = {"text only": [(None, {})]}
    conditions["face"] = [(c.emotion, {"video": c.path}) for c in faces]
    if args.speech:
        conditions["voice"] = [(emotion, {"audio": path}) for emotion, path in speech_clips(args.speech)]

    rows = []
    for condition, items in conditions.items():
        dialogues, shown = [], []
        for emotion, media in items:
            for text in NEUTRAL_TEXTS:
                dialogues.append(Dialogue([Turn("speaker", text, **media)], id=f"{condition}:{emotion}:{text}"))
                shown.append(emotion)
        responses = []
        for start in range(0, len(dialogues), 8):
            responses += model.respond(dialogues[start : start + 8])
        for dialogue, emotion, response in zip(dialogues, shown, responses):
            chain = response.chain_emotion.label if response.chain_emotion else response.chain.speaker_emotion
            rows.append({"condition": condition, "shown": emotion, "text": dialogue.turns[0].text,
                         "style_disentangler": response.emotion.label,
                         "chain": chain, "chain_class": _fold(fold_emotion, chain)})

    print(f"{'condition':10s} {'items':>5s} {'SD follows':>10s} {'chain follows':>13s}  SD classes / chain classes")
    for condition in conditions:
        picked = [r for r in rows if r["condition"] == condition]
        sd = collections.Counter(r["style_disentangler"] for r in picked)
        chain = collections.Counter(r["chain_class"] for r in picked)
        if condition == "text only":
            print(f"{condition:10s} {len(picked):5d} {'-':>10s} {'-':>13s}  {dict(sd)} / {dict(chain)}")
            continue
        sd_hits = sum(r["style_disentangler"] == r["shown"] for r in picked) / len(picked)
        chain_hits = sum(r["chain_class"] == r["shown"] for r in picked) / len(picked)
        print(f"{condition:10s} {len(picked):5d} {sd_hits:10.1%} {chain_hits:13.1%}  {dict(sd)} / {dict(chain)}")
    print(f"chance over the seven classes: {1 / 7:.1%}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


def _fold(fold, label):
    from empatheia.labels import UnknownEmotionError

    try:
        return fold(label) if label else None
    except UnknownEmotionError:  # a word outside the fold names no class
        return None


if __name__ == "__main__":
    main()
