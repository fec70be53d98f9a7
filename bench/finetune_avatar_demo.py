"""Fine-tune `small` on a small avatar dataset with three emotions of its own, and score it.

    python bench/finetune_avatar_demo.py --ed ../shared/data/ed/ed_valid_conversations.jsonl \
        --media ../shared/data/media --out runs/avatar_demo

What a user with their own recordings does (docs/training.md, "Fine-tuning on your own
avatar"), on data built from what the repository's tests may read:

- **Dialogues.** EmpatheticDialogues conversations whose label falls in one of three
  classes of our own, `calm`, `stressed` and `upbeat` (:data:`CLASSES`); the training set
  from the conversations `empatheia data split` trains on, the held-out set from the ones
  it holds out (so `small`'s language core never saw their text either).
- **Media.** Every utterance is spoken and animated by `empatheia data render` (the
  listener's answers give the gold features); then the speaker's turns get real
  recordings: a MEAD face clip of the turn's class (calm: neutral, stressed: fear or
  angry, upbeat: happy), actors M030 and W009 in training and W011 only in the held-out
  set, and, for stressed and upbeat turns, a real emotional speech clip (fearful, angry,
  happy; there is no calm one, so calm turns keep the rendered voice).
- **Labels.** `labels.yaml` names the three classes, a profile of `gender` and a new
  attribute `accent` (us or uk, fixed per listener avatar), and an `emotion_fold` that
  sends ED's labels to the three classes, partly through the built-in fold
  (`fear: stressed` also sends afraid, anxious, ... there).

Then it runs the documented commands (printed as it goes) and prints the held-out emotion
and profile accuracies of the untuned model (`small` with its classifiers resized to the
new labels, what fine-tuning starts from), of `small`'s own 7-class reading sent through
the same fold (`empatheia eval --preset small --labels ...`), and of the fine-tuned model,
and compares the fine-tuned model with each of the other two, paired. ``--json FILE``
writes them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from empatheia.data.render import split_conversations  # noqa: E402
from empatheia.evaluation.baselines import compare_paired_accuracy  # noqa: E402
from empatheia.io import read_jsonl  # noqa: E402

# ED label -> (class, MEAD face emotion, speech clip or None).
CLASSES = {
    "calm": {"content": "neutral", "grateful": "neutral", "trusting": "neutral", "faithful": "neutral",
             "caring": "neutral", "prepared": "neutral", "confident": "neutral"},
    "stressed": {"afraid": "fear", "anxious": "fear", "apprehensive": "fear", "terrified": "fear",
                 "angry": "angry", "furious": "angry", "annoyed": "angry"},
    "upbeat": {"excited": "happy", "joyful": "happy", "proud": "happy", "impressed": "happy", "hopeful": "happy"},
}
SPEECH = {"fear": ["fearful.wav"], "angry": ["angry1.wav", "angry2.wav"], "happy": ["happy.wav"]}
TRAIN_ACTORS, EVAL_ACTOR = ("M030", "W009"), "W011"

LABELS_YAML = """\
emotions: [calm, stressed, upbeat]
profile: {gender: [male, female], accent: [us, uk]}
# Your fold extends the built-in one: labels not named here go through it first
# (anxious -> fear), then through this mapping (fear -> stressed).
emotion_fold: {fear: stressed, angry: stressed, happy: upbeat, impressed: upbeat,
               content: calm, grateful: calm, trusting: calm, faithful: calm, caring: calm,
               prepared: calm, confident: calm}
