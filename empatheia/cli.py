"""Command line: ``empatheia respond CONVERSATION.json --out DIR``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import List, Optional


def _progress(message: str) -> None:
    print(f"[empatheia] {message}", file=sys.stderr, flush=True)


def _load_conversation(path: Path, conversation_id: Optional[str]) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"error: {path} not found")
    except json.JSONDecodeError as error:
        raise SystemExit(f"error: {path}: not valid JSON ({error})")
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(c, dict) for c in data):
        raise SystemExit(f"error: {path}: expected a conversation object or a list of them")
    if conversation_id is not None:
        matches = [c for c in data if str(c.get("conversation_id")) == conversation_id]
        if not matches:
            raise SystemExit(f"error: {path}: no conversation with conversation_id {conversation_id!r}")
        return matches[0]
    if len(data) != 1:
        ids = [c.get("conversation_id") for c in data[:5]]
        raise SystemExit(
            f"error: {path} holds {len(data)} conversations (first ids {ids}); choose one with --conversation ID"
        )
    return data[0]


def respond(args: argparse.Namespace) -> int:
    import torch

    from .dialogue import Dialogue
    from .modeling import Empatheia

    conversation = _load_conversation(args.conversation_file, args.conversation)
    try:
        dialogue = Dialogue.from_avamerg(conversation, turn=args.turn, media_root=args.media_root)
    except (KeyError, ValueError, IndexError, FileNotFoundError) as error:
        raise SystemExit(f"error: {args.conversation_file}: {error}")
    start = time.perf_counter()
    dtype = getattr(torch, args.dtype) if args.dtype else None
    if args.checkpoint is not None:
        _progress(f"loading model from {args.checkpoint}")
        model = Empatheia.from_pretrained(args.checkpoint, dtype=dtype)
    else:
        _progress(f"building the {args.preset} preset")
        model = Empatheia.from_preset(args.preset, dtype=dtype)
    if args.device:
        model.to(args.device)
    _progress(f"model ready in {time.perf_counter() - start:.1f}s; responding to dialogue {dialogue.id}")
    response = model.respond(dialogue, max_new_tokens=args.max_new_tokens)
    out = response.save(args.out)
    _progress(f"wrote {out / 'response.json'} in {time.perf_counter() - start:.1f}s")
    print(json.dumps({"text": response.text, "emotion": response.emotion.label}, ensure_ascii=False))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="empatheia", description="Multimodal empathetic response generation.")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("respond", help="answer one turn of an AvaMERG-format conversation")
    p.add_argument("conversation_file", type=Path, metavar="CONVERSATION.json")
    p.add_argument("--conversation", help="conversation_id to pick when the file holds several")
    p.add_argument("--turn", type=int, default=-1, help="index into the conversation's turns (default: last)")
    p.add_argument("--media-root", type=Path, help="folder of dia{id}utt{index}_{avatar}.wav/.mp4 files")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--preset", choices=["tiny", "paper"], default="tiny")
    source.add_argument("--checkpoint", type=Path, help="a directory written by save_pretrained")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--device", default=None, help="e.g. cuda, cuda:1 (default: CPU)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    p.add_argument("--out", type=Path, required=True, help="directory for response.json")
    p.set_defaults(run=respond)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
