"""Command line.

* ``empatheia respond FILE [--conversation ID] [--turn N] --out DIR``: answer one turn of a
  dataset file in any format ``data check`` reads.
* ``empatheia serve [--port N]``: a web page and an HTTP API to talk to the avatar.
* ``empatheia chat [--speak]``: talk to the avatar in the terminal.
* ``empatheia data check FILE [--media-root DIR]``: what a dataset holds, and what is wrong.
* ``empatheia data extract-features FILE --out DIR --extractor MODULE:NAME``: gold
  generator features for training stages 2-4.
* ``empatheia train CONFIG.yaml [--set key=value ...] [--resume]``: run a training recipe
  (one process, or N under ``torchrun``/``deepspeed``).
* ``empatheia eval ...``: score predictions or run a model over a dataset and score it.
* ``empatheia human export|aggregate ...``: the human-evaluation kit.

Every command that reads a config takes ``--set key=value ...`` (the model's keys for
``respond``, ``eval``, ``data render`` and ``data extract-features --generators-of``; the
stage config's for ``train``), parsed by :mod:`empatheia.config_loader`.

Errors
------
:func:`main` is the one error boundary of every command: an expected failure (bad data,
a bad config, a file that cannot be read or written, a full disk, a model that cannot
load, a device that is not there) ends as one line on standard error,
``error: <file>, record <id>, field '<name>': <reason>`` with what is known, and exit
status 1. Any other exception is a bug and keeps its traceback; set ``EMPATHEIA_DEBUG=1``
to see the traceback of expected failures too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from .chain_targets import GOAL_ACT_SHARE
from .config_loader import ConfigError, add_set_argument, preset_names
from .decoding import add_decoding_arguments, decoding_from_args
from .errors import DataError
from .variants import SYSTEMS
from .loading import WritingProgress, check_device, load_labels, load_system, model_overrides, progress, system_arguments

DEBUG_VARIABLE = "EMPATHEIA_DEBUG"
"""Set (to anything but empty) to show the traceback of an expected failure too."""


def _in_conversation(error: DataError, path: Path, example=None) -> DataError:
    """``error`` said in the terms of the dataset file ``path``: a media file is named after
    the file that refers to it, and, for an error of the dialogue of ``example`` (a
    :class:`~empatheia.data.readers.PickedExample`), that dialogue's turn ``i`` is where
    the file holds it (AvaMERG's ``turns[t].dialogue_history[i].utterance``)."""
    field = error.field
    match = re.fullmatch(r"turns\[(\d+)\]\.(\w+)", field or "") if example is not None else None
    if match:
        field = example.turn_field(int(match[1]), match[2])
    file = f"{path}: {error.file}" if error.file and error.file != str(path) else str(path)
    return type(error)(error.reason, file=file, record=error.record, field=field)


def _writable_folder(out: Path) -> None:
    """``--out`` must be, or be creatable as, a folder: checked before the model loads."""
    if out.exists() and not out.is_dir():
        raise SystemExit(f"error: --out {out}: exists and is not a folder")
    existing = next(parent for parent in (out, *out.parents) if parent.exists())
    if not existing.is_dir():
        raise SystemExit(f"error: --out {out}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SystemExit(f"error: --out {out}: {existing} is not writable")


def _remove_new(folder: Path, before: Optional[set]) -> None:
    """Undo a save that failed midway: the entries of ``folder`` that were not in
    ``before``, and the folder itself where it did not exist (``before`` is ``None``)."""
    import shutil

    if not folder.is_dir():
        return
    if before is None:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for entry in folder.iterdir():
        if entry.name in before:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def respond(args: argparse.Namespace) -> int:
    from .data.readers import read_example

    path = args.conversation_file
    try:
        example = read_example(path, args.conversation, args.turn, format=args.format, media_root=args.media_root)
    except DataError as error:
        raise _in_conversation(error, path) from None
    dialogue = example.dialogue
    # Everything that can be checked without the model is, before minutes of loading.
    decoding = decoding_from_args(args)
    _writable_folder(args.out)
    check_device(args.device)
    start = time.perf_counter()
    model = _warm_model(args, speak=args.speak, animate=args.animate)
    progress(f"responding to dialogue {dialogue.id}")
    writing = WritingProgress()
    try:
        response = model.respond(dialogue, max_new_tokens=args.max_new_tokens, speak=args.speak, animate=args.animate,
                                 progress=writing, **decoding.kwargs())
    except DataError as error:
        if error.record != dialogue.id:
            raise  # not about the conversation: a remembered avatar's file, say
        # A media file that does not decode, a turn too long for the prompt.
        raise _in_conversation(error, path, example) from None
    finally:
        writing.done()
    if response.dropped_turns:
        progress(f"the dialogue's {response.dropped_turns} oldest turn(s) were left out to fit "
                 f"language_model.max_length={model.config.language_model.max_length}")
    before = {entry.name for entry in args.out.iterdir()} if args.out.is_dir() else None
    try:
        out = response.save(args.out, dialogue)
    except BaseException:
        _remove_new(args.out, before)
        raise
    progress(f"wrote {out / 'response.json'} in {time.perf_counter() - start:.1f}s")
    print(json.dumps({"text": response.text, "chain_emotion": response.chain.speaker_emotion,
                      "emotion": response.emotion.label,
                      "profile": {name: prediction.label for name, prediction in response.profile.items()}},
                     ensure_ascii=False))
    return 0


def _warm_model(args: argparse.Namespace, speak: bool, animate: bool = False):
    """The model of the arguments, loaded, with its avatars folder and the generators it
    will use: the voice when it will speak, the talking head too when it will animate."""
    start = time.perf_counter()
    model = load_system(args)
    if args.avatars is not None:
        model.config.generators.avatars = str(args.avatars)
    if speak or animate:
        model.speech_generator()
    if animate:
        model.talking_head()
    progress(f"model ready in {time.perf_counter() - start:.1f}s")
    return model


def serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from .serve.app import create_app
    except ImportError as error:
        raise SystemExit(f"error: empatheia serve needs FastAPI and uvicorn: pip install 'empatheia[serve]' ({error})")
    from .serve.conversation import warm_up
    from .serve.uploads import UploadLimits

    model = _warm_model(args, speak=True, animate=True)
    if not args.no_warmup:
        progress(f"first turn answered in {warm_up(model):.1f}s (later turns find everything loaded)")
    limits = UploadLimits(max_bytes=int(args.max_upload_mb * 2**20), max_seconds=args.max_seconds)
    app = create_app(model, root=args.sessions_dir, limits=limits, max_pending=args.queue,
                     session_ttl=args.session_ttl, max_new_tokens=args.max_new_tokens)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        progress(f"listening on {args.host}: anyone who can reach this machine can talk to the model and upload files")
    progress(f"open http://{args.host}:{args.port}/ (API schema: /openapi.json); Ctrl-C stops")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def chat(args: argparse.Namespace) -> int:
    import sys

    from .serve.chat import Chat, find_player

    speak = args.speak or args.animate
    decoding = decoding_from_args(args)
    model = _warm_model(args, speak=speak, animate=args.animate)
    player = None if args.no_play or not speak or not sys.stdout.isatty() else find_player()
    session = Chat(model, args.out, speak=speak, animate=args.animate, player=player, max_new_tokens=args.max_new_tokens,
                   user=args.user, decoding=decoding)
    return session.run(sys.stdin)


def data_check(args: argparse.Namespace) -> int:
    from .data.check import check_dataset
    from .errors import DataError
    from .labels import LabelSets

    labels = load_labels(args.labels) or LabelSets()
    speech = video = limits = None
    if args.decode:
        from .config import EmpatheiaConfig

        # Decoded as the model that will read the files does: its sample rate, frames and
        # length limit, and a face looked for only where its video_encoder.face_crop is on
        # (not for small's drawn avatars).
        config = EmpatheiaConfig.from_preset(args.preset)
        speech, video, limits = config.speech_encoder, config.video_encoder, config.media
        if args.no_face_check:
            video.face_crop = False
    try:
        report = check_dataset(
            args.file, media_root=args.media_root, format=args.format, labels=labels, decode_media=args.decode,
            speech=speech, video=video, limits=limits,
        )
    except DataError as error:
        raise SystemExit(f"error: {error}")
    print(report.format_text(labels))
    return 0 if report.ok else 1


def _load_extractors(specs: List[str]) -> list:
    import importlib

    extractors = []
    for spec in specs:
        module_name, _, name = spec.partition(":")
        if not module_name or not name:
            raise SystemExit(f"error: --extractor {spec!r}: expected MODULE:NAME")
        try:
            factory = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as error:
            raise SystemExit(f"error: --extractor {spec!r}: {error}; for the gold features of a model's own "
                             "generators use --generators-of PRESET_OR_MODEL_DIR (e.g. --generators-of small)")
        made = factory() if callable(factory) and not hasattr(factory, "fingerprint") else factory
        extractors.extend(made if isinstance(made, (list, tuple)) else [made])
    return extractors


def data_split(args: argparse.Namespace) -> int:
    from .data.render import split_ed_file
    from .errors import DataError

    try:
        files = split_ed_file(args.file, args.out, args.eval_fraction)
    except DataError as error:
        raise SystemExit(f"error: {error}")
    counts = {name: sum(1 for _ in open(path)) for name, path in files.items()}
    print(json.dumps({name: {"file": str(path), "conversations": counts[name]} for name, path in files.items()}))
    return 0


def data_distill(args: argparse.Namespace) -> int:
    from .data.distill import distill_examples, distill_replies

    dialogues = distill_examples(args.file, args.limit)  # a bad file fails before the model loads
    check_device(args.device)
    model = load_system(args)
    if not hasattr(model, "given_emotion_prior"):
        raise SystemExit(f"error: --system {args.system} has no chain to hold to an emotion; use --system empatheia")
    report = distill_replies(model, dialogues, args.out, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)
    if report.kept_reference:
        print(f"{len(report.kept_reference)} examples keep the human reply (the model's was empty): "
              f"{', '.join(report.kept_reference[:10])}", file=sys.stderr)
    if report.not_held:
        print(f"{len(report.not_held)} examples' chains were written without the given emotion (the reply follows "
              f"the model's reading; the line says emotion_held: false): {', '.join(report.not_held[:10])}",
              file=sys.stderr)
    print(json.dumps({"file": str(report.path), "examples": report.examples, "written": report.written,
                      "kept_reference": len(report.kept_reference), "not_held": len(report.not_held)}))
    return 0


def data_drop_echoes(args: argparse.Namespace) -> int:
    from .data.distill import drop_listener_echoes
    from .evaluation.text import LISTENER_ECHO_WORDS

    try:
        report = drop_listener_echoes(args.file, args.out, args.words or LISTENER_ECHO_WORDS)
    except (DataError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}")
    print(json.dumps({"file": str(report.path), "kept": report.kept, "dropped": len(report.dropped),
                      "with_listener_turn": report.with_listener_turn, "dropped_ids": report.dropped}))
    return 0


def data_goal_acts(args: argparse.Namespace) -> int:
    from .chain_targets import fit_act_openings, fit_goal_acts, fit_goal_counts, save_goal_acts
    from .data.readers import read_dataset

    try:
        dialogues = read_dataset(args.file, require_media=False).dialogues
    except (DataError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}")
    pairs = [(d.emotion, d.response) for d in dialogues if d.emotion and d.response is not None]
    if not pairs:
        raise SystemExit(f"error: {args.file}: no example has both an emotion and a reply to fit on")
    try:
        table = fit_goal_acts(pairs, min_share=args.min_share, min_count=args.min_count)
    except ValueError as error:
        raise SystemExit(f"error: --min-share: {error}")
    openings = fit_act_openings((reply for _, reply in pairs), min_count=args.min_count,
                                limit=args.openings_per_act)
    save_goal_acts(table, args.out, openings=openings, goal_counts=fit_goal_counts(pairs),
                   min_share=args.min_share, min_count=args.min_count,
                   openings_per_act=args.openings_per_act, fitted_on=args.file.name, replies=len(pairs))
    print(f"{len(pairs)} replies, {len(table)} emotions, openings of {len(openings)} acts: {args.out}")
    return 0


def data_render(args: argparse.Namespace) -> int:
    from .config import EmpatheiaConfig
    from .data.render import RenderSettings, render_ed_conversations, training_face_clips
    from .errors import DataError

    try:
        config = EmpatheiaConfig.from_preset(args.preset, model_overrides(args))
    except ConfigError as error:
        raise SystemExit(f"error: {error}")
    try:
        settings = RenderSettings(
            speech_style_dim=config.style_disentangler.speech_style_dim,
            video_style_dim=config.style_disentangler.video_style_dim,
            speech_content_dim=config.content_synchronizer.speech_content_dim,
            video_content_dim=config.content_synchronizer.video_content_dim,
            face_clips=training_face_clips(args.faces, args.hold_out_actor) if args.faces else (),
        )
        path = render_ed_conversations(args.file, args.out, settings, limit=args.limit, workers=args.workers)
    except DataError as error:
        raise SystemExit(f"error: {error}")
    print(json.dumps({"examples": sum(1 for _ in open(path)), "file": str(path)}))
    return 0


def _generator_extractors(source: str, overrides: Dict[str, Any]) -> list:
    """The gold features of the generators a model config names (a preset or a saved
    model directory, with ``overrides``), at that model's sizes."""
    from empatheia.generators import build_generators, gold_feature_extractors

    from .config import EmpatheiaConfig
    from .modeling import CONFIG_NAME

    path = Path(source)
    try:
        if path.is_dir():
            config = EmpatheiaConfig.load_yaml(path / CONFIG_NAME).update(overrides)
        else:
            config = EmpatheiaConfig.from_preset(source, overrides)
        return gold_feature_extractors(*build_generators(config))
    except (ValueError, KeyError, FileNotFoundError) as error:
        raise SystemExit(f"error: --generators-of {source!r}: {error}")


def data_extract_features(args: argparse.Namespace) -> int:
    from .data import extract_gold_features, gold_feature_sources, read_dataset
    from .data.gold_features import GoldFeatureStoreError
    from .errors import DataError

    if bool(args.extractor) == bool(args.generators_of):
        raise SystemExit("error: give either --extractor MODULE:NAME or --generators-of PRESET_OR_MODEL_DIR")
    if args.extractor and args.set:
        raise SystemExit("error: --set gives model config keys, for --generators-of only")
    extractors = _load_extractors(args.extractor) if args.extractor else _generator_extractors(args.generators_of, model_overrides(args))
    on_error = "skip" if args.skip_bad else "raise"
    try:
        corpus = read_dataset(args.file, format=args.format, media_root=args.media_root, labels=load_labels(args.labels), on_error=on_error)
        sources = gold_feature_sources(corpus)
        if not sources:
            raise SystemExit(f"error: {args.file}: no example has a gold response to extract features from")
        progress(f"{len(sources)} responses from {args.file}; extracting {[e.name for e in extractors]} into {args.out}")
        store = extract_gold_features(
            sources, extractors, args.out, shard_size=args.shard_size, batch_size=args.batch_size, on_error=on_error
        )
    except (DataError, GoldFeatureStoreError) as error:
        raise SystemExit(f"error: {error}")
    for skipped in list(corpus.skipped.skipped) + list(store.skipped):
        print(f"skipped: {skipped}")
    print(f"{len(store)} of {len(sources)} responses have features {list(store.feature_names)} in {args.out}; "
          f"{len(corpus.skipped) + len(store.skipped)} sample(s) skipped")
    return 0


def variants_styles(args: argparse.Namespace) -> int:
    """``empatheia variants styles``: measure a style table and write it."""
    import re

    from .data.render import read_face_clips
    from .labels import EMOTION_LABELS
    from .modeling import Empatheia
    from .variants.styles import StyleTable, measure_clip_styles, measure_generator_styles

    if (args.speech_clips is None) != (args.faces is None) or (args.fallback and args.speech_clips is None):
        raise SystemExit("error: --speech-clips and --faces go together (and --fallback only with them)")
    try:
        model = Empatheia.from_preset(args.preset, model_overrides(args), trained=False)
    except (FileNotFoundError, ValueError, KeyError, ConfigError) as error:
        raise SystemExit(f"error: {error}")
    speech, head = model.generators()
    if args.speech_clips is None or args.fallback is None:
        progress(f"measuring the {args.preset} generators' styles, one emotion at a time")
        generated = measure_generator_styles(speech, head, model.avatars(), progress=lambda c: progress(f"  {c} done"))
    table = generated if args.speech_clips is None else None
    if args.speech_clips is not None:
        fallback = StyleTable.load(args.fallback) if args.fallback else generated
        voices: Dict[str, List[Path]] = {}
        for path in sorted(args.speech_clips.glob("*.wav")):
            emotion = next((_emotion_of(w) for w in re.findall(r"[a-z]+", path.stem.lower()) if _emotion_of(w)), None)
            if emotion is None:
                raise SystemExit(f"error: {path}: no emotion in the file name")
            voices.setdefault(emotion, []).append(path)
        faces: Dict[str, List[Path]] = {}
        for clip in read_face_clips(args.faces):
            if clip.emotion in EMOTION_LABELS:  # a neutral clip styles no class
                faces.setdefault(clip.emotion, []).append(clip.path)
        if not voices or not faces:
            raise SystemExit(f"error: no speech clip in {args.speech_clips} or no face clip in {args.faces}")
        table = measure_clip_styles(speech, head, voices, faces, fallback)
    table.save(args.out)
    print(json.dumps({"out": str(args.out), "classes": table.classes, "sources": table.sources}, indent=1))
    return 0


def variants_export_pipeline(args: argparse.Namespace) -> int:
    """``empatheia variants export-pipeline``: the adapter of a pipeline_text run, in half precision."""
    from .modeling import Empatheia
    from .variants.pipeline import export_pipeline_core

    folder = args.model / "final" if (args.model / "final").is_dir() else args.model
    try:
        model = Empatheia.from_pretrained(folder)
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"error: {args.model}: {error}")
    path = export_pipeline_core(model, args.out)
    print(json.dumps({"out": str(path), "bytes": path.stat().st_size}))
    return 0


def variants_mcoe(args: argparse.Namespace) -> int:
    """``empatheia variants mcoe``: each dialogue's multimodal chain, by id, as JSONL."""
    from .data import read_dataset
    from .errors import DataError
    from .variants.mcoe import build_mcoe_targets, save_mcoe_targets

    try:
        corpus = read_dataset(args.data, format=args.format, media_root=args.media_root, require_media=False)
        if args.model is not None:
            from .variants.meria import write_chains
            from .variants.models import load_variant_model

            progress(f"loading MERIA from {args.model}")
            chains = write_chains(load_variant_model(args.model), corpus.dialogues, args.batch_size)
        else:
            chains = build_mcoe_targets(corpus.dialogues)
    except (DataError, FileNotFoundError, ValueError) as error:
        raise SystemExit(f"error: {error}")
    save_mcoe_targets(chains, args.out)
    print(json.dumps({"out": str(args.out), "chains": len(chains), "source": "model" if args.model else "readers"}))
    return 0


def _emotion_of(word: str) -> Optional[str]:
    """The class a word of a clip's file name names (``fearful`` -> fear), or ``None``."""
    from .labels import UnknownEmotionError, fold_emotion

    try:
        return fold_emotion(word)
    except UnknownEmotionError:
        return None


def train(args: argparse.Namespace) -> int:
    from importlib import resources

    from empatheia.recipes.recipe import run_file

    config = args.config
    if args.system == "e3rg":
        raise SystemExit("error: e3rg is training-free; its emotion readers are fitted with "
                         "python -m empatheia.recipes.fit_emotion_readers (docs/variants.md)")
    if args.system in ("meria", "early_fusion"):
        first = "meria_pdr" if args.system == "meria" else "early_fusion_joint"
        raise SystemExit(f"error: {args.system} trains in stages, each its own config: run "
                         f"configs/train/{first}.yaml and the next ones in order, without --system (docs/variants.md)")
    if args.system == "pipeline":
        if config is not None:
            raise SystemExit("error: --system pipeline runs the packaged configs/train/pipeline_text.yaml; "
                             "give your changes with --set, or run your config without --system")
        config = Path(str(resources.files("empatheia.configs") / "train" / "pipeline_text.yaml"))
    elif config is None:
        raise SystemExit("error: give a stage config, e.g. empatheia train configs/train/stage1_coe.yaml")
    return run_file(config, args.set or [], resume=args.resume)


def positive_int(text: str) -> int:
    """An argument that counts something and must be at least 1 (0 must not quietly mean
    the default)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def model_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of the commands that answer with a model: which model, where it runs,
    and its avatars."""
    source = p.add_mutually_exclusive_group()
    source.add_argument("--preset", choices=preset_names(), default="small", help="tiny (random weights), small (offline, trained; the default) or paper")
    source.add_argument("--checkpoint", type=Path, help="a directory written by save_pretrained")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help="longest answer in tokens, at least 1 (default: the model config's)")
    p.add_argument("--device", default=None, help="e.g. cuda, cuda:1 (default: CPU)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    p.add_argument("--avatars", type=Path, help="folder of registered avatars (voice and portrait per listener ID)")
    add_set_argument(p, "override a model config key by its dotted name, e.g. language_model.pretrained=/models/vicuna")
    system_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="empatheia", description="Multimodal empathetic response generation.")
    commands = parser.add_subparsers(dest="command", required=True)
    from .data.readers import FORMATS

    p = commands.add_parser("respond", help="answer one turn of a conversation in any format `data check` reads")
    p.add_argument("conversation_file", type=Path, metavar="FILE",
                   help="AvaMERG JSON (a conversation or a list of them), avatar JSONL or EmpatheticDialogues JSONL")
    p.add_argument("--format", default="auto", choices=["auto", *FORMATS], help="the file's format (default: told from it)")
    p.add_argument("--conversation", metavar="ID",
                   help="the conversation to answer when the file holds several: AvaMERG conversation_id, "
                        "EmpatheticDialogues conv_id, avatar JSONL id (a whole id picks that line; 'c' picks the lines 'c/...')")
    p.add_argument("--turn", type=int, default=-1, metavar="N",
                   help="which of the conversation's examples (AvaMERG: its turns; EmpatheticDialogues: its listener "
                        "utterances or lines; avatar JSONL: its lines), 0-based; default -1, the last")
    p.add_argument("--media-root", type=Path,
                   help="folder of the media: AvaMERG's dia{id}utt{index}_{avatar}.wav/.mp4 files; avatar JSONL paths "
                        "are relative to it (default: the file's folder)")
    model_arguments(p)
    p.add_argument("--speak", action="store_true", help="also write the spoken answer, response.wav")
    p.add_argument("--animate", action="store_true", help="also write the talking head, response.mp4 (speaks too)")
    p.add_argument("--out", type=Path, required=True, help="directory for response.json (and .wav, .mp4)")
    add_decoding_arguments(p.add_argument_group("decoding"))
    p.set_defaults(run=respond)

    p = commands.add_parser("serve", help="a web page and an HTTP API to talk to the avatar, the model kept loaded")
    model_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-upload-mb", type=float, default=16.0, help="largest upload per file (MiB)")
    p.add_argument("--max-seconds", type=float, default=30.0, help="longest audio or video upload (s)")
    p.add_argument("--queue", type=int, default=16, help="turns that may wait for the model; more are answered busy")
    p.add_argument("--session-ttl", type=float, default=3600.0, help="seconds before an idle session and its files go")
    p.add_argument("--sessions-dir", type=Path, help="folder for the sessions' files (default: a temporary one)")
    p.add_argument("--no-warmup", action="store_true", help="do not answer a first turn before serving")
    p.set_defaults(run=serve)

    p = commands.add_parser("chat", help="talk to the avatar in the terminal, the model kept loaded")
    model_arguments(p)
    p.add_argument("--speak", action="store_true", help="answer with a voice too (written, and played where possible)")
    p.add_argument("--animate", action="store_true", help="answer with a talking head too (speaks too)")
    p.add_argument("--no-play", action="store_true", help="write the voice without playing it")
    p.add_argument("--out", type=Path, default=Path("chat_output"), help="folder of the turns' files (turn-<n>/)")
    p.add_argument("--user", default=None,
                   help="who is talking: with --system e3rg and --memory, their earlier turns are recalled in later sessions")
    add_decoding_arguments(p.add_argument_group("decoding"))
    p.set_defaults(run=chat)

    data = commands.add_parser("data", help="check datasets and extract gold features").add_subparsers(
        dest="data_command", required=True
    )

    def dataset_arguments(p: argparse.ArgumentParser) -> None:
        from .data.readers import FORMATS

        p.add_argument("file", type=Path, metavar="FILE", help="AvaMERG JSON, EmpatheticDialogues or avatar JSONL")
        p.add_argument("--media-root", type=Path, help="folder of the media files")
        p.add_argument("--format", default="auto", choices=["auto", *FORMATS])
        p.add_argument("--labels", type=Path, help="YAML with emotions, profile and emotion_fold (default: AvaMERG's)")

    p = data.add_parser("check", help="count conversations, turns, media and labels; list every problem")
    dataset_arguments(p)
    p.add_argument("--decode", action="store_true", help="also decode every media file and check it")
    p.add_argument("--no-face-check", action="store_true", help="with --decode: do not look for a face in videos")
    p.add_argument("--preset", choices=preset_names(), default="small",
                   help="with --decode: check the media as this preset's model reads them (sample rate, frames "
                        "taken, media.max_seconds, and a face looked for where its video_encoder.face_crop is on: "
                        "paper); default small")
    p.set_defaults(run=data_check)

    p = data.add_parser("extract-features", help="pre-extract gold generator features (resumable)")
    dataset_arguments(p)
    p.add_argument("--out", type=Path, required=True, help="feature store directory (rerun to resume)")
    p.add_argument(
        "--extractor",
        action="append",
        metavar="MODULE:NAME",
        help="an extractor, or a function returning one or a list of them (repeatable)",
    )
    p.add_argument(
        "--generators-of",
        metavar="PRESET_OR_MODEL_DIR",
        help="the four gold features of the generators this model uses (e.g. tiny, paper, runs/stage1_coe/final)",
    )
    add_set_argument(p, "override a key of --generators-of's model config by its dotted name, e.g. generators.speech=piper")
    p.add_argument("--shard-size", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--skip-bad", action="store_true", help="skip and report bad samples instead of stopping")
    p.set_defaults(run=data_extract_features)

    p = data.add_parser("split", help="hold out a fixed share of EmpatheticDialogues conversations for evaluation")
    p.add_argument("file", type=Path, metavar="FILE", help="EmpatheticDialogues conversations JSONL")
    p.add_argument("--out", type=Path, required=True, help="folder for train.jsonl, eval.jsonl and split.json")
    p.add_argument("--eval-fraction", type=float, default=0.1)
    p.set_defaults(run=data_split)

    p = data.add_parser("distill", help="answer an EmpatheticDialogues file with a model, the chain held to each "
                                        "example's emotion, and write its replies as targets (resumable)")
    p.add_argument("file", type=Path, metavar="FILE", help="EmpatheticDialogues conversations or responses JSONL")
    p.add_argument("--out", type=Path, required=True, metavar="OUT.jsonl",
                   help="EmpatheticDialogues responses JSONL (rerun to resume)")
    p.add_argument("--limit", type=positive_int, help="only the first N examples (listener turns)")
    p.add_argument("--batch-size", type=positive_int, default=16)
    model_arguments(p)
    p.set_defaults(run=data_distill)

    p = data.add_parser("drop-echoes", help="copy an EmpatheticDialogues responses file without the lines whose "
                                            "response repeats words of an earlier listener turn (e.g. distilled "
                                            "targets)")
    p.add_argument("file", type=Path, metavar="FILE", help="EmpatheticDialogues responses JSONL")
    p.add_argument("--out", type=Path, required=True, metavar="OUT.jsonl")
    p.add_argument("--words", type=positive_int,
                   help="the run of words shared with a listener turn that makes a line an echo (default: the run "
                        "`empatheia eval` counts in listener_echo_share)")
    p.set_defaults(run=data_drop_echoes)

    p = data.add_parser("goal-acts", help="fit which acts of a reply fit each emotion, from what a dataset's "
                                          "listeners did (language_model.chain_goal_acts)")
    p.add_argument("file", type=Path, metavar="FILE", help="a training split in any format `data check` reads")
    p.add_argument("--out", type=Path, required=True, metavar="OUT.json")
    p.add_argument("--min-share", type=float, default=GOAL_ACT_SHARE,
                   help="an act fits an emotion when at least this share of its replies do it")
    p.add_argument("--min-count", type=positive_int, default=3,
                   help="... and at least this many; an opening is kept when this many sentences open so")
    p.add_argument("--openings-per-act", type=positive_int, default=12,
                   help="the commonest openings kept for each act (language_model.open_reply_by_goal)")
    p.set_defaults(run=data_goal_acts)

    p = data.add_parser("render", help="speak and animate EmpatheticDialogues conversations (offline generators)")
    p.add_argument("file", type=Path, metavar="FILE", help="EmpatheticDialogues conversations JSONL")
    p.add_argument("--out", type=Path, required=True, help="folder for train.jsonl and clips/ (rerun to resume)")
    p.add_argument("--preset", default="small", help="the model whose style and content sizes to render for")
    p.add_argument("--limit", type=int, help="render only the first N conversations")
    p.add_argument("--workers", type=int, default=1, help="processes rendering in parallel")
    p.add_argument("--faces", type=Path, help="folder of recorded face clips (MEAD names) that half the "
                                              "conversations' speakers show instead of the drawn avatar")
    p.add_argument("--hold-out-actor", help="leave this actor's clips out (to evaluate on)")
    add_set_argument(p, "override a key of --preset's model config by its dotted name")
    p.set_defaults(run=data_render)

    p = commands.add_parser("train", help="run a training stage or fine-tuning recipe from its YAML config")
    p.add_argument("config", type=Path, nargs="?", metavar="CONFIG.yaml", help="e.g. configs/train/stage1_coe.yaml")
    p.add_argument("--system", choices=SYSTEMS, default="empatheia",
                   help="pipeline: the pipeline baseline's language core (configs/train/pipeline_text.yaml)")
    add_set_argument(p, "override a stage config key by its dotted name, e.g. optim.learning_rate=1e-4")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint in output_dir")
    p.set_defaults(run=train)

    variants = commands.add_parser("variants", help="build what the field's other systems read (docs/variants.md)")
    variants = variants.add_subparsers(dest="variants_command", required=True)
    p = variants.add_parser("styles", help="measure an emotion -> style table on a preset's generators (or on real clips)")
    p.add_argument("--preset", default="small", help="whose generators measure the styles")
    p.add_argument("--out", type=Path, required=True, metavar="TABLE.json")
    p.add_argument("--speech-clips", type=Path, metavar="DIR",
                   help="real emotional speech (*.wav, the emotion in the file name): E3RG's bank instead of the "
                        "generators' own table")
    p.add_argument("--faces", type=Path, metavar="DIR", help="real face clips (MEAD names), with --speech-clips")
    p.add_argument("--fallback", type=Path, metavar="TABLE.json",
                   help="with clips: the table whose rows stand in for classes no clip shows (default: measured now)")
    add_set_argument(p, "override a key of --preset's model config by its dotted name")
    p.set_defaults(run=variants_styles)
    p = variants.add_parser("mcoe", help="MERIA: build the multimodal chains (M-CoE) of a dataset with the emotion readers, "
                                         "or write them with a trained M-CoE LLM")
    p.add_argument("data", type=Path, metavar="DATA", help="any dataset file `data check` reads")
    p.add_argument("--out", type=Path, required=True, metavar="FILE.jsonl")
    p.add_argument("--media-root", type=Path)
    p.add_argument("--format", default="auto")
    p.add_argument("--model", type=Path, metavar="MODEL_DIR",
                   help="a trained MERIA (meria_mcoe's output): its M-CoE LLM writes the chains the Response LLM "
                        "trains on, as the paper does; without it, the targets come from the readers and the data")
    p.add_argument("--batch-size", type=int, default=8)
    p.set_defaults(run=variants_mcoe)
    p = variants.add_parser("export-pipeline", help="write a trained pipeline's language-model adapter as a preset ships it")
    p.add_argument("model", type=Path, metavar="MODEL_DIR", help="the pipeline_text run's final/ (or output folder)")
    p.add_argument("--out", type=Path, required=True, metavar="FILE.safetensors",
                   help="e.g. empatheia/weights/small/pipeline_core.safetensors")
    p.set_defaults(run=variants_export_pipeline)

    from .evaluation.cli import add_eval_parsers

    add_eval_parsers(commands)
    return parser


def expected_failure(error: BaseException) -> Optional[str]:
    """The one line that reports ``error``, when it is a failure of the input or of the
    machine rather than a bug; ``None`` for a bug."""
    if isinstance(error, (DataError, ConfigError)):
        line = str(error)
    elif isinstance(error, UnicodeDecodeError):
        line = f"a file is not UTF-8 text ({error})"
    elif isinstance(error, OSError):
        # "[Errno 28] No space left on device: 'x'" -> "x: No space left on device"
        names = [str(name) for name in (error.filename, error.filename2) if name is not None]
        line = ": ".join([" -> ".join(names), error.strerror] if names and error.strerror else [str(error)])
    else:
        return None
    return " ".join(line.split("\n"))


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except Exception as error:
        line = expected_failure(error)
        if line is None or os.environ.get(DEBUG_VARIABLE):
            raise
        raise SystemExit(f"error: {line}") from None


if __name__ == "__main__":
    raise SystemExit(main())