"""


def _hash(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest(), 16)


def choose_conversations(ed_file: Path, per_class_train: int, per_class_eval: int):
    """``(train, eval)`` conversation records, balanced over :data:`CLASSES`, in a fixed
    order (by a hash of the id), the held-out ones from the held-out split."""
    records = jsonl_values(ed_file)
    _, held = split_conversations([r["conv_id"] for r in records])
    held = set(held)
    label_class = {label: cls for cls, labels in CLASSES.items() for label in labels}
    train, evaluation = [], []
    for cls in CLASSES:
        mine = sorted((r for r in records if label_class.get(r["emotion"]) == cls), key=lambda r: _hash(r["conv_id"]))
        train += [r for r in mine if r["conv_id"] not in held][:per_class_train]
        evaluation += [r for r in mine if r["conv_id"] in held][:per_class_eval]
    return train, evaluation


def real_media(lines, media: Path, out: Path, actors) -> None:
    """Give the speaker's turns of avatar-JSONL ``lines`` real recordings (in place):
    a MEAD face of the turn's class from one of ``actors`` and, where there is one, a real
    speech clip; copies them under ``out/real/``."""
    faces, speech = media / "mead_faces" / "video", media / "speech"
    (out / "real").mkdir(parents=True, exist_ok=True)
    face_of = {label: face for labels in CLASSES.values() for label, face in labels.items()}
    for line in lines:
        face = face_of[line["emotion"]]
        conversation = line["id"].rsplit("/", 1)[0]
        actor = actors[_hash(conversation) % len(actors)]
        clip = f"{actor}_front_{face}_level{1 if face == 'neutral' else 3}_001.mp4"
        if not (out / "real" / clip).is_file():
            shutil.copyfile(faces / clip, out / "real" / clip)
        for index, turn in enumerate(line["history"]):
            if turn["role"] != "speaker":
                continue
            turn["video"] = f"real/{clip}"
            if face in SPEECH:
                wav = SPEECH[face][_hash(f"{conversation}/{index}") % len(SPEECH[face])]
                if not (out / "real" / wav).is_file():
                    shutil.copyfile(speech / wav, out / "real" / wav)
                turn["audio"] = f"real/{wav}"
        line["listener"]["accent"] = ("us", "uk")[_hash(line["listener"]["ID"]) % 2]
        line.pop("face_clips", None)
        # The chain steps the shipped `small` weights were trained to write (the situation as
        # the event, then the emotion), so the fine-tune spends its steps on the new labels
        # rather than on a new chain format.
        line["chain"] = {"event_scenario": line["context"], "speaker_emotion": line["emotion"]}


def build_dataset(args) -> Path:
    """``args.out/my_avatar`` with train.jsonl, val.jsonl, labels.yaml and the clips."""
    data = args.out / "my_avatar"
    if (data / "val.jsonl").is_file():
        return data
    train, evaluation = choose_conversations(args.ed, args.per_class_train, args.per_class_eval)
    render = args.out / "render"
    render.mkdir(parents=True, exist_ok=True)
    for name, records in (("train", train), ("val", evaluation)):
        source = render / f"{name}_ed.jsonl"
        source.write_text("".join(json.dumps(r) + "\n" for r in records))
        run([sys.executable, "-m", "empatheia", "data", "render", str(source), "--out", str(render / name)])
    data.mkdir(parents=True, exist_ok=True)
    for name, actors in (("train", TRAIN_ACTORS), ("val", (EVAL_ACTOR,))):
        lines = jsonl_values(render / name / "train.jsonl")
        # The rendered clips move under data/ so that the JSONL's relative paths hold.
        if not (data / name).exists():
            shutil.copytree(render / name / "clips", data / name)
        for line in lines:
            for turn in [*line["history"], line["response"]]:
                for key in ("audio", "video"):
                    turn[key] = turn[key].replace("clips/", f"{name}/", 1)
        real_media(lines, args.media, data, actors)
        (data / f"{name}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (data / "labels.yaml").write_text(LABELS_YAML)
    return data


def run(command, cwd=None) -> None:
    print("$", " ".join(str(c) for c in command), flush=True)
    started = time.perf_counter()
    subprocess.run([str(c) for c in command], check=True, cwd=cwd)
    print(f"  ({time.perf_counter() - started:.0f} s)", flush=True)


def class_counts(path: Path) -> Counter:
    lines = jsonl_values(path)
    label_class = {label: cls for cls, labels in CLASSES.items() for label in labels}
    return Counter(label_class[line["emotion"]] for line in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ed", type=Path, required=True, help="EmpatheticDialogues conversations JSONL")
    parser.add_argument("--media", type=Path, required=True, help="folder with mead_faces/video and speech/")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--per-class-train", type=int, default=15, help="training conversations per class")
    parser.add_argument("--per-class-eval", type=int, default=10, help="held-out conversations per class")
    parser.add_argument("--build-only", action="store_true", help="stop after writing the dataset")
    parser.add_argument("--steps", type=int, default=None, help="max_steps of the fine-tune (default: the config's)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="for the two evals: the classifiers read the signal tokens after the answer, so a "
                             "shorter answer saves time without changing what is measured much")
    parser.add_argument("--json", type=Path, help="write the measured accuracies here")
    args = parser.parse_args()
    data = build_dataset(args)
    for name in ("train", "val"):
        print(f"{name}: {dict(class_counts(data / f'{name}.jsonl'))} examples per class")
    if args.build_only:
        return
    results = fine_tune_and_score(args)
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


def fine_tune_and_score(args) -> dict:
    """Run docs/training.md's commands in ``args.out`` (the data folder is ``my_avatar/``
    there, as the docs name it) and score the untuned and the fine-tuned model."""
    from empatheia import Empatheia
    from empatheia.evaluation.records import emotion_class, read_predictions, read_references
    from empatheia.labels import LabelSets

    work = args.out
    empatheia = [sys.executable, "-m", "empatheia"]
    labels = "my_avatar/labels.yaml"
    for name, store in (("train", "gold_features"), ("val", "gold_features_val")):
        run([*empatheia, "data", "check", f"my_avatar/{name}.jsonl", "--labels", labels], cwd=work)
        run([*empatheia, "data", "extract-features", f"my_avatar/{name}.jsonl", "--labels", labels,
             "--out", f"my_avatar/{store}", "--generators-of", "small"], cwd=work)
    # What fine-tuning starts from: `small` with its classifiers resized to the new labels.
    untuned = work / "untuned"
    if not (untuned / "config.yaml").is_file():
        model = Empatheia.from_preset("small")
        model.set_label_sets(LabelSets.from_yaml(work / labels))
        model.save_pretrained(untuned)
    train = [*empatheia, "train", "configs/train/finetune_avatar.yaml", "--set", "model.init=small"]
    if args.steps:
        train += [f"max_steps={args.steps}"]
    if not (work / "runs" / "finetune_avatar" / "final").is_dir():
        started = time.perf_counter()
        run(train, cwd=work)
        train_seconds = round(time.perf_counter() - started)
    else:
        train_seconds = None
    extra = ["--max-new-tokens", str(args.max_new_tokens)] if args.max_new_tokens else []
    # `small` as shipped reads its own 7 classes; scored with the user's labels, each goes
    # through their fold (happy -> upbeat, fear and angry -> stressed; sad is none of the
    # three, so wrong).
    models = {"untuned": ["--checkpoint", "untuned"],
              "small, its 7 classes through the fold": ["--preset", "small", "--labels", labels],
              "fine-tuned": ["--checkpoint", "runs/finetune_avatar/final"]}
    user_labels = LabelSets.from_yaml(work / labels)
    scores, correct = {}, {}
    for name, model in models.items():
        out = f"eval/{name.split(',')[0]}"
        run([*empatheia, "eval", *model, "--data", "my_avatar/val.jsonl", "--out", out, *extra], cwd=work)
        metrics = json.loads((work / out / "metrics.json").read_text())
        predictions = read_predictions(work / out / "predictions.jsonl")
        gold = {r["id"]: r["emotion"] for r in read_references(work / out / "references.jsonl")}
        # Scored as eval scores: each prediction in the user's classes, through their fold.
        correct[name] = [emotion_class(p["emotion"], user_labels) == gold[p["id"]]
                         for p in sorted(predictions, key=lambda p: p["id"])]
        scores[name] = {"emotion_accuracy": metrics["emotion_accuracy"], "emotion_macro_f1": metrics.get("emotion_macro_f1"),
                        "profile": metrics.get("profile"), "predicted": dict(Counter(p["emotion"] for p in predictions))}
    paired = {}
    for other in ("untuned", "small, its 7 classes through the fold"):
        result = compare_paired_accuracy(correct["fine-tuned"], correct[other])
        paired[f"fine-tuned vs {other}"] = {"difference": result.difference, "interval": list(result.interval),
                                            "only_fine_tuned": result.only_a, "only_other": result.only_b,
                                            "mcnemar_p": result.p_value}
    gold = class_counts(work / "my_avatar" / "val.jsonl")
    return {"held_out_examples": sum(gold.values()), "gold": dict(gold),
            "chance": max(gold.values()) / sum(gold.values()), "train_seconds": train_seconds,
            "command": " ".join(str(c) for c in train[2:]), **scores, "paired": paired}


def jsonl_values(path: Path) -> list:
    """The values of a JSONL file, in order (:func:`empatheia.io.read_jsonl` without line numbers)."""
    return [value for _, value in read_jsonl(path)]


if __name__ == "__main__":
    main()
