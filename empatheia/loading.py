"""What the command lines share: loading the model and the label sets they are given,
and reporting progress on standard error (standard output carries the results)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, TextIO

from .config_loader import ConfigError, parse_sets

if TYPE_CHECKING:
    from .labels import LabelSets
    from .modeling import Empatheia


def progress(message: str) -> None:
    print(f"[empatheia] {message}", file=sys.stderr, flush=True)


class WritingProgress:
    """The progress line while a model writes an answer: pass it as ``respond``'s
    ``progress``. On a terminal it is one line on standard error, rewritten with each
    token; elsewhere (a log, a pipe) a line every ``every`` seconds, so a slow answer is
    never silent and a fast one adds nothing. :meth:`done` ends the line."""

    def __init__(self, what: str = "writing the answer", stream: Optional[TextIO] = None, every: float = 5.0):
        self.what, self.stream, self.every = what, stream if stream is not None else sys.stderr, every
        self.start = self.shown = time.perf_counter()
        self.tokens = 0
        self.live = self.stream.isatty()

    def __call__(self, tokens: int) -> None:
        self.tokens = tokens
        now = time.perf_counter()
        if self.live:
            self.stream.write(f"\r[empatheia] {self.what}: {tokens} tokens, {now - self.start:.1f}s")
            self.stream.flush()
        elif now - self.shown >= self.every:
            self.shown = now
            self.stream.write(f"[empatheia] {self.what}: {tokens} tokens after {now - self.start:.0f}s\n")
            self.stream.flush()

    def done(self) -> None:
        if self.live and self.tokens:
            self.stream.write("\n")
            self.stream.flush()
        self.tokens = 0  # ended: a second call writes nothing


def model_overrides(args: argparse.Namespace) -> Dict[str, Any]:
    """The model config keys given with ``--set``; a malformed item is a clean error."""
    try:
        return parse_sets(args.set)
    except ConfigError as error:
        raise SystemExit(f"error: {error}")


def check_device(device: Optional[str]) -> None:
    """``--device`` must name a device this machine has: checked before the model is
    built, so a missing GPU is one line at once, not a CUDA traceback after the loading."""
    if device is None:
        return
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        raise SystemExit(f"error: --device {device!r}: {error}")
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise SystemExit(f"error: --device {device}: no CUDA GPU is available here (leave --device out to run on the CPU)")
        if parsed.index is not None and parsed.index >= count:
            raise SystemExit(f"error: --device {device}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise SystemExit(f"error: --device {device}: Apple's MPS is not available here")


def load_errors() -> tuple:
    """What building a model from damaged or mismatched files raises: a missing or
    unreadable file (OSError), a truncated safetensors file, a truncated pickle, tensors
    whose shapes do not match the config (RuntimeError), a bad config (ValueError, KeyError)."""
    import pickle

    from safetensors import SafetensorError

    return (OSError, ValueError, KeyError, EOFError, RuntimeError, SafetensorError, pickle.UnpicklingError)


def load_model(args: argparse.Namespace) -> "Empatheia":
    """The model of ``--checkpoint`` or ``--preset`` with ``--set``'s keys, in ``--dtype``
    on ``--device``; a model that cannot be built is a clean error, not a traceback."""
    import torch

    from .modeling import Empatheia

    check_device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    overrides = model_overrides(args)
    try:
        if args.checkpoint is not None:
            progress(f"loading model from {args.checkpoint}")
            model = Empatheia.from_pretrained(args.checkpoint, overrides, dtype=dtype)
        else:
            progress(f"building the {args.preset} preset")
            model = Empatheia.from_preset(args.preset, overrides, dtype=dtype)
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"error: {error}")
    except load_errors() as error:
        source = f"checkpoint {args.checkpoint}" if args.checkpoint is not None else f"preset {args.preset}"
        raise SystemExit(f"error: {source}: cannot load the model ({type(error).__name__}: {error})".replace("\n", " "))
    if args.device:
        model.to(args.device)
    return model


def load_system(args: argparse.Namespace):
    """The system of ``--system`` (default ``empatheia``: :func:`load_model`'s model), built
    from the same ``--preset``/``--checkpoint``, ``--set``, ``--dtype`` and ``--device``:
    ``pipeline`` (the paper's pipeline baseline), ``e3rg`` (training-free E3RG over the
    trained model), ``meria`` or ``early_fusion`` (their trained parts, from
    ``--checkpoint``), with ``--styles`` and ``--memory`` where given. See docs/variants.md."""
    name = getattr(args, "system", None) or "empatheia"
    if name == "empatheia":
        return load_model(args)
    check_device(args.device)
    import torch

    from .variants.build import build_e3rg, build_pipeline, build_trained_variant

    try:
        if name == "pipeline":
            progress(f"building the pipeline baseline ({args.checkpoint or args.preset})")
            return build_pipeline(
                preset=args.preset, checkpoint=args.checkpoint, overrides=model_overrides(args),
                dtype=getattr(torch, args.dtype) if args.dtype else None, styles=getattr(args, "styles", None),
                device=args.device, progress=progress,
            )
        if name == "e3rg":
            model = load_model(args)
            progress("building E3RG over it (emotion readers, bank, memory)")
            return build_e3rg(model, getattr(args, "styles", None), getattr(args, "memory", None), progress=progress)
        if name in ("meria", "early_fusion"):
            progress(f"building {name} ({args.checkpoint or args.preset})")
            return build_trained_variant(
                name, preset=args.preset, checkpoint=args.checkpoint, overrides=model_overrides(args),
                dtype=getattr(torch, args.dtype) if args.dtype else None, styles=getattr(args, "styles", None),
                device=args.device, progress=progress,
            )
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"error: {error}")
    except load_errors() as error:
        raise SystemExit(f"error: {name} from {args.checkpoint or args.preset}: cannot load ({type(error).__name__}: {error})".replace("\n", " "))
    raise SystemExit(f"error: unknown system {name!r}")


def system_arguments(p: argparse.ArgumentParser) -> None:
    """Which system of the field answers (docs/variants.md)."""
    from .variants import SYSTEMS

    p.add_argument("--system", choices=SYSTEMS, default="empatheia",
                   help="empatheia (default), pipeline (the paper's pipeline baseline), e3rg (training-free E3RG), "
                        "meria or early_fusion (their trained parts from --checkpoint)")
    p.add_argument("--styles", type=Path, metavar="TABLE.json",
                   help="the variants: the emotion -> style table (default: the preset's, or measured on the generators)")
    p.add_argument("--memory", type=Path, metavar="DIR",
                   help="e3rg: folder of its memory (avatars, users' earlier turns), kept across sessions "
                        "(default: this process only)")


def load_labels(path: Optional[Path]) -> Optional["LabelSets"]:
    """Label sets from a YAML file (``emotions``, ``profile``, ``emotion_fold``), or
    ``None`` without one (whoever reads the data then uses its default: AvaMERG's, or the
    model's); a bad file is a clean error."""
    from .labels import LabelSets

    if path is None:
        return None
    try:
        return LabelSets.from_yaml(path)
    except ValueError as error:
        raise SystemExit(f"error: {error}")
