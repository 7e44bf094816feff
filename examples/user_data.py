"""Run a benchmark protocol on your own data in its native format (here DO-Bench's JSON
Lines schema, evaluators/benchmarks/dobench/schema.md), through the vlm-eval CLI.

    python examples/user_data.py                  # writes a small dataset to a temp folder, evaluates the organism
    python examples/user_data.py --output_path runs/user_data    # keeps the dataset and the run there
    python examples/user_data.py --model <hf id or path> --data my_dobench.jsonl

Without ``--data`` it first writes a stand-in for "your data": images saved to disk and
one JSON line per instance, exactly what a user with their own photos would prepare.
Without ``--output_path`` everything goes to a temporary folder that is deleted at the end
(the scores are printed); with it, the run is written there and the stand-in data to its
``data/`` folder, and both are kept.
"""

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

from evaluators.benchmarks.dobench.suite import scene_groups
from evaluators.cli import main as vlm_eval
from evaluators.organism.tasks import do_prior, existence_question
from evaluators.world import BIASED, World, do_views

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="organism")
parser.add_argument("--data", default=None, help="a DO-Bench JSON Lines file (default: write a small one)")
parser.add_argument("--output_path", default=None,
                    help="keep the run (and the stand-in data, in its data/ folder) here; default: a temporary "
                         "folder, deleted at the end")
args = parser.parse_args()


def write_stand_in(folder: Path) -> Path:
    """A small DO-Bench dataset in ``folder``: the images and ``dobench.jsonl``, all ten
    instances of each of three scene groups (A0-A3 and B0-B3 in the Full view, A0 in the
    Cluster and Crop views; PriorRobust needs both series)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for _, (seed, group) in zip(range(3), scene_groups(12345, World(BIASED))):
        views = do_views(group.base, group.a_uid, 0.1)
        for view, image in views.as_dict().items():
            image.save(folder / f"{seed}_{view}.png")
        group.absent.render().save(folder / f"{seed}_absent.png")  # the scene without its B-object
        for level in range(4):
            for series, cat, image, answer in (("A", group.a_category, f"{seed}_Full.png", "yes"),
                                               ("B", group.b_category, f"{seed}_absent.png", "no")):
                rows.append({"id": f"{seed}-{series}{level}", "scene_id": seed, "image": image, "series": series,
                             "level": level, "view": "Full", "object": cat, "answer": answer,
                             "question": existence_question(cat, do_prior(level, cat, series == "A"))})
        for view in ("Cluster", "Crop"):
            rows.append({"id": f"{seed}-{view}", "scene_id": seed, "image": f"{seed}_{view}.png", "series": "A",
                         "level": 0, "view": view, "object": group.a_category, "answer": "yes", "margin": 0.1,
                         "question": existence_question(group.a_category)})
    data = folder / "dobench.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} instances to {data}")
    return data


kept = args.output_path is not None
with (contextlib.nullcontext(args.output_path) if kept else tempfile.TemporaryDirectory(prefix="user_data_")) as out:
    out = Path(out)
    data = args.data if args.data is not None else write_stand_in(out / "data")
    status = vlm_eval(["--model", args.model, "--tasks", "", "--data", f"dobench={data}", "--no_progress",
                       "--output_path", str(out if kept else out / "run")])
    if kept:
        print(f"the run is in {out}")
sys.exit(status)
