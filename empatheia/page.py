"""A self-contained HTML page of one response: the dialogue, the Chain of Empathy, the
predicted emotion with its probabilities, and the spoken, animated answer."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Any, Dict, Optional, Protocol

if TYPE_CHECKING:
    from .dialogue import Dialogue


class Prediction(Protocol):
    """What a probability table shows (a :class:`~empatheia.response.LabelPrediction`)."""

    label: str
    probabilities: Dict[str, float]

_CHAIN_TITLES = (
    ("event_scenario", "Event scenario"),
    ("speaker_emotion", "The speaker's emotion"),
    ("emotion_cause", "Emotion cause"),
    ("goal_to_response", "Goal of the response"),
)
_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 760px; margin: 2em auto; color: #222; line-height: 1.45; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; color: #444; }
.turn { margin: .4em 0; padding: .5em .8em; border-radius: 10px; max-width: 85%; }
.speaker { background: #eef2f7; } .listener { background: #e9f5ec; margin-left: auto; }
.answer { background: #d8f0df; margin-left: auto; border: 1px solid #9ccfab; }
.role { font-size: .75em; color: #666; text-transform: uppercase; letter-spacing: .05em; }
dl.chain dt { font-weight: 600; margin-top: .4em; } dl.chain dd { margin: 0 0 0 1em; }
table.probs td { padding: 1px 6px; } .bar { background: #6a9fd4; height: .8em; border-radius: 3px; }
.top td { font-weight: 600; } video { width: 320px; border-radius: 8px; display: block; margin: .6em 0; }
"""


_TOP = 8


def _probability_table(prediction: Prediction, top: Optional[int] = None) -> str:
    ranked = sorted(prediction.probabilities.items(), key=lambda item: -item[1])[:top]
    rows = ["<table class=probs>"]
    for label, p in ranked:
        mark = " class=top" if label == prediction.label else ""
        rows.append(f'<tr{mark}><td>{escape(label)}</td><td>{p:.1%}</td>'
                    f'<td style="width:220px"><div class=bar style="width:{100 * p:.1f}%"></div></td></tr>')
    return "\n".join(rows + ["</table>"])


def _describe(values: dict) -> str:
    def show(value) -> str:
        if isinstance(value, float):
            return f"{value:.3g}"
        if isinstance(value, dict):
            return ", ".join(f"{k} {show(v)}" for k, v in value.items())
        return str(value)

    return "; ".join(f"{name.replace('_', ' ')}: {show(value)}" for name, value in values.items())


def response_page(response: Any, dialogue: Optional["Dialogue"] = None) -> str:
    """The page of ``response`` (an :class:`~empatheia.response.EmpatheticResponse`, read
    by its fields: that module imports this one) as a string; it refers to
    ``response.wav`` and ``response.mp4`` beside it."""
    system = escape(response.system)
    parts = [f"<!doctype html><html lang=en><meta charset=utf-8><title>{system} response</title><style>{_STYLE}</style>",
             f"<h1>{system} response</h1>"]
    if dialogue is not None:
        parts.append("<h2>Dialogue</h2>")
        if dialogue.context:
            parts.append(f"<p><em>{escape(dialogue.context)}</em></p>")
        for turn in dialogue.turns:
            parts.append(f'<div class="turn {escape(turn.role)}"><div class=role>{escape(turn.role)}</div>{escape(turn.text)}</div>')
    parts.append(f'<h2>Answer</h2><div class="turn answer"><div class=role>listener ({system})</div>'
                 f"{escape(response.text) or '<em>(empty)</em>'}</div>")
    if response.video is not None:
        parts.append('<video src="response.mp4" controls playsinline></video>')
    elif response.audio is not None:
        parts.append('<audio src="response.wav" controls></audio>')
    reasoning = "the Chain of Empathy" if response.has_chain else "the language model"
    if response.has_chain:
        parts.append("<h2>Chain of Empathy</h2><dl class=chain>")
        for field, title in _CHAIN_TITLES:
            value = getattr(response.chain, field, None)
            parts.append(f"<dt>{escape(title)}</dt><dd>{escape(value) if value else '<em>(not stated)</em>'}</dd>")
        parts.append("</dl>")
    else:
        named = escape(response.chain.speaker_emotion or "(none)")
        parts.append(f"<h2>Reasoning</h2><p>{system} has no Chain of Empathy; it wrote the speaker's emotion: "
                     f"<strong>{named}</strong>.</p>")
    if response.chain_emotion is not None:
        parts.append(f"<h2>Predicted emotion of the speaker</h2><p>As {reasoning} weighs it "
                     f"(the {min(_TOP, len(response.chain_emotion.probabilities))} most likely of "
                     f"{len(response.chain_emotion.probabilities)} labels):</p>")
        parts.append(_probability_table(response.chain_emotion, _TOP))
        parts.append("<h2>Emotion of the answer's voice and face</h2>"
                     f"<p>The class of {escape(response.emotion_source)}:</p>")
    else:
        parts.append("<h2>Predicted emotion</h2>")
    parts.append(_probability_table(response.emotion))
    agreement = response.style_agreement()
    if agreement:
        parts.append(f"<p>{escape(agreement)}</p>")
    if response.profile:
        profile = ", ".join(f"{escape(name)}: {escape(p.label)}" for name, p in response.profile.items())
        parts.append(f"<p>Avatar profile read from the dialogue: {profile}</p>")
    if response.voice_style or response.face_style or response.avatar_profile:
        parts.append("<h2>What the voice and face were given</h2><dl class=chain>")
        for title, values in (("Avatar", response.avatar_profile), ("Voice", response.voice_style),
                              ("Face", response.face_style)):
            if values:
                parts.append(f"<dt>{title}</dt><dd>{escape(_describe(values))}</dd>")
        parts.append("</dl>")
    return "\n".join(parts) + "\n</html>\n"
