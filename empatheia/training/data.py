"""A stage's training and evaluation examples, and the order each process reads them in.

The order is a pure function of the seed and the micro-batch number, so a resumed run
reads exactly the batches an uninterrupted one would have, with any number of loader
workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

import torch
from torch.utils.data import DataLoader, Sampler

from ..data import GoldFeatureStore, MediaFeatureCache, StageDataset, read_dataset
from ..data.gold_features import GoldFeatureStoreError
from ..dialogue import Dialogue
from ..errors import DataError, SkipReport
from ..labels import LabelSets
from ..stages import Stage, get_stage
from .config import ConfigError, DataSection, TrainConfig


@dataclass
class StageData:
    train: StageDataset
    eval: Optional[StageDataset]
    labels: LabelSets
    skipped: SkipReport = field(default_factory=SkipReport)
    """Examples left out of training or evaluation (``data.on_error: skip``)."""


def label_sets(config: TrainConfig, model_labels: LabelSets) -> LabelSets:
    if config.data.labels is None:
        return model_labels
    try:
        return LabelSets.from_yaml(config.data.labels)
    except ValueError as error:
        raise ConfigError(f"data.labels: {error}") from None


def build_stage_data(config: TrainConfig, processor, labels: LabelSets) -> StageData:
    """Read ``data.train`` (and ``data.eval``) for ``config.stage``, keep the examples that
    have what the stage trains on, and wrap them in :class:`StageDataset`."""
    stage, data = get_stage(config.stage), config.data
    if stage.gold_features and data.gold_features is None:
        raise ConfigError(
            f"data.gold_features: stage {stage.number} trains on gold generator features {list(stage.gold_features)}; "
            "extract them with `empatheia data extract-features` and set data.gold_features to that folder"
        )
    if data.eval is not None and stage.gold_features and data.eval_gold_features is None:
        raise ConfigError(f"data.eval_gold_features: stage {stage.number} evaluates on gold features too; set it for data.eval")
    cache = MediaFeatureCache(data.media_cache, processor.config) if data.media_cache else None
    skipped = SkipReport()

    def dataset(path: str, features: Optional[str], role: str) -> StageDataset:
        store = _open_store(features, f"data.{'gold_features' if role == 'train' else 'eval_gold_features'}")
        if store is not None:
            _check_feature_sizes(store, processor.config, path, data.labels,
                                 f"data.{'gold_features' if role == 'train' else 'eval_gold_features'}")
        corpus = read_dataset(
            path,
            format=data.format,
            media_root=data.media_root,
            labels=labels,
            require_media=stage.reads_media,
            on_error=data.on_error,
        )
        skipped.skipped.extend(corpus.skipped.skipped)
        usable = _with_stage_targets(corpus.dialogues, stage, store, Path(path), data.on_error, skipped)
        share = data.text_only_share if role == "train" else 0.0
        return StageDataset(usable, processor, stage, store, labels, cache, on_error=data.on_error, text_only_share=share)

    train = dataset(data.train, data.gold_features, "train")
    if data.text_train is not None:
        train.text_dialogues = _text_dialogues(data, stage, labels, {d.id for d in train.dialogues}, skipped)
    evaluation = dataset(data.eval, data.eval_gold_features, "eval") if data.eval else None
    return StageData(train, evaluation, labels, skipped)


def _text_dialogues(data: DataSection, stage: Stage, labels: LabelSets, known: Set[str], skipped: SkipReport) -> List[Dialogue]:
    """``data.text_train``'s dialogues that have a gold response, less those whose id
    ``train`` already holds (a split's rendered part is usually drawn from the same file)."""
    if not stage.mixes_text_and_media:
        raise ConfigError(f"data.text_train: text dialogues join stage 4 (text beside media), not stage {stage.number}")
    corpus = read_dataset(data.text_train, format=data.format, media_root=data.media_root, labels=labels, on_error=data.on_error)
    skipped.skipped.extend(corpus.skipped.skipped)
    fresh = [d for d in corpus.dialogues if d.id not in known]
    if not fresh:
        raise ConfigError(f"data.text_train: every dialogue of {data.text_train} is already in data.train")
    # Read as text alone, they need what stage 1 needs: a gold response.
    return _with_stage_targets(fresh, get_stage(1), None, Path(data.text_train), data.on_error, skipped)


def _open_store(path: Optional[str], key: str) -> Optional[GoldFeatureStore]:
    if path is None:
        return None
    try:
        return GoldFeatureStore(path)
    except (FileNotFoundError, GoldFeatureStoreError) as error:
        raise ConfigError(f"{key}: {error}") from None


def _check_feature_sizes(store: GoldFeatureStore, config, data_file: str, labels: Optional[str], key: str) -> None:
    """The store's features must have the widths the model's heads write: features
    extracted for another preset's generators (``tiny``'s for ``small``) are refused here,
    with the command that extracts the right ones, rather than at the first loss."""
    cs, sd = config.content_synchronizer, config.style_disentangler
    expected = {"speech_content": cs.speech_content_dim, "video_content": cs.video_content_dim,
                "speech_style": sd.speech_style_dim, "video_style": sd.video_style_dim}
    found = {name: summary.get("dim") for name, summary in store.manifest.get("features", {}).items()}
    wrong = [f"{name} {width} values (found {found[name]})" for name, width in expected.items()
             if found.get(name) is not None and found[name] != width]
    if not wrong:
        return
    model = config.preset or "MODEL_DIR"
    read_with = f" --labels {labels}" if labels else ""
    raise ConfigError(
        f"{key}: {store.path} holds gold features of other sizes than the {config.preset or 'trained'} model reads: "
        f"it expects {', '.join(wrong)}; they were extracted for another model's generators. Re-extract them into a "
        f"new folder with `empatheia data extract-features {data_file}{read_with} --out {store.path}-{config.preset or 'model'} "
        f"--generators-of {model}` and set {key} to it"
    )


def _with_stage_targets(
    dialogues: Sequence[Dialogue],
    stage: Stage,
    store: Optional[GoldFeatureStore],
    path: Path,
    on_error: str,
    skipped: SkipReport,
) -> List[Dialogue]:
    """The dialogues that carry the stage's targets. With ``on_error="raise"`` the first
    one that does not is an error naming it (and how many more there are); a file where
    none does is always an error."""
    problems: List[DataError] = []
    usable = []
    for dialogue in dialogues:
        problem = _missing_target(dialogue, stage, store)
        if problem is None:
            usable.append(dialogue)
        else:
            problems.append(DataError(problem[1], path, dialogue.id, problem[0]))
    if not usable:
        first = f"; the first: {problems[0]}" if problems else ""
        raise DataError(
            f"none of its {len(dialogues)} examples has what stage {stage.number} trains on{first}", path, field="data.train"
        )
    if problems and on_error == "raise":
        more = f" ({len(problems) - 1} more example(s) lack it too; data.on_error: skip leaves them out)"
        first = problems[0]
        raise DataError(first.reason + more, first.file, first.record, first.field)
    for problem in problems:
        skipped.add(problem)
    return usable


def _missing_target(dialogue: Dialogue, stage: Stage, store: Optional[GoldFeatureStore]) -> Optional[Tuple[str, str]]:
    if stage.reads_response and not dialogue.response:
        return "response", f"has no gold response, which stage {stage.number} trains on"
    if stage.reads_media and not any(t.audio is not None or t.video is not None for t in dialogue.turns):
        return "turns", f"has no speech or video in its turns, which stage {stage.number} reads"
    if store is not None and dialogue.id not in store:
        return "gold features", f"has no gold features in {store.path}"
    return None


# ---------------------------------------------------------------------- order
class StepBatchSampler(Sampler[List[int]]):
    """Endless micro-batches for one process: each epoch is a fresh seeded permutation,
    padded by wrapping so every process gets a full batch; global micro-batch ``k`` is
    split across processes by rank.

    Args:
        size: examples in the dataset.
        batch_size: examples per process and micro-batch.
        rank, world_size: this process and the number of processes.
        seed: the run's seed.
        start: the first micro-batch to yield (micro-batches already consumed).
    """

    def __init__(self, size: int, batch_size: int, rank: int, world_size: int, seed: int, start: int = 0):
        self.size, self.batch_size, self.rank, self.world_size = size, batch_size, rank, world_size
        self.seed, self.start = seed, start
        self.per_epoch = math.ceil(size / (batch_size * world_size))
        self._cached: Tuple[int, Optional[torch.Tensor]] = (-1, None)

    def _permutation(self, epoch: int) -> torch.Tensor:
        if self._cached[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            order = torch.randperm(self.size, generator=generator)
            needed = self.per_epoch * self.batch_size * self.world_size
            self._cached = (epoch, order.repeat(math.ceil(needed / self.size))[:needed])
        return self._cached[1]

    def indices(self, micro_step: int) -> List[int]:
        epoch, k = divmod(micro_step, self.per_epoch)
        global_batch = self.batch_size * self.world_size
        start = k * global_batch + self.rank * self.batch_size
        return self._permutation(epoch)[start : start + self.batch_size].tolist()

    def epoch(self, micro_step: int) -> float:
        return micro_step / self.per_epoch

    def __iter__(self) -> Iterator[List[int]]:
        step = self.start
        while True:
            yield self.indices(step)
            step += 1


def train_loader(dataset: StageDataset, config: TrainConfig, rank: int, world_size: int, start: int) -> DataLoader:
    sampler = StepBatchSampler(len(dataset), config.optim.batch_size, rank, world_size, config.seed, start)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=dataset.collator(),
        num_workers=config.data.num_workers,
        persistent_workers=config.data.num_workers > 0,
        # Workers' seeds come from this generator, not the global RNG, whose state the
        # checkpoints carry: creating the loader must not move it.
        generator=torch.Generator().manual_seed(config.seed),
    )


def eval_batches(size: int, batch_size: int, rank: int, world_size: int) -> List[Tuple[List[int], bool]]:
    """Each process's evaluation batches as ``(indices, counts)``. Every process runs the
    same number of batches (ZeRO-3 needs all of them in each forward); a process with
    fewer examples repeats one batch with ``counts=False``."""
    mine = list(range(rank, size, world_size))
    per_process = math.ceil(math.ceil(size / world_size) / batch_size)
    batches = [(mine[i : i + batch_size], True) for i in range(0, len(mine), batch_size)]
    filler = batches[0][0] if batches else [0]
    batches += [(filler, False)] * (per_process - len(batches))
    return batches


def to_device(batch: Dict[str, object], device: torch.device) -> Dict[str, object]:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
