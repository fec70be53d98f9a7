"""The model's per-phoneme mouth content against that of the speech it drives.

The first ``--limit`` dialogues of a file are answered and spoken (no video); for each
answer, C^v's loudness column (one row per phoneme the voice reads) is compared with the
per-phoneme means of the same column measured on the generated speech itself
(``AvatarRenderer.unit_content``, the gold a perfect model would give):

* Pearson r per answer, row for row and with the rows shifted by one phoneme either way;
* the 95th percentile over the speaking frames (each phoneme's row spread over the
  frames it sounds in) of each, which ``empatheia.generators.avatar_renderer.UNIT_LOUDNESS_ANCHOR``
  caps.

    python bench/unit_loudness.py runs/small/ed/eval.jsonl [--limit 24] [--preset small]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="dialogues in any format empatheia reads")
    parser.add_argument("--limit", type=int, default=24)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from empatheia import Empatheia
    from empatheia.data import read_dataset
    from empatheia.generators.base import expand_units

    model = Empatheia.from_preset(args.preset)
    dialogues = read_dataset(args.data, labels=model.label_sets()).dialogues[: args.limit]
    renderer = model.generators()[1]
    rows = []
    for start in range(0, len(dialogues), args.batch_size):
        for response in model.respond(dialogues[start : start + args.batch_size], speak=True):
            speech, predicted = response.audio, response.video_content.float()
            gold = renderer.unit_content(speech, predicted.shape[0])
            frames = renderer.frame_count(speech)
            zero = torch.zeros(predicted.shape[1])
            spread_model, labels = expand_units(predicted, speech, frames, renderer.fps, zero)
            spread_gold, _ = expand_units(gold, speech, frames, renderer.fps, zero)
            speaking = (labels >= 0).numpy()
            p, g = predicted[:, 0].numpy(), gold[:, 0].numpy()
            rows.append((
                np.corrcoef(p, g)[0, 1],
                np.corrcoef(p[1:], g[:-1])[0, 1],
                np.corrcoef(p[:-1], g[1:])[0, 1],
                np.percentile(spread_model[speaking, 0].numpy(), 95),
                np.percentile(spread_gold[speaking, 0].numpy(), 95),
            ))
    table = np.array(rows)
    mean, spread = table.mean(0), table.std(0)
    print(f"{len(rows)} answers")
    print(f"per-phoneme loudness, model's row i vs the speech's row i: r {mean[0]:.2f} "
          f"(row i + 1 vs i: {mean[1]:.2f}, row i vs i + 1: {mean[2]:.2f})")
    print(f"95th percentile over speaking frames: model {mean[3]:.3f} (s.d. {spread[3]:.3f}), "
          f"speech {mean[4]:.3f} (s.d. {spread[4]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
