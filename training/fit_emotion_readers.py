"""Fit the emotion readers (the E3RG variant's voters and the readers of the speaker's
words that ``small``'s chain is fused with), and score them.

    python -m empatheia.recipes.fit_emotion_readers --ed-train runs/small/ed/train.jsonl \
        --ed-eval runs/small/ed/eval.jsonl --rendered runs/rendered/train.jsonl \
        --speech-clips ../shared/data/media/speech --faces ../shared/data/media/mead_faces/video \
        --out empatheia/weights/small/emotion_readers --json docs/variants/emotion_readers.json

``--readers text sentence`` fits only the two readers of words (they need neither media
nor renderings).

* Text (:class:`~empatheia.variants.readers.TextEmotionReader`): the bag-of-words
  classifier of the ED training split's examples (the speaker turns so far as text, the
  conversation's ED label), scored on the held-out split over the 32 labels and, folded,
  over the 7 classes. Saved with half-precision weights when that changes no held-out
  prediction, else in float32.
* Sentence (:class:`~empatheia.variants.readers.SentenceEmotionReader`): a logistic
  regression over the packaged MiniLM's embedding of the same texts; scored on the
  held-out split alone and with the bag-of-words reader. Saved in half precision.

  Both readers of words take their settings (the L2 weight; whether ED's situations, the
  speaker's own account of what happened, join the speaker turns as training texts) from
  a 5-fold cross-validation grouped by conversation on the training split alone
  (:func:`choose_words_settings`): the sentence reader by its own accuracy, the
  bag-of-words reader by that of the two readers' product, which is what the chain's
  emotion is fused with (so fitting either cross-validates both: about 9 min on 2 cores
  for ED's split). The held-out split is only scored.
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
from typing import Dict, List, Optional, Sequence, Tuple

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


# ---------------------------------------------------------------------- words
TEXT_L2_GRID = (1e-5, 3e-5, 1e-4)
SENTENCE_L2_GRID = (3e-5, 1e-4, 3e-4, 1e-3)
CV_FOLDS = 5

Setting = Tuple[float, bool]
"""A reader of words' settings: its L2 weight, and whether ED's situations join the
speaker turns as training texts."""


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


def _named(setting: Setting) -> str:
    return f"l2 {setting[0]:g}" + (", with situations" if setting[1] else "")


class WordsSplit:
    """The training split read from ``path`` as the readers of words see it: the examples'
    speaker turns and labels, the conversations' situations, each with its
    cross-validation fold, and the sentence embeddings of both (both readers' settings are
    chosen together, so the embeddings are always needed)."""

    def __init__(self, path: Path):
        dialogues = read_dataset(path)
        self.path = path
        self.texts = [speaker_text(d) for d in dialogues]
        self.labels = [normalize_label(d.emotion) for d in dialogues]
        self.names = sorted(set(self.labels))
        self.folds = torch.tensor([cv_fold((d.id or "").rsplit("/", 1)[0]) for d in dialogues])  # (N,)
        told, self.told_texts, self.told_labels = situations(dialogues)
        self.told_folds = torch.tensor([cv_fold(conversation) for conversation in told])  # (S,)
        start = time.perf_counter()
        probe = SentenceEmotionReader(torch.zeros(1, len(self.names)), self.names)
        self.embeddings, self.told_embeddings = probe.embed(self.texts), probe.embed(self.told_texts)  # (N, D), (S, D)
        self.embed_seconds = time.perf_counter() - start

    def fitting_set(self, with_situations: bool, kept: Optional[torch.Tensor] = None,
                    told_kept: Optional[torch.Tensor] = None) -> Tuple[List[str], List[str], torch.Tensor]:
        """``(texts, labels, embeddings)`` to fit on: the examples where ``kept`` (all by
        default), and the situations where ``told_kept`` when ``with_situations``."""
        kept = torch.ones(len(self.texts), dtype=torch.bool) if kept is None else kept
        told_kept = torch.ones(len(self.told_texts), dtype=torch.bool) if told_kept is None else told_kept
        texts = [t for t, k in zip(self.texts, kept.tolist()) if k]
        labels = [label for label, k in zip(self.labels, kept.tolist()) if k]
        embeddings = self.embeddings[kept]
        if with_situations:
            texts += [t for t, k in zip(self.told_texts, told_kept.tolist()) if k]
            labels += [label for label, k in zip(self.told_labels, told_kept.tolist()) if k]
            embeddings = torch.cat([embeddings, self.told_embeddings[told_kept]])
        return texts, labels, embeddings

    def accuracies(self, scores: torch.Tensor) -> Dict[str, float]:
        """Accuracy over the 32 labels and, folded, the 7 classes of ``(N, C)`` scores over
        :attr:`names`."""
        chosen = [self.names[i] for i in scores.argmax(1).tolist()]
        return {"accuracy_32": _accuracy(chosen, self.labels),
                "accuracy_7": _accuracy([fold_emotion(c) for c in chosen], [fold_emotion(g) for g in self.labels])}


def choose_words_settings(split: WordsSplit, text_grid: Sequence[float] = TEXT_L2_GRID,
                          sentence_grid: Sequence[float] = SENTENCE_L2_GRID) -> Tuple[dict, Dict[str, Setting]]:
    """Choose both readers of words' settings by a 5-fold cross-validation grouped by
    conversation, on the training split alone, scored
    on speaker turns only (what the readers read in use): the L2 weight and whether the
    situations join the training texts. The sentence reader is chosen by its own accuracy
    over the 32 labels, the bag-of-words reader by that of its product with the chosen
    sentence reader, which is what the chain's emotion is fused with; so choosing either
    cross-validates both. Returns the report and the settings by reader name."""
    words = ("text", "sentence")
    grids = {"text": text_grid, "sentence": sentence_grid}
    settings = {reader: [(l2, told) for told in (False, True) for l2 in grids[reader]] for reader in words}
    scores = {reader: {s: torch.zeros(len(split.texts), len(split.names)) for s in settings[reader]}
              for reader in words}  # out-of-fold (N, C) log-probabilities
    for fold in tqdm(range(CV_FOLDS), desc="cross-validation", unit="fold"):
        held, told_kept = split.folds == fold, split.told_folds != fold
        held_texts = [t for t, h in zip(split.texts, held.tolist()) if h]
        for reader in words:
            for setting in settings[reader]:
                texts, labels, embeddings = split.fitting_set(setting[1], ~held, told_kept)
                if sorted(set(labels)) != split.names:
                    raise SystemExit(f"{split.path}: a cross-validation fold lacks a label; the split is too small")
                if reader == "text":
                    model = TextEmotionReader.fit(texts, labels, l2=setting[0])
                    columns = [model.labels.index(name) for name in split.names]
                    read = model.fine_probabilities(held_texts)[:, columns]
                else:
                    model = SentenceEmotionReader.fit(texts, labels, embeddings=embeddings, l2=setting[0])
                    read = model.probabilities_of_embeddings(split.embeddings[held])
                scores[reader][setting][held] = read.clamp_min(1e-12).log()

    def best(reader: str, rank) -> Setting:  # ties go to the stronger L2 weight
        return max(settings[reader], key=lambda s: (rank(s), s[0]))

    report: dict = {"folds": CV_FOLDS,
                    "sentence": {_named(s): split.accuracies(v) for s, v in scores["sentence"].items()},
                    "bag_of_words": {_named(s): split.accuracies(v) for s, v in scores["text"].items()}}
    chosen: Dict[str, Setting] = {}
    chosen["sentence"] = best("sentence", lambda s: report["sentence"][_named(s)]["accuracy_32"])
    with_sentence = scores["sentence"][chosen["sentence"]]
    report["product"] = {_named(s): split.accuracies(v + with_sentence) for s, v in scores["text"].items()}
    chosen["text"] = best("text", lambda s: report["product"][_named(s)]["accuracy_32"])
    report["chosen"] = {reader: _named(setting) for reader, setting in chosen.items()}
    return report, chosen


def fit_text(split: WordsSplit, test, out: Path, setting: Setting) -> dict:
    """Fit the bag-of-words reader on the whole training split with ``setting``, save it
    and score it on the held-out dialogues ``test``."""
    texts, labels, _ = split.fitting_set(setting[1])
    start = time.perf_counter()
    reader = TextEmotionReader.fit(texts, labels, l2=setting[0])
    seconds = time.perf_counter() - start
    test_texts = [speaker_text(d) for d in test]
    gold_fine = [normalize_label(d.emotion) for d in test]
    gold_coarse = [fold_emotion(label) for label in gold_fine]

    def predictions(model: TextEmotionReader) -> Tuple[List[str], List[str]]:
        fine = model.fine_probabilities(test_texts)
        coarse = model.fold(fine)
        return [model.labels[i] for i in fine.argmax(1).tolist()], [EMOTION_LABELS[i] for i in coarse.argmax(1).tolist()]

    fine, coarse = predictions(reader)
    if fine != reader.model.predict(test_texts):
        raise RuntimeError("predict_proba's argmax disagrees with predict")
    # Half precision halves the shipped file; keep it only if it changes no prediction.
    dtype = torch.float16
    reader.save(out, dtype)
    if predictions(TextEmotionReader.load(out)) != (fine, coarse):
        dtype = torch.float32
        reader.save(out, dtype)
    return {
        "train_examples": len(split.texts),
        "settings": _named(setting),
        "fitted_on": len(texts),
        "eval_examples": len(test),
        "ngrams": len(reader.model.vocabulary),
        "fit_seconds": round(seconds, 1),
        "weights_dtype": str(dtype).replace("torch.", ""),
        "accuracy_32": _accuracy(fine, gold_fine),
        "majority_32": _majority(gold_fine),
        "accuracy_7": _accuracy(coarse, gold_coarse),
        "majority_7": _majority(gold_coarse),
    }


def fit_sentence(split: WordsSplit, test, out: Path, setting: Setting) -> dict:
    """Fit the sentence reader on the whole training split with ``setting``, save it in
    half precision and score what ships on the held-out dialogues ``test``, alone and with
    the bag-of-words reader in ``out`` when there is one."""
    texts, labels, embeddings = split.fitting_set(setting[1])
    reader = SentenceEmotionReader.fit(texts, labels, embeddings=embeddings, l2=setting[0])
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
        "train_examples": len(split.texts),
        "situations": len(split.told_texts),
        "settings": _named(setting),
        "fitted_on": len(texts),
        "eval_examples": len(test),
        "encoder": reader.encoder,
        "embed_seconds": round(split.embed_seconds, 1),
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
    if {"text", "sentence"} & set(args.readers):
        split, test = WordsSplit(args.ed_train), read_dataset(args.ed_eval)
        report["cross_validation"], chosen = choose_words_settings(split)
        for reader, fit in (("text", fit_text), ("sentence", fit_sentence)):
            if reader in args.readers:
                report[reader] = fit(split, test, args.out, chosen[reader])
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
