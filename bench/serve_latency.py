"""Warm per-turn latency of ``empatheia serve``, measured through its HTTP API.

    python bench/serve_latency.py --preset small

Starts ``python -m empatheia serve`` on a free loopback port, waits until it has loaded the
model and answered its warm-up turn, then times, as a client sees it (request sent to
last byte received):

1. ``text``: ``--turns`` turns one after another in one session, text only;
2. ``speech_video``: ``--turns`` more, answered with voice and talking head and streamed,
   with the seconds until the text, the voice and the face arrive;
3. ``concurrent``: ``--sessions`` sessions at once, each ``--session-turns`` turns with
   voice and face (a turn's time includes its wait for the model, which answers one turn
   at a time).

The user's lines are the speakers' utterances of examples/dialogues.json, in order. Prints
one JSON object: per condition the median, min and max seconds per turn, and the machine's
load average (1 min) before and after, since the numbers are only as good as the CPU was
free.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def user_lines() -> list:
    dialogues = json.loads((REPO / "examples" / "dialogues.json").read_text())
    return [turn["utterance"] for d in dialogues for t in d["turns"] for turn in t["dialogue_history"]
            if turn["role"] == "speaker"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Client:
    def __init__(self, url: str):
        self.url = url

    def post(self, path: str, fields: dict, timeout: float = 900):
        data = urllib.parse.urlencode(fields).encode()
        return urllib.request.urlopen(urllib.request.Request(self.url + path, data=data, method="POST"), timeout=timeout)

    def session(self) -> str:
        with self.post("/api/sessions", {}) as reply:
            return json.load(reply)["session_id"]

    def turn(self, session: str, text: str, media: bool) -> dict:
        """Seconds from sending the turn to each streamed stage's line."""
        fields = {"session_id": session, "text": text, "speak": str(media).lower(), "animate": str(media).lower()}
        start, times = time.perf_counter(), {}
        with self.post("/api/turns?stream=true", fields) as reply:
            for line in reply:
                times[json.loads(line)["stage"]] = time.perf_counter() - start
        return times


def summary(values: list) -> dict:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2), "n": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--turns", type=int, default=5, help="turns timed alone, for each of text and speech+video")
    parser.add_argument("--sessions", type=int, default=4, help="concurrent sessions")
    parser.add_argument("--session-turns", type=int, default=2, help="turns of each concurrent session")
    args = parser.parse_args()

    port = free_port()
    load_before = os.getloadavg()[0]
    server = subprocess.Popen([sys.executable, "-m", "empatheia", "serve", "--preset", args.preset, "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    client, lines = Client(f"http://127.0.0.1:{port}"), user_lines()
    try:
        started = time.perf_counter()
        while True:
            try:
                urllib.request.urlopen(client.url + "/api/health", timeout=5).close()
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit(f"the server stopped: {server.stderr.read()}")
                time.sleep(1)
        ready = time.perf_counter() - started

        session = client.session()
        text = [client.turn(session, lines[i % len(lines)], media=False)["done"] for i in range(args.turns)]
        session = client.session()
        media = [client.turn(session, lines[i % len(lines)], media=True) for i in range(args.turns)]

        def one_session(index: int) -> list:
            own = client.session()
            return [client.turn(own, lines[(index + i) % len(lines)], media=True)["done"] for i in range(args.session_turns)]

        wall = time.perf_counter()
        with ThreadPoolExecutor(args.sessions) as pool:
            concurrent = [t for times in pool.map(one_session, range(args.sessions)) for t in times]
        wall = time.perf_counter() - wall
    finally:
        server.terminate()
        server.wait(60)
    result = {
        "preset": args.preset,
        "cpus": os.cpu_count(),
        "torch_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "server_ready_s": round(ready, 1),
        "text": summary(text),
        "speech_video": {stage: summary([m[stage] for m in media]) for stage in ("text", "speech", "video", "done")},
        "concurrent": {"sessions": args.sessions, "turn": summary(concurrent),
                       "turns_per_minute": round(60 * len(concurrent) / wall, 2)},
        "load_average_1min": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
