"""Command line of the evaluation: ``empatheia eval``, ``empatheia compare`` and ``empatheia human``.

Hook it into the main parser with one call::

    from .evaluation.cli import add_eval_parsers
    add_eval_parsers(commands)   # the main parser's add_subparsers() object

Commands (each parser sets ``run``, a function of the parsed arguments returning the exit
status; errors are ``SystemExit("error: ...")``):

* ``empatheia eval --predictions P --references R --out DIR [--allow-missing]
  [--multimodal]``: score files; writes ``DIR/metrics.json``, ``DIR/report.md``,
  ``DIR/report.html`` and the SVG plots.
* ``empatheia eval --checkpoint DIR | --preset NAME [--set KEY=VALUE ...] --data FILE
  [--format F] [--media-root DIR] --out DIR [--batch-size N] [--limit N]
  [--max-new-tokens N] [--speak | --animate] [--multimodal]``: answer the dataset
  (resumable: rerun the same command to continue), then score as above; also writes
  ``DIR/predictions.jsonl``, ``DIR/references.jsonl`` and ``DIR/run.json``. ``--speak`` /
  ``--animate`` write each response's speech / speech and talking head to
  ``DIR/media/<id>.wav`` / ``.mp4``.
* ``--labels YAML``: the classes scored in. A model run reads and scores with the model's
  own label sets (a fine-tuned model keeps its fold), so it needs none; scoring files
  defaults to AvaMERG's, and predictions whose ``emotion_probabilities`` name other classes
  are an error asking for ``--labels``.
* ``--skip-unknown-gold`` (either mode; also ``compare``) leaves out the references whose
  gold emotion the label sets do not know, counted in ``skipped_unknown_gold``; without it
  such a reference is an error naming the file, the record and the field.
* One command at a time writes an output folder: a second ``eval`` (or ``compare``) on a
  folder another one is writing stops at once with an error naming it.
* ``--multimodal`` (either mode) also scores the predictions' ``audio`` / ``video``
  files (paths relative to the predictions file's folder, or absolute): the ``speech``
  (Whisper tiny.en WER/CER against the response text, duration, loudness, agreement of
  the requested and realised speech style), ``video`` (CPBD, lip sync, FER
  facial-emotion accuracy against the gold emotion, identity consistency per
  ``avatar``, video style agreement, SSIM against the references' ``video`` clips) and
  ``consistency`` (text-video emotion, text-speech content) blocks of
  :mod:`empatheia.evaluation.multimodal`. It loads Whisper, the FER network and
  MobileNetV2, hence opt-in.
* ``empatheia compare --systems empatheia pipeline e3rg (--checkpoint DIR | --preset NAME)
  --data FILE --out DIR`` with the model-run options above: each system in turn, as
  ``eval --system S --out DIR/S`` (resumable), then ``DIR/comparison.json``, ``.md`` and
  ``.html`` (:mod:`empatheia.evaluation.compare`).
* ``empatheia human export --data FILE --predictions [NAME=]P ... --out KIT [--n 200]
  [--annotators 3|a,b,c] [--seed 0] [--criteria auto|text|multimodal|all]
  [--include-gold]``: rating sheets (``KIT/sheets/<annotator>.csv``), ``KIT/key.csv`` and
  ``KIT/instructions.md``.
* ``empatheia human aggregate KIT/sheets [--key KIT/key.csv] --out DIR``: per-system,
  per-criterion means and agreement into ``DIR/human_scores.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Tuple

from ..config_loader import add_set_argument
from ..decoding import add_decoding_arguments, decoding_from_args, decoding_given
from ..loading import load_labels, load_system, model_overrides, progress, system_arguments

if TYPE_CHECKING:
    from .model_runs import RunSummary
    from .scoring import ScoreOptions


def _check_mode(args: argparse.Namespace) -> str:
    """``"files"`` or ``"model"``; mixing the two modes' options is an error."""
    files = args.predictions is not None or args.references is not None
    model = args.checkpoint is not None or args.preset is not None
    if files and model:
        raise SystemExit("error: give either --predictions/--references (score files) or --checkpoint/--preset with --data, not both")
    if files:
        if args.predictions is None or args.references is None:
            raise SystemExit("error: scoring files needs both --predictions and --references")
        given = [f"--{name.replace('_', '-')}" for name in ("data", "limit", "max_new_tokens", "media_root", "device", "dtype")
                 if getattr(args, name) is not None]
        given += [f"--{name}" for name in ("speak", "animate", "set") if getattr(args, name)]
        given += decoding_given(args)
        if given:
            raise SystemExit(f"error: {', '.join(given)} only apply with --checkpoint/--preset")
        return "files"
    if not model:
        raise SystemExit("error: give --predictions P --references R, or --checkpoint DIR / --preset NAME with --data FILE")
    if args.allow_missing:
        raise SystemExit("error: --allow-missing only applies to scoring files (a model run predicts every example)")
    check_run_arguments(args)
    return "model"


