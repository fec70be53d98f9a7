"""Answer the ten fixed dialogues of `examples/ten_dialogues.json` and print them as a table.

    python bench/ten_dialogues.py                                   # the model's default decoding
    python bench/ten_dialogues.py --greedy --no-repeat-ngram 0 --repetition-penalty 1 \
        --allow-repeated-sentences                                  # plain greedy
    python bench/ten_dialogues.py --sample --temperature 0.7 --top-p 0.9 --seed 0

Grief, success, anger, fear, loneliness, a follow-up after the listener asked how the
speaker is holding up, guilt, surprise, disappointment and gratitude, written for this
project (no dataset's text). Each row gives the chain the model wrote (its steps, as
parsed), the emotion class that styled the voice and face (``response.emotion``) and the
answer; ``--markdown`` prints a Markdown table, ``--json FILE`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("event_scenario", "speaker_emotion", "emotion_cause", "goal_to_response")
sys.path.insert(0, str(ROOT))

from empatheia.decoding import add_decoding_arguments, decoding_from_args  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--checkpoint", type=Path, help="a save_pretrained folder instead of the preset")
    parser.add_argument("--file", type=Path, default=ROOT / "examples" / "ten_dialogues.json")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="model config override")
    add_decoding_arguments(parser.add_argument_group("decoding (default: the model config's)"))
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import yaml

    from empatheia import Empatheia
    from empatheia.data import avamerg_dialogue

    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value)
    if args.checkpoint:
        model = Empatheia.from_pretrained(args.checkpoint, overrides=overrides or None)
    else:
        model = Empatheia.from_preset(args.preset, overrides or None)
    conversations = json.loads(args.file.read_text())
    dialogues = [avamerg_dialogue(conversation) for conversation in conversations]
    decoding = decoding_from_args(args).kwargs()
    started = time.perf_counter()
    responses = [model.respond(dialogue, **decoding) for dialogue in dialogues]
    seconds = time.perf_counter() - started
    rows = []
    for conversation, response in zip(conversations, responses):
        chain = {step: getattr(response.chain, step) for step in STEPS if getattr(response.chain, step)}
        rows.append({"dialogue": conversation["conversation_id"],
                     "speaker": conversation["turns"][-1]["dialogue_history"][-1]["utterance"],
                     "chain": chain, "style": response.emotion.label, "answer": response.text})
    if args.markdown:
        print("| dialogue | the speaker's last turn | chain (emotion) | voice and face | answer |")
        print("| --- | --- | --- | --- | --- |")
        for row in rows:
            emotion = row["chain"].get("speaker_emotion", "–")
            print(f"| {row['dialogue']} | {row['speaker']} | {emotion} | {row['style']} | {row['answer']} |")
    else:
        for row in rows:
            print(f"[{row['dialogue']}] {row['speaker']}")
            for step, text in row["chain"].items():
                print(f"    {step}: {text}")
            print(f"    voice and face: {row['style']}")
            print(f"    answer: {row['answer']}\n")
    print(f"{len(rows)} answers in {seconds:.1f} s", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
