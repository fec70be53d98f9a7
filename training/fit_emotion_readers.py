"""Fit the emotion readers (the E3RG variant's voters and the readers of the speaker's
words that ``small``'s chain is fused with), and score them.

    python -m empatheia.recipes.fit_emotion_readers --ed-train runs/small/ed/train.jsonl \
        --ed-eval runs/small/ed/eval.jsonl --rendered runs/rendered/train.jsonl \
        --speech-clips ../shared/data/media/speech --faces ../shared/data/media/mead_faces/video \
        --out empatheia/weights/small/emotion_readers --json docs/variants/emotion_readers.json

``--readers text sentence`` fits only the two readers of words (they need neither media
nor renderings).

* Text (:class:`~empatheia.variants.readers.TextEmotionReader`): the bag-of-words
  classifier fitted on the ED training split's examples (the speaker turns so far as text,
  the conversation's ED label), scored on the held-out split over the 32 labels and, folded,
  over the 7 classes. Saved with half-precision weights when that changes no held-out
  prediction, else in float32.
* Sentence (:class:`~empatheia.variants.readers.SentenceEmotionReader`): a logistic
  regression over the packaged MiniLM's embedding of the same texts, its L2 weight chosen
  by a 5-fold cross-validation grouped by conversation on the training split alone (the
  same folds report the bag-of-words reader and the two readers' product); then scored on
  the held-out split, alone and with the bag-of-words reader. Saved in half precision.
* Prosody (:class:`~empatheia.variants.readers.ProsodyEmotionReader`): fitted on every
  speaker utterance of a rendered (AvaMERG-style) set, labelled with its conversation's
  folded emotion, except the conversations whose id hashes into a fixed 20 % slice
  (:func:`held_out`), which it is scored on; then scored on real emotional speech clips
  (the label is the file name, trailing digits dropped: ``angry2.wav``, ``fearful.wav``).
  The renderings' prosody follows the emotion by construction, so the held-out slice says
  whether the features catch that construction; the real clips, whether it transfers.
* Face (:class:`~empatheia.variants.readers.FaceEmotionReader`, nothing to fit): scored on
  MEAD-style clips ``<actor>_<view>_<emotion>_level<N>_<take>.mp4``; neutral clips are
  left out (no class of ours), contempt clips are kept though FER2013 cannot say contempt
  (``accuracy_readable`` leaves them out too).

Prints one JSON object with the accuracies (and writes it to ``--json`` when given).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch
from tqdm import tqdm

from empatheia.data import read_dataset
from empatheia.labels import EMOTION_LABELS, fold_emotion, normalize_label
from empatheia.media import load_audio
from empatheia.variants.readers import (
    FaceEmotionReader,
    ProsodyEmotionReader,
    SentenceEmotionReader,
    TextEmotionReader,
    prosody_features,
    speaker_text,
)

HELD_OUT_SHARE = 0.2
READERS = ("text", "sentence", "prosody", "face")
SAMPLE_RATE = 16000


def held_out(conversation_id: str, share: float = HELD_OUT_SHARE) -> bool:
    """Whether a conversation is in the fixed held-out slice: its salted SHA-256 read as a
    fraction, so the slice does not depend on file order and no utterance of a
    conversation is on both sides."""
    digest = hashlib.sha256(f"emotion-readers:{conversation_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < share


def _accuracy(predicted: Sequence[str], gold: Sequence[str]) -> float:
    return round(sum(p == g for p, g in zip(predicted, gold)) / len(gold), 4) if gold else float("nan")


def _majority(gold: Sequence[str]) -> float:
    return round(Counter(gold).most_common(1)[0][1] / len(gold), 4) if gold else float("nan")


def _argmax(distribution) -> str:
    return max(distribution, key=distribution.get)


# ---------------------------------------------------------------------- text
def fit_text(train_path: Path, eval_path: Path, out: Path) -> dict:
    train, test = read_dataset(train_path), read_dataset(eval_path)
    start = time.perf_counter()
    reader = TextEmotionReader.fit([speaker_text(d) for d in train], [normalize_label(d.emotion) for d in train])
    seconds = time.perf_counter() - start
    texts = [speaker_text(d) for d in test]
    gold_fine = [normalize_label(d.emotion) for d in test]
    gold_coarse = [fold_emotion(label) for label in gold_fine]

    def predictions(model: TextEmotionReader) -> Tuple[List[str], List[str]]:
        fine = model.fine_probabilities(texts)
        coarse = model.fold(fine)
        return [model.labels[i] for i in fine.argmax(1).tolist()], [EMOTION_LABELS[i] for i in coarse.argmax(1).tolist()]

    fine, coarse = predictions(reader)
    if fine != reader.model.predict(texts):
        raise RuntimeError("predict_proba's argmax disagrees with predict")
    # Half precision halves the shipped file; keep it only if it changes no prediction.
    dtype = torch.float16
    reader.save(out, dtype)
    if predictions(TextEmotionReader.load(out)) != (fine, coarse):
        dtype = torch.float32
        reader.save(out, dtype)
    return {
        "train_examples": len(train),
        "eval_examples": len(test),
        "ngrams": len(reader.model.vocabulary),
        "fit_seconds": round(seconds, 1),
        "weights_dtype": str(dtype).replace("torch.", ""),
        "accuracy_32": _accuracy(fine, gold_fine),
        "majority_32": _majority(gold_fine),
        "accuracy_7": _accuracy(coarse, gold_coarse),
        "majority_7": _majority(gold_coarse),
    }


# ---------------------------------------------------------------------- sentence
SENTENCE_L2_GRID = (3e-5, 1e-4, 3e-4, 1e-3)
CV_FOLDS = 5


def cv_fold(conversation_id: str, folds: int = CV_FOLDS) -> int:
    """The cross-validation fold of a conversation (a hash, so all its examples, which
    share the speaker's turns, fall in one fold)."""
    digest = hashlib.sha256(f"text-readers-cv:{conversation_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % folds


def situations(dialogues) -> Tuple[List[str], List[str], List[str]]:
    """``(conversation ids, texts, labels)``: each conversation's situation (ED's
    ``prompt``, the speaker's own account of what happened, :attr:`Dialogue.context`) once,
    with its label; conversations without one are left out."""
    seen: Dict[str, Tuple[str, str]] = {}
    for dialogue in dialogues:
        conversation = (dialogue.id or "").rsplit("/", 1)[0]
        if dialogue.context and dialogue.context.strip():
            seen.setdefault(conversation, (dialogue.context.strip(), normalize_label(dialogue.emotion)))
    return list(seen), [text for text, _ in seen.values()], [label for _, label in seen.values()]


def fit_sentence(train_path: Path, eval_path: Path, out: Path, grid: Sequence[float] = SENTENCE_L2_GRID) -> dict:
    """Fit the sentence reader on the training split with the settings that read best in
    a 5-fold cross-validation grouped by conversation, on the training split alone: the
    L2 weight, and whether ED's situations join the speaker turns as training texts
    (scored on speaker turns only, what the reader reads in use). The same folds score the
    bag-of-words reader and the two readers' product, which is what the chain's emotion is
    fused with. The held-out split is only scored."""
    train, test = read_dataset(train_path), read_dataset(eval_path)
    texts = [speaker_text(d) for d in train]
    labels = [normalize_label(d.emotion) for d in train]
    names = sorted(set(labels))
    folds = torch.tensor([cv_fold((d.id or "").rsplit("/", 1)[0]) for d in train])
    told, told_texts, told_labels = situations(train)
    told_folds = torch.tensor([cv_fold(conversation) for conversation in told])
    start = time.perf_counter()
    probe = SentenceEmotionReader(torch.zeros(1, len(names)), names)
    embeddings, told_embeddings = probe.embed(texts), probe.embed(told_texts)
    embed_seconds = time.perf_counter() - start

    settings = [(l2, with_situations) for with_situations in (False, True) for l2 in grid]
    sentence_scores = {key: torch.zeros(len(train), len(names)) for key in settings}  # (N, C) log-probabilities
    bow_scores = torch.zeros(len(train), len(names))
    for fold in tqdm(range(CV_FOLDS), desc="cross-validation", unit="fold"):
        held, kept, told_kept = folds == fold, folds != fold, told_folds != fold
        kept_texts = [t for t, k in zip(texts, kept.tolist()) if k]
        kept_labels = [label for label, k in zip(labels, kept.tolist()) if k]
        if sorted(set(kept_labels)) != names:
            raise SystemExit(f"{train_path}: a cross-validation fold lacks a label; the split is too small")
        bow = TextEmotionReader.fit(kept_texts, kept_labels)
        bow_scores[held] = bow.fine_probabilities([t for t, h in zip(texts, held.tolist()) if h]).clamp_min(1e-12).log()
        extra_texts = [t for t, k in zip(told_texts, told_kept.tolist()) if k]
        extra_labels = [label for label, k in zip(told_labels, told_kept.tolist()) if k]
        for l2, with_situations in settings:
            if with_situations:
                reader = SentenceEmotionReader.fit(kept_texts + extra_texts, kept_labels + extra_labels,
                                                   embeddings=torch.cat([embeddings[kept], told_embeddings[told_kept]]),
                                                   l2=l2)
            else:
                reader = SentenceEmotionReader.fit(kept_texts, kept_labels, embeddings=embeddings[kept], l2=l2)
            scores = reader.probabilities_of_embeddings(embeddings[held]).clamp_min(1e-12).log()
            sentence_scores[(l2, with_situations)][held] = scores

    def accuracies(scores: torch.Tensor) -> Dict[str, float]:
        chosen = scores.argmax(1).tolist()
        return {"accuracy_32": _accuracy([names[i] for i in chosen], labels),
                "accuracy_7": _accuracy([fold_emotion(names[i]) for i in chosen], [fold_emotion(g) for g in labels])}

    def named(key) -> str:
        return f"l2 {key[0]:g}" + (", with situations" if key[1] else "")

    cross_validation = {"folds": CV_FOLDS, "bag_of_words": accuracies(bow_scores),
                        "sentence": {named(key): accuracies(scores) for key, scores in sentence_scores.items()}}
    best = max(settings, key=lambda key: (cross_validation["sentence"][named(key)]["accuracy_32"], -key[0]))
    cross_validation["chosen"] = named(best)
    cross_validation["product"] = accuracies(bow_scores + sentence_scores[best])

    l2, with_situations = best
    fit_texts, fit_labels, fit_embeddings = texts, labels, embeddings
    if with_situations:
        fit_texts, fit_labels = texts + told_texts, labels + told_labels
        fit_embeddings = torch.cat([embeddings, told_embeddings])
    reader = SentenceEmotionReader.fit(fit_texts, fit_labels, embeddings=fit_embeddings, l2=l2)
    reader.save(out, torch.float16)
    reader = SentenceEmotionReader.load(out)  # score what ships: the half-precision weights
    test_texts = [speaker_text(d) for d in test]
    test_gold = [normalize_label(d.emotion) for d in test]
    fine = reader.fine_probabilities(test_texts)
    chosen = [reader.labels[i] for i in fine.argmax(1).tolist()]
    both = fine.clamp_min(1e-12).log()
    if (out / TextEmotionReader.FILES[1]).is_file():
        bow = TextEmotionReader.load(out)
        columns = [bow.labels.index(name) for name in reader.labels]
        both = both + bow.fine_probabilities(test_texts)[:, columns].clamp_min(1e-12).log()
    together = [reader.labels[i] for i in both.argmax(1).tolist()]
    return {
        "train_examples": len(train),
        "situations": len(told),
        "fitted_on": len(fit_texts),
        "eval_examples": len(test),
        "encoder": reader.encoder,
        "embed_seconds": round(embed_seconds, 1),
        "cross_validation": cross_validation,
        "accuracy_32": _accuracy(chosen, test_gold),
        "accuracy_7": _accuracy([fold_emotion(c) for c in chosen], [fold_emotion(g) for g in test_gold]),
        "with_bag_of_words_accuracy_32": _accuracy(together, test_gold),
        "with_bag_of_words_accuracy_7": _accuracy([fold_emotion(c) for c in together], [fold_emotion(g) for g in test_gold]),
    }


# ---------------------------------------------------------------------- prosody
def rendered_utterances(path: Path) -> List[Tuple[str, Path, str]]:
    """``(conversation id, audio file, class)`` of every distinct speaker utterance of a
    rendered set (its examples repeat the earlier turns of their conversation)."""
    seen: Dict[Path, Tuple[str, Path, str]] = {}
    for dialogue in read_dataset(path):
        conversation = (dialogue.id or "").rsplit("/", 1)[0]
        for turn in dialogue.turns:
            if turn.role == "speaker" and isinstance(turn.audio, (str, Path)):
                seen.setdefault(Path(turn.audio), (conversation, Path(turn.audio), fold_emotion(dialogue.emotion)))
    return list(seen.values())


def clip_label(path: Path) -> str:
    """``angry2.wav`` -> ``angry``, ``fearful.wav`` -> ``fear``."""
    return fold_emotion(re.sub(r"\d+$", "", path.stem))


def fit_prosody(rendered: Path, clips_folder: Path, out: Path) -> dict:
    utterances = rendered_utterances(rendered)
    start = time.perf_counter()
    rows = np.stack([prosody_features(load_audio(audio, SAMPLE_RATE).numpy(), SAMPLE_RATE) for _, audio, _ in utterances])
    seconds = time.perf_counter() - start
    test = np.array([held_out(conversation) for conversation, _, _ in utterances])
    labels = [label for _, _, label in utterances]
    train_labels = [label for label, t in zip(labels, test) if not t]
    test_labels = [label for label, t in zip(labels, test) if t]
    reader = ProsodyEmotionReader.fit(rows[~test], train_labels)

    def predict(model: ProsodyEmotionReader, x: np.ndarray) -> List[str]:
        return [model.labels[i] for i in model.probabilities(x).argmax(1).tolist()]

    reader.save(out)
    reloaded = ProsodyEmotionReader.load(out)
    if not torch.equal(reloaded.probabilities(rows), reader.probabilities(rows)):
        raise RuntimeError("the prosody reader does not survive saving and loading")
    clips = sorted(clips_folder.glob("*.wav"))
    clip_rows = np.stack([prosody_features(load_audio(c, SAMPLE_RATE).numpy(), SAMPLE_RATE) for c in clips])
    clip_gold = [clip_label(c) for c in clips]
    clip_predicted = predict(reader, clip_rows)
    return {
        "features": list(reader.features),
        "train_utterances": int((~test).sum()),
        "heldout_utterances": int(test.sum()),
        "heldout_conversations": len({c for (c, _, _), t in zip(utterances, test) if t}),
        "feature_seconds": round(seconds, 1),
        "train_accuracy": _accuracy(predict(reader, rows[~test]), train_labels),
        "heldout_accuracy": _accuracy(predict(reader, rows[test]), test_labels),
        "heldout_majority": _majority(test_labels),
        "real_clips": len(clips),
        "real_clips_accuracy": _accuracy(clip_predicted, clip_gold),
        "real_clips_read": {c.name: p for c, p in zip(clips, clip_predicted)},
    }


# ---------------------------------------------------------------------- face
def score_faces(folder: Path, actor: str = "W011", max_frames: int = 16) -> dict:
    reader = FaceEmotionReader(max_frames=max_frames)
    read: Dict[str, str] = {}
    scored: List[Tuple[str, str, str]] = []  # (actor, gold, predicted)
    for clip in sorted(folder.glob("*.mp4")):
        parts = clip.stem.split("_")
        if len(parts) < 4:
            raise SystemExit(f"{clip.name}: expected <actor>_<view>_<emotion>_level<N>_<take>.mp4")
        distribution = reader.read_video(clip)
        predicted = _argmax(distribution) if distribution else "none"
        read[clip.name] = predicted
        if parts[2] != "neutral":
            scored.append((parts[0], fold_emotion(parts[2]), predicted))

    def accuracy(rows) -> float:
        return _accuracy([p for _, _, p in rows], [g for _, g, _ in rows])

    readable = [row for row in scored if row[1] != "contempt"]
    own = [row for row in scored if row[0] == actor]
    return {
        "clips": len(read),
        "scored_clips": len(scored),
        "max_frames": max_frames,
        "accuracy": accuracy(scored),
        "accuracy_readable": accuracy(readable),
        "readable_clips": len(readable),
        f"{actor}_clips": len(own),
        f"{actor}_accuracy": accuracy(own),
        f"{actor}_accuracy_readable": accuracy([row for row in own if row[1] != "contempt"]),
        "read": read,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ed-train", type=Path, required=True, help="ED conversations JSONL to fit the text reader on")
    parser.add_argument("--ed-eval", type=Path, required=True, help="held-out ED conversations JSONL")
    parser.add_argument("--rendered", type=Path, help="rendered AvaMERG-style JSONL (speaker audio); for prosody")
    parser.add_argument("--speech-clips", type=Path, help="folder of <emotion>[N].wav clips; for prosody")
    parser.add_argument("--faces", type=Path, help="folder of MEAD-style .mp4 clips; for face")
    parser.add_argument("--out", type=Path, required=True, help="folder the fitted readers are written into")
    parser.add_argument("--readers", nargs="+", choices=READERS, default=list(READERS),
                        help="which readers to fit or score (default: all)")
    parser.add_argument("--json", type=Path, help="also write the printed JSON here")
    parser.add_argument("--face-frames", type=int, default=16)
    args = parser.parse_args(argv)
    needs = {"prosody": ("--rendered", "--speech-clips"), "face": ("--faces",)}
    for reader in args.readers:
        for option in needs.get(reader, ()):
            if getattr(args, option[2:].replace("-", "_")) is None:
                parser.error(f"--readers {reader} needs {option}")
    files = [args.ed_train, args.ed_eval] + ([args.rendered] if "prosody" in args.readers else [])
    folders = ([args.speech_clips] if "prosody" in args.readers else []) + ([args.faces] if "face" in args.readers else [])
    for path in files:
        if not path.is_file():
            raise SystemExit(f"{path}: no such file")
    for path in folders:
        if not path.is_dir():
            raise SystemExit(f"{path}: no such folder")
    report = {}
    if "text" in args.readers:
        report["text"] = fit_text(args.ed_train, args.ed_eval, args.out)
    if "sentence" in args.readers:
        report["sentence"] = fit_sentence(args.ed_train, args.ed_eval, args.out)
    if "prosody" in args.readers:
        report["prosody"] = fit_prosody(args.rendered, args.speech_clips, args.out)
    if "face" in args.readers:
        report["face"] = score_faces(args.faces, max_frames=args.face_frames)
    report["shipped_bytes"] = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