def check_run_arguments(args: argparse.Namespace) -> None:
    """The checks of a model run's options (``eval`` with a model, ``compare``)."""
    if args.data is None:
        raise SystemExit("error: --checkpoint/--preset needs --data FILE")
    for name in ("batch_size", "limit", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be at least 1, got {value}")
    if args.multimodal and not (args.speak or args.animate):
        raise SystemExit("error: --multimodal scores the responses' speech and video: add --speak or --animate")
    decoding_from_args(args)  # its errors before the model loads


def score_options(args: argparse.Namespace) -> "ScoreOptions":
    """The :class:`~empatheia.evaluation.scoring.ScoreOptions` of the scoring options."""
    from .scoring import ScoreOptions

    return ScoreOptions(
        allow_missing=getattr(args, "allow_missing", False), labels=load_labels(args.labels), similarity=args.similarity,
        polarity=args.polarity, multimodal=args.multimodal, progress=not args.no_progress,
        unknown_gold="skip" if args.skip_unknown_gold else "error",
    )


def evaluate_system(args: argparse.Namespace, scoring: "ScoreOptions") -> Tuple[Dict[str, Any], "RunSummary"]:
    """Load ``args.system`` and run it over ``--data`` into ``--out``, resumably
    (:func:`~empatheia.evaluation.model_runs.evaluate_dataset`): ``(metrics, summary)``.
    Nothing outside keeps the model, so it is freed once this returns. Errors of the data
    or of an earlier run in the folder propagate; a system that cannot be built is
    :func:`~empatheia.loading.load_system`'s ``SystemExit``."""
    from .model_runs import RunOptions, evaluate_dataset

    if args.system == "e3rg" and args.memory is None:
        # The run's own memory, so a resumed run remembers what the stopped one saw.
        args.memory = Path(args.out) / "e3rg_memory"
    model = load_system(args)
    run = RunOptions(
        batch_size=args.batch_size or 8, max_new_tokens=args.max_new_tokens, speak=args.speak,
        animate=args.animate, progress=not args.no_progress, decoding=decoding_from_args(args),
        info={
            "model": f"checkpoint:{Path(args.checkpoint).resolve()}" if args.checkpoint else f"preset:{args.preset}",
            # Only when not Empatheia itself, so earlier runs still resume.
            **({"system": args.system} if args.system != "empatheia" else {}),
            "data": str(Path(args.data).resolve()),
            "format": args.format,
            "media_root": str(Path(args.media_root).resolve()) if args.media_root else None,
            "labels": str(Path(args.labels).resolve()) if args.labels else None,
            "dtype": args.dtype,
            # Only when given, so runs from before --set existed still resume.
            **({"overrides": model_overrides(args)} if args.set else {}),
        },
    )
    return evaluate_dataset(model, args.data, args.out, run, scoring, format=args.format, media_root=args.media_root,
                            limit=args.limit)


def run_eval(args: argparse.Namespace) -> int:
    """``empatheia eval``: score files, or run a model over a dataset and score it."""
    from ..errors import DataError
    from ..io import FolderLockedError, folder_lock
    from .model_runs import RunMismatchError
    from .report import REPORT_HTML, REPORT_MD, write_report
    from .scoring import METRICS_NAME, score_files, write_metrics

    mode = _check_mode(args)
    scoring = score_options(args)
    try:
        # The report is part of the folder the run writes: one lock until it is written.
        with folder_lock(args.out):
            if mode == "files":
                metrics = score_files(args.predictions, args.references, scoring)
                write_metrics(metrics, args.out)
            else:
                metrics, summary = evaluate_system(args, scoring)
                progress(f"{summary.selected} example(s): {summary.resumed} predicted by an earlier run, {summary.generated} now")
            written = write_report(metrics, args.out)
    except (DataError, RunMismatchError, ImportError, FileNotFoundError, FolderLockedError) as error:
        raise SystemExit(f"error: {error}")
    missing = metrics["missing"]
    if missing["without_reference"] or missing["without_prediction"]:
        progress(f"left out: {len(missing['without_reference'])} prediction(s) without reference, "
                  f"{len(missing['without_prediction'])} reference(s) without prediction (ids in metrics.json)")
    if missing.get("unknown_gold"):
        progress(f"left out: {len(missing['unknown_gold'])} reference(s) whose gold emotion the label sets do not know "
                 "(--skip-unknown-gold; ids in metrics.json)")
    media = metrics.get("media") or {}
    if media and not media.get("scored"):
        progress(f"{media['audio']} prediction(s) have audio and {media['video']} video, not scored: add --multimodal to score them")
    out = Path(args.out)
    summary_line: Dict[str, Any] = {k: metrics[k] for k in ("count", "emotion_accuracy", "dist_1", "dist_2",
                                                           "repeated_sentence_share")}
    if "listener_echo_share" in metrics:
        summary_line["listener_echo_share"] = metrics["listener_echo_share"]
    for block, key in (("speech", "wer_mean"), ("speech", "style_cosine_mean"), ("video", "cpbd_mean"),
                       ("video", "lip_sync_confidence_mean"), ("video", "facial_emotion_accuracy"),
                       ("video", "identity_consistency_mean"), ("video", "ssim_mean"), ("video", "style_cosine_mean")):
        if key in (metrics.get(block) or {}):
            summary_line[f"{block}_{key}"] = metrics[block][key]
    if "latency" in metrics:
        summary_line["seconds_per_answer"] = metrics["latency"]["seconds_mean"]
    if metrics.get("profile"):
        summary_line["profile_accuracy"] = {name: entry["accuracy"] for name, entry in metrics["profile"].items()}
    for key, reason in (metrics.get("not_applicable") or {}).items():
        progress(f"{key}: n/a ({reason})")
    summary_line.update(metrics=str(out / METRICS_NAME), report=str(written[REPORT_HTML]), markdown=str(written[REPORT_MD]))
    print(json.dumps(summary_line))
    return 0


def _predictions_specs(specs: List[str]) -> Dict[str, Path]:
    """``NAME=PATH`` (or ``PATH``: the name is the file's stem, or its folder's name for a
    ``predictions.jsonl``) -> ``{name: path}``."""
    systems: Dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            path = spec
            name = Path(spec).parent.name if Path(spec).name == "predictions.jsonl" else Path(spec).stem
        if not name or not path:
            raise SystemExit(f"error: --predictions {spec!r}: expected NAME=PATH or PATH")
        if name in systems:
            raise SystemExit(f"error: two prediction files are named {name!r}; name them with NAME=PATH")
        systems[name] = Path(path)
    return systems


def run_human_export(args: argparse.Namespace) -> int:
    """``empatheia human export``: rating sheets for sampled dialogues."""
    from ..data.readers import read_dataset
    from ..errors import DataError
    from .human import export_kit

    systems = _predictions_specs(args.predictions or [])
    try:
        corpus = read_dataset(args.data, format=args.format, media_root=args.media_root, labels=load_labels(args.labels))
        result = export_kit(
            corpus.dialogues, systems, args.out, n=args.n, annotators=args.annotators, seed=args.seed,
            criteria=args.criteria, include_gold=args.include_gold, overwrite=args.overwrite,
        )
    except (DataError, ValueError, FileExistsError) as error:
        raise SystemExit(f"error: {error}")
    progress(f"{result.items} item(s) ({result.dialogues} dialogues x {len(systems) + args.include_gold} system(s)) "
              f"for {len(result.sheets)} annotator(s), criteria {result.criteria}")
    print(json.dumps({"key": str(result.key), "sheets": [str(s) for s in result.sheets], "instructions": str(result.instructions)}))
    return 0


def _sheet_paths(specs: List[Path]) -> List[Path]:
    paths: List[Path] = []
    for spec in specs:
        if spec.is_dir():
            found = sorted(spec.glob("*.csv"))
            if not found:
                raise SystemExit(f"error: {spec} holds no .csv sheet")
            paths.extend(found)
        else:
            paths.append(spec)
    return paths


def run_human_aggregate(args: argparse.Namespace) -> int:
    """``empatheia human aggregate``: means and agreement of filled sheets."""
    from .human import KEY_NAME, SheetError, aggregate, render_results_markdown, write_results

    sheets = _sheet_paths(args.sheets)
    key = args.key
    if key is None:
        # The export's layout: KIT/key.csv beside KIT/sheets/.
        key = sheets[0].resolve().parent.parent / KEY_NAME
        if not key.is_file():
            raise SystemExit(f"error: no key found at {key}; give --key KIT/key.csv")
    try:
        results = aggregate(sheets, key)
    except (SheetError, ValueError) as error:
        raise SystemExit(f"error: {error}")
    json_path, md_path = write_results(results, args.out)
    print(render_results_markdown(results))
    progress(f"wrote {json_path} and {md_path}")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    """``empatheia compare``: each system run as ``eval --system S --out DIR/S`` does, then
    the comparison files."""
    from ..io import FolderLockedError, folder_lock
    from .compare import SystemRunError, check_systems, compare_systems
    from .report import write_report

    try:
        systems = check_systems(args.systems)
    except ValueError as error:
        raise SystemExit(f"error: --systems: {error}")
    check_run_arguments(args)
    scoring = score_options(args)
    fine_labels = load_labels(args.fine_labels)

    def run_system(entry, folder: Path):
        progress(f"{entry.label}: into {folder}")
        source = {"checkpoint": entry.checkpoint, "preset": None} if entry.checkpoint is not None else {}
        run_args = argparse.Namespace(**{**vars(args), **source, "system": entry.system, "out": folder})
        with folder_lock(folder):
            metrics, summary = evaluate_system(run_args, scoring)
            write_report(metrics, folder)
        progress(f"{entry.label}: {summary.selected} example(s), {summary.resumed} predicted by an earlier run, "
                 f"{summary.generated} now")
        return metrics, summary

    settings = {
        "data": str(args.data),
        "model": f"checkpoint:{args.checkpoint}" if args.checkpoint else f"preset:{args.preset}",
        "limit": args.limit, "batch_size": args.batch_size or 8, "max_new_tokens": args.max_new_tokens,
        "speak": bool(args.speak or args.animate), "animate": bool(args.animate), "multimodal": bool(args.multimodal),
        "labels": str(args.labels) if args.labels else None, "device": args.device, "dtype": args.dtype,
        # As given: each system's run.json and metrics.json hold it with the config's defaults filled in.
        "decoding": decoding_from_args(args).record(),
    }
    try:
        with folder_lock(args.out):
            _, written = compare_systems(systems, run_system, args.out, settings, fine_labels,
                                         str(args.fine_labels) if args.fine_labels else None, scoring.unknown_gold)
    except (SystemRunError, FolderLockedError) as error:
        raise SystemExit(f"error: {error}")
    print(json.dumps({"systems": [entry.label for entry in systems], **{name: str(path) for name, path in written.items()}}))
    return 0


def _run_arguments(group, source_required: bool) -> None:
    """The options of answering a dataset with a model (``eval``, ``compare``)."""
    from ..data.readers import FORMATS

    source = group.add_mutually_exclusive_group(required=source_required)
    source.add_argument("--checkpoint", type=Path, help="a directory written by save_pretrained")
    source.add_argument("--preset", help="build a preset instead (tiny: random weights, for trying things)")
    add_set_argument(group, "override a key of the model's config by its dotted name, e.g. language_model.pretrained=/models/vicuna")
    group.add_argument("--data", type=Path, help="the dataset to answer (AvaMERG JSON, EmpatheticDialogues or avatar JSONL)")
    group.add_argument("--format", default="auto", choices=["auto", *FORMATS])
    group.add_argument("--media-root", type=Path, help="folder of the media files")
    group.add_argument("--batch-size", type=int, default=None, help="dialogues per respond call (default 8)")
    group.add_argument("--limit", type=int, help="answer only the first N examples")
    group.add_argument("--max-new-tokens", type=int, default=None)
    group.add_argument("--device", default=None, help="e.g. cuda, cuda:1 (default: CPU)")
    group.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    group.add_argument("--speak", action="store_true",
                       help="also speak each response: DIR/media/<id>.wav, named by its prediction's 'audio'")
    group.add_argument("--animate", action="store_true",
                       help="also speak and animate each response: DIR/media/<id>.wav and .mp4 ('audio', 'video', 'avatar')")
    group.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_decoding_arguments(group)


def _scoring_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--labels", type=Path,
                   help="YAML with emotions, profile and emotion_fold: the classes to score in (default: with "
                        "--checkpoint/--preset the model's own, fold included; scoring files, AvaMERG's)")
    p.add_argument("--similarity", action="store_true",
                   help="also the BERTScore-style similarity to the gold responses (loads a small encoder)")
    p.add_argument("--polarity", action="store_true",
                   help="also the emotion/sentiment/empathy polarity (references need 'history')")
    p.add_argument("--multimodal", action="store_true",
                   help="also score the predictions' 'audio'/'video' files (relative to the predictions file's folder): "
                        "speech (Whisper tiny.en WER/CER against the response text, duration, loudness), video (CPBD, "
                        "lip sync, FER facial-emotion accuracy against the gold emotion, identity consistency per "
                        "'avatar', SSIM against the references' 'video' clips), requested-vs-realised style agreement "
                        "and text-video/text-speech consistency; loads Whisper, FER and MobileNetV2 (slower)")
    p.add_argument("--skip-unknown-gold", action="store_true",
                   help="leave out references whose gold emotion the label sets do not know, counted in "
                        "skipped_unknown_gold (default: an error naming the file, record and field)")


