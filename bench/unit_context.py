"""How much a speech unit's loudness (C^v column 0, what opens the mouth) depends on its
neighbours, and what the Content Synchronizer's unit context does with it.

Reads the response states a content refit collected (``small_preset`` step 7 keeps them
at ``<out>/content_refit/response_states.safetensors``) and holds out every tenth
example. Prints, on the held-out units:

* the Pearson r and squared error of a lookup of the mean loudness by the unit's own id,
  and by the id with both neighbours' ids (tables from the other nine tenths): what the
  units alone tell;
* with ``--weights``, each model's Content Synchronizer on those units (trained on all of
  the states if the weights come from that refit, so an upper reading);
* with ``--refit-steps N``, the Content Synchronizer of ``--start`` refit for N steps on
  the other nine tenths as step 7 does, once without and once with the unit context:
  what the context adds at equal training.

    python bench/unit_context.py runs/small/content_refit/response_states.safetensors \\
        [--weights runs/small/content_refit/final ...] [--refit-steps 300 --start shipped]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("states", type=Path, help="a content refit's response_states.safetensors")
    parser.add_argument("--weights", type=Path, nargs="*", default=[], help="saved models to score on the held-out units")
    parser.add_argument("--refit-steps", type=int, default=0, help="refit without and with the unit context for this many steps")
    parser.add_argument("--start", default="shipped", help="the model the refits start from: shipped or a saved folder")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from empatheia import Empatheia
    from empatheia.training.content_refit import ResponseStates, add_unit_context, refit_content_synchronizer

    states = ResponseStates.load(args.states)
    held = torch.arange(len(states)) % 10 == 0
    train, test = subset(states, ~held), subset(states, held)
    print(f"{len(states)} examples: {int((~held).sum())} to fit, {int(held.sum())} held out")

    def units_of(part: ResponseStates):
        mask = part.targets["video_content_mask"]
        ids = part.targets["speech_units"].long()
        # Neighbours within the same answer; -1 past either end.
        before = torch.nn.functional.pad(ids, (1, 0), value=-1)[:, :-1]
        after = torch.nn.functional.pad(ids.masked_fill(~mask, -1), (0, 1), value=-1)[:, 1:]
        loud = part.targets["video_content_target"][..., 0]
        return ids[mask].numpy(), before[mask].numpy(), after[mask].numpy(), loud[mask].numpy()

    fit, check = units_of(train), units_of(test)
    print(f"{'held-out units: loudness':42s} {'r':>6s} {'sq. error':>10s}")
    for name, key in (("lookup by the unit's id", lambda u: u[0]),
                      ("lookup by the id and both neighbours'", lambda u: (u[1] + 1) * 65536 + u[0] * 256 + (u[2] + 1))):
        table = mean_by_key(key(fit), fit[3])
        guess = np.array([table.get(k, float(fit[3].mean())) for k in key(check)])
        report(name, guess, check[3])

    for folder in args.weights:
        report(f"Content Synchronizer of {folder.name}", predict(Empatheia.from_pretrained(folder), test), check[3])
    for context in (False, True) if args.refit_steps else ():
        model = Empatheia.from_preset("small") if args.start == "shipped" else Empatheia.from_pretrained(args.start)
        head = model.content_synchronizer
        if context:
            add_unit_context(model)
        elif head.unit_context is not None:
            head.unit_context = None
            head.config.unit_context = 0
        torch.manual_seed(0)
        refit_content_synchronizer(model, train, args.refit_steps, progress=False)
        report(f"refit {args.refit_steps} steps, unit context {'on' if context else 'off'}", predict(model, test), check[3])
    return 0


def subset(states, index):
    from empatheia.training.content_refit import ResponseStates

    return ResponseStates(states.hidden[index], states.mask[index], {k: v[index] for k, v in states.targets.items()})


def mean_by_key(keys, values) -> dict:
    import numpy as np

    order = np.unique(keys, return_inverse=True)
    sums = np.bincount(order[1], weights=values)
    counts = np.bincount(order[1])
    return dict(zip(order[0].tolist(), (sums / counts).tolist()))


def predict(model, part):
    """The Content Synchronizer's loudness column on ``part``'s units, in order."""
    import torch

    head = model.content_synchronizer.eval()
    out = []
    with torch.no_grad():
        for start in range(0, len(part), 32):
            batch = part.batch(torch.arange(start, min(len(part), start + 32)))
            content = head(batch["hidden"], batch["response_mask"], batch["speech_content_mask"].sum(1),
                           batch.get("speech_units"))
            out.append(content.video[batch["video_content_mask"]][:, 0].float())
    return torch.cat(out).numpy()


def report(name: str, guess, truth) -> None:
    import numpy as np

    print(f"{name:42s} {np.corrcoef(guess, truth)[0, 1]:6.3f} {np.mean((guess - truth) ** 2):10.4f}")


if __name__ == "__main__":
    sys.exit(main())
