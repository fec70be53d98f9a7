"""Speak and animate the example dialogues with the project's offline generators, writing
``media/dia{conversation_id}utt{index}_{avatar ID}.wav`` and ``.mp4`` (the AvaMERG names).

    python examples/render_media.py

Each speaker utterance shows the emotion written below; each listener utterance the
empathetic expression `empatheia.data.render` uses for training data.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from empatheia.data.render import LISTENER_EXPRESSION, SPEAKER_INTENSITY, speech_style, video_style  # noqa: E402
from empatheia.media import write_mp4, write_wav  # noqa: E402
from empatheia.generators import AvatarRegistry  # noqa: E402
from empatheia.generators.avatar_renderer import AvatarRenderer  # noqa: E402
from empatheia.generators.piper_speech import PiperSpeech  # noqa: E402

EMOTIONS = {"00001": "sad", "00002": "happy", "00003": "fear"}  # what each speaker feels


def main() -> None:
    speech, head, avatars = PiperSpeech(), AvatarRenderer(), AvatarRegistry()
    out = HERE / "media"
    out.mkdir(exist_ok=True)
    for conversation in json.loads((HERE / "dialogues.json").read_text()):
        cid = conversation["conversation_id"]
        for utterance in conversation["turns"][-1]["dialogue_history"]:
            role = utterance["role"]
            profile = conversation[f"{role}_profile"]
            shown, intensity = (
                (EMOTIONS[cid], SPEAKER_INTENSITY) if role == "speaker" else LISTENER_EXPRESSION[EMOTIONS[cid]]
            )
            avatar = avatars.for_profile(profile)
            wave = speech.synthesize(utterance["utterance"], None, speech_style(shown, intensity, speech.features.style_dim, profile), avatar)
            video = head.animate(wave, None, video_style(shown, intensity, head.features.style_dim), avatar.portrait)
            stem = out / f"dia{cid}utt{utterance['index']}_{profile['ID']}"
            write_wav(stem.with_suffix(".wav"), wave.samples, wave.sample_rate)
            write_mp4(stem.with_suffix(".mp4"), video.frames, video.fps, wave.samples, wave.sample_rate)
            print(f"{stem.name}: {wave.duration:.1f} s, {shown}")


if __name__ == "__main__":
    main()
