"""Gold generator features, extracted once into sharded safetensors files with a manifest.

Training stages 2-4 regress Empatheia's outputs onto features of each example's gold
response: speech content ``(L, 1024)`` per phoneme, speech style ``(256,)``, video content
``(L, 2816)`` per video frame and video style ``(256,)`` (see ``empatheia/feature_sizes.py``).
Running the generators' encoders on every step would cost far more than training itself,
so :func:`extract_gold_features` runs them once over the training set and
:class:`GoldFeatureStore` reads the results back lazily.

The module knows nothing about the encoders: anything that follows the
:class:`GoldFeatureExtractor` protocol (a name, the source field it reads, a fingerprint
and a batched ``__call__``) can be plugged in.

Layout of an output directory::

    manifest.json                   what was extracted, from what, and how far it got
    features-00000.safetensors      sources [0, shard_size)
    features-00001.safetensors      sources [shard_size, 2 * shard_size)
    ...

A shard file holds one tensor per stored sample and feature, named ``"{key}/{feature}"``,
as the extractor returned it (its dtype, its shape), on the CPU and contiguous; its
safetensors metadata holds one entry, ``"empatheia.gold_features"``, a JSON object with the run
fingerprint and the shard index. ``manifest.json``::

    {
      "format": "empatheia.gold_features",
      "format_version": 1,
      "fingerprint": "<sha256 of everything below that decides the content>",
      "sources_hash": "<sha256 of the ordered keys, texts and media paths>",
      "extractors": [{"name": "speech_style", "input": "audio", "fingerprint": "..."}],
      "shard_size": 256,
      "total_sources": 1000,
      "num_shards": 4,
      "complete": false,
      "features": {"speech_style": {"input": "audio", "ndim": 1, "dim": 256,
                                    "dtype": "float32", "min_length": null, "max_length": null}},
      "shards": [{"index": 0, "file": "features-00000.safetensors", "start": 0, "stop": 256,
                  "keys": ["00001/3", ...],
                  "skipped": [{"key": "00002/1", "reason": "...", "field": "audio", "file": "..."}]}]
    }

``shards`` lists the completed shards only, in order; ``features`` sums up what the
completed shards hold (``dim`` is the trailing dimension, ``min_length``/``max_length``
the range of ``L`` for ``(L, D)`` features, ``null`` for ``(D,)`` ones).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple, Union, runtime_checkable

import torch

from ..errors import DataError, SkippedSample, SkipReport
from ..io import atomic_path, remove_temporary_files, write_text_atomic

__all__ = [
    "FeatureSource",
    "GoldFeatureExtractor",
    "GoldFeatureStore",
    "GoldFeatureStoreError",
    "extract_gold_features",
    "MANIFEST_NAME",
    "FORMAT_VERSION",
]

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "empatheia.gold_features"
FORMAT_VERSION = 1
INPUTS = ("text", "audio", "video", "speech")
ON_ERROR = ("raise", "skip")
SHARD_METADATA_KEY = "empatheia.gold_features"


def shard_file_name(index: int) -> str:
    return f"features-{index:05d}.safetensors"


class GoldFeatureStoreError(RuntimeError):
    """A feature directory that cannot be used as asked: made by a different extraction,
    incomplete, or damaged."""


@dataclass(frozen=True)
class FeatureSource:
    """The gold response of one training example, as the extractors read it.

    ``key`` identifies the example in the store (e.g. ``"00001/3"``; it may contain
    ``/``). A field is ``None`` where the example has no such input; an extractor that
    needs it then fails for this sample.
    """

    key: str
    text: Optional[str] = None
    audio: Optional[Path] = None
    video: Optional[Path] = None


@runtime_checkable
class GoldFeatureExtractor(Protocol):
    """One gold feature, computed from one field of a :class:`FeatureSource`.

    ``name`` names the feature in the store (e.g. ``"speech_style"``; no ``/``), and
    ``input`` is the source field it reads: ``"text"`` (the extractor gets ``str``),
    ``"audio"`` / ``"video"`` (it gets a ``Path``), or ``"speech"``: the response text and
    its recording together, ``(str, Path)`` (a feature counted per speech unit of a
    recording needs both).

    ``__call__`` takes a batch of inputs and returns one tensor per input, in order, each
    ``(D,)`` or ``(L, D)``. ``D``, the number of dimensions and the dtype must be the same
    for every input; ``L`` may vary. It may raise :class:`DataError` for a bad input (an
    unreadable file, an unknown character); any other exception is taken as a bug and
    stops the extraction whatever ``on_error`` says.

    ``fingerprint()`` identifies the weights and settings behind the numbers (e.g. the
    checkpoint hash and sample rate), so that features from different extractors are
    never mixed in one directory.
    """

    name: str
    input: str

    def fingerprint(self) -> str: ...

    def __call__(self, inputs: List[Any]) -> List[torch.Tensor]: ...


def extract_gold_features(
    sources: Sequence[FeatureSource],
    extractors: Sequence[GoldFeatureExtractor],
    output_dir: Union[str, Path],
    shard_size: int = 256,
    batch_size: int = 8,
    on_error: str = "raise",
    progress: bool = True,
) -> "GoldFeatureStore":
    """Run every extractor over every source and store the features in ``output_dir``.

    Shard ``i`` holds sources ``[i * shard_size, (i + 1) * shard_size)`` in the given
    order. Extractors are called once per batch of up to ``batch_size`` sources; batches
    never straddle a shard, so a resumed run forms exactly the batches an uninterrupted
    one would and, with deterministic extractors, writes identical files.

    Resuming: each shard file is written to a temporary file and renamed into place, and
    the manifest is rewritten the same way after every shard. Calling again with the same
    sources, extractors and ``shard_size`` after an interruption skips the shards the
    manifest lists and goes on from the first missing one. A directory holding a different
    extraction is never added to: that raises :class:`GoldFeatureStoreError`. Only one
    extraction may write to a directory at a time.

    ``on_error="raise"`` stops at the first bad sample with a :class:`DataError` naming its
    file (the media path, if any), record (the key) and field (the source field). With
    ``"skip"`` the sample is left out whole, even where only one extractor failed on it
    (a sample lacking one of the features could not go into a training batch), and the
    manifest records it with its reason, so that a restart reports the same skips
    without retrying them. The returned store lists them in ``.skipped`` and a summary is
    logged. A store that recorded skips cannot be resumed with ``on_error="raise"``.

    Returns the finished :class:`GoldFeatureStore`.
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    for label, value in (("shard_size", shard_size), ("batch_size", batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{label} must be a positive integer, got {value!r}")
    sources = list(sources)
    extractors = list(extractors)
    _check_extractors(extractors)
    _check_sources(sources)

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    remove_temporary_files(output_dir)  # only a killed run leaves them
    manifest = _start_or_resume(output_dir, sources, extractors, shard_size)

    if on_error == "raise":
        for shard in manifest["shards"]:
            for entry in shard["skipped"]:
                raise DataError(
                    f"{entry['reason']} (recorded as skipped by an earlier run with "
                    f"on_error='skip'; resume with on_error='skip', or extract into a new directory)",
                    entry["file"],
                    entry["key"],
                    entry["field"],
                )

    from tqdm.auto import tqdm

    done = sum(shard["stop"] - shard["start"] for shard in manifest["shards"])
    bar = tqdm(total=len(sources), initial=done, disable=not progress, unit="sample", desc="gold features")
    try:
        for index in range(len(manifest["shards"]), manifest["num_shards"]):
            start, stop = index * shard_size, min((index + 1) * shard_size, len(sources))
            tensors, keys, skipped = _extract_shard(
                sources[start:stop], extractors, batch_size, on_error, manifest["features"], bar
            )
            name = shard_file_name(index)
            _write_shard(output_dir / name, tensors, manifest["fingerprint"], index)
            _note_features(manifest["features"], tensors)
            manifest["shards"].append(
                {"index": index, "file": name, "start": start, "stop": stop, "keys": keys, "skipped": skipped}
            )
            manifest["complete"] = len(manifest["shards"]) == manifest["num_shards"]
            _write_manifest(output_dir, manifest)
    finally:
        bar.close()

    store = GoldFeatureStore(output_dir)
    if store.skipped:
        logger.warning("%s", _skip_summary(store.skipped, len(sources)))
    else:
        logger.info("gold features: %d sample(s) stored in %s, none skipped", len(store), output_dir)
    return store


class GoldFeatureStore:
    """Read access to a directory written by :func:`extract_gold_features`.

    Opening reads ``manifest.json`` only; a shard file is opened (memory-mapped by
    ``safetensors.safe_open``) the first time one of its keys is read, and the handle is
    kept for later reads. An incomplete extraction raises :class:`GoldFeatureStoreError`
    unless ``allow_partial=True``, in which case the completed shards are readable.

    ``get(key)`` returns ``{feature name: tensor}`` with each tensor as its extractor
    returned it: ``(D,)`` or ``(L, D)``, in the extractor's dtype.

    The store can be pickled (for ``DataLoader`` workers); open file handles are not
    carried over and are reopened on demand.
    """

    def __init__(self, path: Union[str, Path], allow_partial: bool = False):
        self.path = Path(path)
        manifest = _read_manifest(self.path)
        if manifest is None:
            raise FileNotFoundError(
                f"{self.path} holds no {MANIFEST_NAME}: not a gold feature directory "
                f"(write one with extract_gold_features)"
            )
        self.manifest: Dict[str, Any] = manifest
        self.complete: bool = bool(manifest["complete"])
        if not self.complete and not allow_partial:
            raise GoldFeatureStoreError(
                f"{self.path}: gold feature extraction is incomplete: {self.shards_done} of "
                f"{self.num_shards} shards done ({self.sources_done} of {manifest['total_sources']} sources); "
                f"run extract_gold_features again with the same sources and extractors to finish it, "
                f"or open with allow_partial=True"
            )
        self.feature_names: Tuple[str, ...] = tuple(e["name"] for e in manifest["extractors"])
        self._shard_of: Dict[str, int] = {}
        self._skipped: Dict[str, SkippedSample] = {}
        for position, shard in enumerate(manifest["shards"]):
            for key in shard["keys"]:
                self._shard_of[key] = position
            for entry in shard["skipped"]:
                self._skipped[entry["key"]] = SkippedSample(entry["file"], entry["key"], entry["field"], entry["reason"])
        self._handles: Dict[int, Any] = {}

    # -- what the store holds --------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    @property
    def features(self) -> Dict[str, Dict[str, Any]]:
        """Per feature: ``input``, ``ndim``, ``dim`` (trailing), ``dtype`` and, for ``(L, D)``
        features, ``min_length`` / ``max_length``, over the completed shards."""
        return self.manifest["features"]

    @property
    def num_shards(self) -> int:
        return self.manifest["num_shards"]

    @property
    def shards_done(self) -> int:
        return len(self.manifest["shards"])

    @property
    def sources_done(self) -> int:
        return sum(shard["stop"] - shard["start"] for shard in self.manifest["shards"])

    @property
    def skipped(self) -> List[SkippedSample]:
        """Every sample left out (``record`` is its key), with its reason, in source order."""
        return list(self._skipped.values())

    @property
    def skip_report(self) -> SkipReport:
        return SkipReport(self.skipped)

    def keys(self) -> List[str]:
        """Stored keys in source order."""
        return list(self._shard_of)

    def __iter__(self) -> Iterator[str]:
        return iter(self._shard_of)

    def __len__(self) -> int:
        return len(self._shard_of)

    def __contains__(self, key: object) -> bool:
        return key in self._shard_of

    # -- reading ---------------------------------------------------------------------

    def get(self, key: str) -> Dict[str, torch.Tensor]:
        """``{feature name: (D,) or (L, D) tensor}`` of one stored sample."""
        position = self._shard_of.get(key)
        if position is None:
            raise KeyError(self._missing_message(key))
        handle = self._handle(position)
        return {name: handle.get_tensor(f"{key}/{name}") for name in self.feature_names}

    __getitem__ = get

    def _missing_message(self, key: str) -> str:
        if key in self._skipped:
            return f"{key!r} was skipped during gold feature extraction: {self._skipped[key]}"
        message = f"{key!r} is not in the gold feature store {self.path}"
        if not self.complete:
            message += f" (the extraction is incomplete: {self.shards_done} of {self.num_shards} shards done)"
        return message

    def _handle(self, position: int):
        handle = self._handles.get(position)
        if handle is None:
            from safetensors import safe_open

            path = self.path / self.manifest["shards"][position]["file"]
            if not path.is_file():
                raise GoldFeatureStoreError(f"{path}: listed in {MANIFEST_NAME} but missing")
            handle = safe_open(str(path), framework="pt", device="cpu")
            # A shard from another run copied over this one would otherwise be read
            # silently under this manifest's keys.
            if _shard_fingerprint(handle) != self.fingerprint:
                raise GoldFeatureStoreError(
                    f"{path} was written by a different extraction than {self.path / MANIFEST_NAME} describes"
                )
            self._handles[position] = handle
        return handle

    def close(self) -> None:
        """Drop the open shard handles (they are reopened if the store is read again)."""
        self._handles.clear()

    def __enter__(self) -> "GoldFeatureStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state

    def __repr__(self) -> str:
        status = "complete" if self.complete else f"{self.shards_done}/{self.num_shards} shards"
        return (
            f"GoldFeatureStore({str(self.path)!r}, {len(self)} samples, features={list(self.feature_names)}, "
            f"{len(self._skipped)} skipped, {status})"
        )


# -- checks before any work ------------------------------------------------------------


def _check_extractors(extractors: List[GoldFeatureExtractor]) -> None:
    if not extractors:
        raise ValueError("at least one gold feature extractor is needed")
    seen = set()
    for extractor in extractors:
        if not isinstance(extractor, GoldFeatureExtractor):
            raise TypeError(
                f"{extractor!r} is not a GoldFeatureExtractor (needs name, input, fingerprint() and __call__)"
            )
        name = extractor.name
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"extractor name must be a non-empty string without '/', got {name!r}")
        if name in seen:
            raise ValueError(f"two extractors are named {name!r}; feature names must be unique")
        seen.add(name)
        if extractor.input not in INPUTS:
            raise ValueError(f"extractor {name!r}: input must be one of {INPUTS}, got {extractor.input!r}")
        if not isinstance(extractor.fingerprint(), str):
            raise TypeError(f"extractor {name!r}: fingerprint() must return a str")


def _check_sources(sources: List[FeatureSource]) -> None:
    first_seen: Dict[str, int] = {}
    for position, source in enumerate(sources):
        if not isinstance(source, FeatureSource):
            raise TypeError(f"source {position} is a {type(source).__name__}, not a FeatureSource")
        if not isinstance(source.key, str) or not source.key:
            raise DataError(f"source {position} has no key (keys must be non-empty strings)", field="key")
        if source.key in first_seen:
            raise DataError(
                f"duplicate key: sources {first_seen[source.key]} and {position} share it; keys must be unique",
                record=source.key,
                field="key",
            )
        first_seen[source.key] = position


def _sources_hash(sources: List[FeatureSource]) -> str:
    # Paths are hashed as given (not resolved), so the hash does not depend on the
    # current directory; moving the media under the same relative paths keeps it.
    digest = hashlib.sha256()
    for source in sources:
        fields = [source.key, source.text]
        fields += [None if p is None else os.fspath(p) for p in (source.audio, source.video)]
        digest.update(json.dumps(fields, ensure_ascii=False).encode("utf-8") + b"\n")
    return digest.hexdigest()


def _new_manifest(sources: List[FeatureSource], extractors: List[GoldFeatureExtractor], shard_size: int) -> Dict:
    described = [{"name": e.name, "input": e.input, "fingerprint": e.fingerprint()} for e in extractors]
    sources_hash = _sources_hash(sources)
    # batch_size is left out: it changes how work is grouped, not what is computed.
    fingerprint = hashlib.sha256(
        json.dumps(
            {
                "format_version": FORMAT_VERSION,
                "extractors": described,
                "shard_size": shard_size,
                "total_sources": len(sources),
                "sources_hash": sources_hash,
            },
            sort_keys=True,
        ).encode("utf-8")
    ).hexdigest()
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "fingerprint": fingerprint,
        "sources_hash": sources_hash,
        "extractors": described,
        "shard_size": shard_size,
        "total_sources": len(sources),
        "num_shards": -(-len(sources) // shard_size),
        "complete": len(sources) == 0,
        "features": {
            e.name: {"input": e.input, "ndim": None, "dim": None, "dtype": None, "min_length": None, "max_length": None}
            for e in extractors
        },
        "shards": [],
    }


def _start_or_resume(
    output_dir: Path, sources: List[FeatureSource], extractors: List[GoldFeatureExtractor], shard_size: int
) -> Dict:
    """The manifest to continue from: the one in ``output_dir`` if it describes this very
    extraction, a new one (written at once, so that even a run killed before its first
    shard has claimed the directory) if there is none."""
    wanted = _new_manifest(sources, extractors, shard_size)
    existing = _read_manifest(output_dir)
    if existing is None:
        strays = sorted(p.name for p in output_dir.glob("features-*.safetensors"))
        if strays:
            raise GoldFeatureStoreError(
                f"{output_dir} holds shard files ({strays[0]}, ...) but no {MANIFEST_NAME}, so it cannot be "
                f"resumed safely; use a new output directory, or delete {output_dir} to start over"
            )
        _write_manifest(output_dir, wanted)
        return wanted
    if existing["fingerprint"] != wanted["fingerprint"]:
        raise GoldFeatureStoreError(
            f"{output_dir} holds gold features from a different extraction "
            f"({'; '.join(_differences(existing, wanted)) or 'fingerprint differs'}); never mixing the two: "
            f"use a new output directory, or delete {output_dir} to start over"
        )
    for shard in existing["shards"]:
        if not (output_dir / shard["file"]).is_file():
            raise GoldFeatureStoreError(
                f"{output_dir / shard['file']} is listed as done in {MANIFEST_NAME} but missing; "
                f"delete {output_dir} to start over"
            )
    return existing


def _differences(old: Dict, new: Dict) -> List[str]:
    out = []
    old_ex = {e["name"]: e for e in old.get("extractors", [])}
    new_ex = {e["name"]: e for e in new["extractors"]}
    if list(old_ex) != list(new_ex):
        out.append(f"extractors were {list(old_ex)}, now {list(new_ex)}")
    for name in old_ex.keys() & new_ex.keys():
        for field in ("input", "fingerprint"):
            if old_ex[name][field] != new_ex[name][field]:
                out.append(f"extractor {name!r} {field} was {old_ex[name][field]!r}, now {new_ex[name][field]!r}")
    if old.get("shard_size") != new["shard_size"]:
        out.append(f"shard_size was {old.get('shard_size')}, now {new['shard_size']}")
    if old.get("total_sources") != new["total_sources"]:
        out.append(f"{old.get('total_sources')} sources before, {new['total_sources']} now")
    elif old.get("sources_hash") != new["sources_hash"]:
        out.append("the sources (keys, texts or media paths) differ")
    return out


# -- extraction --------------------------------------------------------------------------


def _input_of(source: FeatureSource, field: str) -> Union[str, Path, Tuple[str, Path], None]:
    """What an extractor reading ``field`` gets: the text, the media file as a Path, or
    for ``"speech"`` both, ``(text, audio Path)`` (``None`` if either is missing)."""
    if field == "speech":
        if source.text is None or source.audio is None:
            return None
        return source.text, Path(source.audio)
    value = getattr(source, field)
    return value if field == "text" or value is None else Path(value)


def _missing_input(source: FeatureSource, extractors: List[GoldFeatureExtractor]) -> Optional[DataError]:
    """A DataError for the first input an extractor needs that ``source`` lacks."""
    fields = [f for e in extractors for f in (("text", "audio") if e.input == "speech" else (e.input,))]
    for field in dict.fromkeys(fields):
        value = _input_of(source, field)
        if field == "text":
            if value is None or not str(value).strip():
                return DataError("no gold response text (an extractor reads it)", record=source.key, field=field)
        elif value is None:
            return DataError(f"no gold response {field} file (an extractor reads it)", record=source.key, field=field)
        elif not Path(value).is_file():
            return DataError(f"{field} file not found", file=value, record=source.key, field=field)
    return None


def _locate(error: DataError, source: FeatureSource, extractor: GoldFeatureExtractor) -> DataError:
    """``error`` from ``extractor`` restated for one sample: its media file, key and field."""
    file = error.file
    if file is None and extractor.input != "text":
        file = _input_of(source, "audio" if extractor.input == "speech" else extractor.input)
    field = extractor.input
    if field == "speech":
        # Of the text and the recording it reads, name the one the error is about.
        field = error.field if error.field in ("text", "audio") else "audio"
    located = DataError(f"{extractor.name}: {error.reason}", file=file, record=source.key, field=field)
    located.__cause__ = error
    return located


def _checked_outputs(
    extractor: GoldFeatureExtractor, batch: List[FeatureSource], outputs: Any
) -> List[Union[torch.Tensor, DataError]]:
    """The extractor's outputs as owned, contiguous CPU tensors, or a DataError per
    sample whose feature holds NaN or infinite values. A broken contract (wrong count,
    not a tensor, wrong rank) is a bug in the extractor and raises at once."""
    if not isinstance(outputs, (list, tuple)) or len(outputs) != len(batch):
        count = len(outputs) if isinstance(outputs, (list, tuple)) else type(outputs).__name__
        raise TypeError(f"extractor {extractor.name!r} must return a list of {len(batch)} tensors, got {count}")
    checked: List[Union[torch.Tensor, DataError]] = []
    for source, tensor in zip(batch, outputs):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() not in (1, 2):
            shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(
                f"extractor {extractor.name!r} returned {shape} for {source.key!r}; expected a (D,) or (L, D) tensor"
            )
        # An explicit copy: outputs are often views into one batch tensor, which
        # safetensors refuses to save (shared storage) and which would keep the whole
        # batch (possibly on the GPU) alive.
        tensor = tensor.detach().to(device="cpu", memory_format=torch.contiguous_format, copy=True)
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            checked.append(
                _locate(DataError("feature holds NaN or infinite values"), source, extractor)
            )
        else:
            checked.append(tensor)
    return checked


def _run_extractor(
    extractor: GoldFeatureExtractor, batch: List[FeatureSource]
) -> List[Union[torch.Tensor, DataError]]:
    """One call of ``extractor`` on the whole batch; per sample, its tensor or its DataError.

    A DataError raised for the batch does not say which sample was bad, so only then is
    the batch rerun one sample at a time to find out.
    """
    try:
        return _checked_outputs(extractor, batch, extractor([_input_of(s, extractor.input) for s in batch]))
    except DataError as batch_error:
        if len(batch) == 1:
            return [_locate(batch_error, batch[0], extractor)]
        results: List[Union[torch.Tensor, DataError]] = []
        for source in batch:
            try:
                results.extend(_checked_outputs(extractor, [source], extractor([_input_of(source, extractor.input)])))
            except DataError as error:
                results.append(_locate(error, source, extractor))
        if not any(isinstance(r, DataError) for r in results):
            raise DataError(
                f"{extractor.name}: {batch_error.reason} (raised for the batch, but for none of its samples alone)",
                file=batch_error.file,
                record=", ".join(s.key for s in batch),
                field=extractor.input,
            ) from batch_error
        return results


def _extract_shard(
    shard: List[FeatureSource],
    extractors: List[GoldFeatureExtractor],
    batch_size: int,
    on_error: str,
    features: Dict[str, Dict[str, Any]],
    bar,
) -> Tuple[Dict[str, torch.Tensor], List[str], List[Dict[str, Optional[str]]]]:
    """Features of one shard: ``({"key/name": tensor}, stored keys, skipped entries)``."""
    tensors: Dict[str, torch.Tensor] = {}
    keys: List[str] = []
    skipped: List[Dict[str, Optional[str]]] = []

    def fail(error: DataError) -> None:
        if on_error == "raise":
            raise error
        skipped.append({"key": error.record, "reason": error.reason, "field": error.field, "file": error.file})

    # Shapes seen in this shard so far, checked against the completed shards' summary.
    shapes = {name: (info["ndim"], info["dim"], info["dtype"]) for name, info in features.items()}
    for begin in range(0, len(shard), batch_size):
        batch = shard[begin : begin + batch_size]
        alive: List[FeatureSource] = []
        for source in batch:
            missing = _missing_input(source, extractors)
            if missing is None:
                alive.append(source)
            else:
                fail(missing)
        found: Dict[str, Dict[str, torch.Tensor]] = {s.key: {} for s in alive}
        for extractor in extractors:
            if not alive:
                break
            survivors = []
            for source, result in zip(alive, _run_extractor(extractor, alive)):
                if isinstance(result, DataError):
                    # The whole sample goes: later extractors are not run on it.
                    fail(result)
                    continue
                shape = (result.dim(), result.shape[-1], str(result.dtype).replace("torch.", ""))
                expected = shapes[extractor.name]
                if expected[0] is not None and expected != shape:
                    raise ValueError(
                        f"extractor {extractor.name!r} returned ndim {shape[0]}, trailing dim {shape[1]}, "
                        f"dtype {shape[2]} for {source.key!r}, but ndim {expected[0]}, dim {expected[1]}, "
                        f"dtype {expected[2]} before; every sample of a feature must agree"
                    )
                shapes[extractor.name] = shape
                found[source.key][extractor.name] = result
                survivors.append(source)
            alive = survivors
        for source in alive:
            keys.append(source.key)
            for name, tensor in found[source.key].items():
                tensors[f"{source.key}/{name}"] = tensor
        bar.update(len(batch))
    # Skips in source order, whatever stage found them.
    order = {s.key: i for i, s in enumerate(shard)}
    skipped.sort(key=lambda entry: order[entry["key"]])
    return tensors, keys, skipped


def _note_features(features: Dict[str, Dict[str, Any]], tensors: Dict[str, torch.Tensor]) -> None:
    for tensor_name, tensor in tensors.items():
        info = features[tensor_name.rsplit("/", 1)[1]]
        info["ndim"] = tensor.dim()
        info["dim"] = int(tensor.shape[-1])
        info["dtype"] = str(tensor.dtype).replace("torch.", "")
        if tensor.dim() == 2:
            length = int(tensor.shape[0])
            info["min_length"] = length if info["min_length"] is None else min(info["min_length"], length)
            info["max_length"] = length if info["max_length"] is None else max(info["max_length"], length)


def _skip_summary(skipped: List[SkippedSample], total: int, listed: int = 10) -> str:
    lines = [f"gold features: {len(skipped)} of {total} sample(s) skipped"]
    lines += [f"  skipped: {s}" for s in skipped[:listed]]
    if len(skipped) > listed:
        lines.append(f"  ... and {len(skipped) - listed} more (all listed in {MANIFEST_NAME})")
    return "\n".join(lines)


# -- files -------------------------------------------------------------------------------


def _read_manifest(directory: Path) -> Optional[Dict]:
    path = directory / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise GoldFeatureStoreError(f"{path}: cannot read the gold feature manifest: {error}") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise GoldFeatureStoreError(f"{path} is not a gold feature manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise GoldFeatureStoreError(
            f"{path}: gold feature format version {manifest.get('format_version')}, this reader knows "
            f"{FORMAT_VERSION}; extract again into a new directory"
        )
    return manifest


def _shard_fingerprint(handle) -> Optional[str]:
    """The run fingerprint a shard file was written under (None if it has none)."""
    try:
        return json.loads((handle.metadata() or {})[SHARD_METADATA_KEY])["fingerprint"]
    except (KeyError, TypeError, ValueError):
        return None


def _write_shard(path: Path, tensors: Dict[str, torch.Tensor], fingerprint: str, index: int) -> None:
    from safetensors.torch import save_file

    # One metadata entry: safetensors writes several in an arbitrary order, which
    # would make the same shard differ byte for byte between runs.
    metadata = {SHARD_METADATA_KEY: json.dumps({"fingerprint": fingerprint, "shard": index}, sort_keys=True)}

    with atomic_path(path) as temporary:
        # safetensors creates its files owner-only (0600); the shards should be as
        # readable as any other file written here (e.g. by other users of a shared
        # data directory), so they get the mode that the umask gives a new file.
        with open(temporary, "xb"):
            pass
        mode = temporary.stat().st_mode & 0o777
        save_file(tensors, str(temporary), metadata=metadata)
        os.chmod(temporary, mode)


def _write_manifest(directory: Path, manifest: Dict) -> None:
    text = json.dumps(manifest, indent=1, ensure_ascii=False) + "\n"
    write_text_atomic(directory / MANIFEST_NAME, text)
