"""Warm per-call latency of ``Empatheia.respond`` in one process, without a server.

    python bench/respond_latency.py --preset small

Loads the model, answers one warm-up call, then times ``--calls`` calls of one example
dialogue each (examples/dialogues.json, in turn): text only, then with
``speak=True, animate=True``. Prints one JSON object with the median, min and max seconds
of each, to set beside ``bench/serve_latency.py``'s turns.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--calls", type=int, default=5, help="timed calls of each kind")
    args = parser.parse_args(argv)

    from empatheia import Empatheia
    from empatheia.data import read_dataset

    model = Empatheia.from_preset(args.preset)
    dialogues = read_dataset(REPO / "examples" / "dialogues.json", labels=model.label_sets()).dialogues
    model.respond(dialogues[:1], speak=True, animate=True)

    def timed(**media) -> dict:
        seconds = []
        for i in range(args.calls):
            start = time.perf_counter()
            model.respond([dialogues[i % len(dialogues)]], **media)
            seconds.append(time.perf_counter() - start)
        return {"median": round(statistics.median(seconds), 2), "min": round(min(seconds), 2),
                "max": round(max(seconds), 2), "n": len(seconds)}

    print(json.dumps({"preset": args.preset, "text": timed(), "speech_video": timed(speak=True, animate=True)}, indent=2))


if __name__ == "__main__":
    main()