def add_eval_parsers(subparsers: "argparse._SubParsersAction") -> None:
    """Add ``eval``, ``compare`` and ``human`` (``export``, ``aggregate``) to a parser's
    subcommands; each sets ``run``."""
    from ..data.readers import FORMATS

    p = subparsers.add_parser(
        "eval",
        help="score predictions, or run a model over a dataset and score it (metrics.json, report)",
        description="Score --predictions against --references, or answer --data with --checkpoint/--preset "
        "(resumable; --speak/--animate also render each response into --out/media) and score that. "
        "--multimodal also scores the speech and video. Writes metrics.json, report.md, report.html and SVG plots "
        "into --out.",
    )
    files = p.add_argument_group("scoring files")
    files.add_argument("--predictions", type=Path, help="predictions JSONL: id, text, emotion per line")
    files.add_argument("--references", type=Path,
                       help="references JSONL: id, response, emotion (age, gender, video) per line")
    files.add_argument("--allow-missing", action="store_true",
                       help="score the ids in both files and list the others (default: an error)")
    model = p.add_argument_group("running a model")
    _run_arguments(model, source_required=False)
    system_arguments(model)
    _scoring_arguments(p)
    p.add_argument("--out", type=Path, required=True, help="output folder (rerun with the same one to resume)")
    p.set_defaults(run=run_eval)

    from ..variants import SYSTEMS

    p = subparsers.add_parser(
        "compare",
        help="run several systems over one dataset as eval does, and compare them (comparison.json/.md/.html)",
        description="Run each of --systems in turn over --data exactly as 'empatheia eval --system S' does, into "
        "--out/<system>/ (resumable), then write --out/comparison.json, comparison.md and comparison.html: one row "
        "per system, one bar chart per metric.",
    )
    model = p.add_argument_group("running the systems")
    _run_arguments(model, source_required=True)
    model.add_argument("--systems", nargs="+", default=list(SYSTEMS[:3]), metavar="SYSTEM[:TAG][=DIR]",
                       help=f"the systems to compare, in this order, each one of {', '.join(SYSTEMS)}; SYSTEM:TAG "
                            "names another row of a system (an ablation) and =DIR gives a row its own checkpoint "
                            "(meria=runs/meria_response meria:wo_pdr=runs/meria_wo_pdr); default: "
                            f"{', '.join(SYSTEMS[:3])}")
    model.add_argument("--styles", type=Path, metavar="TABLE.json",
                       help="pipeline / e3rg: the emotion -> style table (default: the preset's, or measured on the generators)")
    model.add_argument("--memory", type=Path, metavar="DIR",
                       help="e3rg: folder of its memory (default: --out/e3rg/e3rg_memory, kept for resuming)")
    _scoring_arguments(p)
    p.add_argument("--fine-labels", type=Path, metavar="YAML",
                   help="label sets the chain's emotion is also scored under, e.g. configs/labels/ed32.yaml (default: "
                        "the labels the references name, compared as written: ED's 32 on EmpatheticDialogues)")
    p.add_argument("--out", type=Path, required=True, help="output folder: one folder per system (rerun to resume)")
    p.set_defaults(run=run_compare)

    human = subparsers.add_parser("human", help="human evaluation: export rating sheets, aggregate filled ones").add_subparsers(
        dest="human_command", required=True
    )
    p = human.add_parser("export", help="rating sheets for N sampled dialogues (blind, one CSV per annotator)")
    p.add_argument("--data", type=Path, required=True, help="the dataset the predictions answer (gives the dialogues)")
    p.add_argument("--format", default="auto", choices=["auto", *FORMATS])
    p.add_argument("--media-root", type=Path, help="folder of the media files")
    p.add_argument("--labels", type=Path, help="YAML label sets of the dataset (default: AvaMERG's)")
    p.add_argument("--predictions", action="append", metavar="[NAME=]PATH",
                   help="a system's predictions JSONL (repeatable; NAME defaults to the file or folder name)")
    p.add_argument("--include-gold", action="store_true", help="also rate the dataset's gold responses (system 'gold')")
    p.add_argument("--n", type=int, default=200, help="dialogues to sample (default 200, as in the paper)")
    p.add_argument("--annotators", default="3", help="a number (A1..AN) or comma-separated names (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--criteria", default="auto", choices=["auto", "text", "multimodal", "all"],
                   help="text: Empathy, Coherence, Informativity, Fluency; multimodal: the six MERG criteria; "
                        "auto: all when every response has media, else text")
    p.add_argument("--out", type=Path, required=True, help="kit folder: key.csv, sheets/, instructions.md")
    p.add_argument("--overwrite", action="store_true", help="replace a kit already in --out")
    p.set_defaults(run=run_human_export)

    p = human.add_parser("aggregate", help="per-criterion means per system and inter-annotator agreement")
    p.add_argument("sheets", type=Path, nargs="+", metavar="SHEET", help="filled sheets, or folders of them")
    p.add_argument("--key", type=Path, help="the kit's key.csv (default: beside the sheets' folder)")
    p.add_argument("--out", type=Path, required=True, help="folder for human_scores.json and human_scores.md")
    p.set_defaults(run=run_human_aggregate)
