"""Run a benchmark protocol on your own data in its native format (here DO-Bench's JSON
Lines schema, evaluators/benchmarks/dobench/schema.md), through the vlm-eval CLI.

    python examples/user_data.py                  # writes a small dataset to a temp folder, evaluates the organism
    python examples/user_data.py --model <hf id or path> --data my_dobench.jsonl

Without ``--data`` it first writes a stand-in for "your data": images saved to disk and
one JSON line per instance, exactly what a user with their own photos would prepare.
"""

import argparse
import json
import tempfile
from pathlib import Path

from evaluators.cli import main as vlm_eval
from evaluators.organism.tasks import do_prior, existence_question
from evaluators.world import BIASED, World, do_views

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="organism")
parser.add_argument("--data", default=None, help="a DO-Bench JSON Lines file (default: write a small one)")
parser.add_argument("--output_path", default=None)
args = parser.parse_args()

folder = Path(tempfile.mkdtemp(prefix="user_data_"))
data = args.data
if data is None:
    world, rows, seed = World(BIASED), [], 10**9
    while len({r["scene_id"] for r in rows}) < 3:
        seed += 1
        scene = world.scene(seed)
        objs = [o for o in scene.objects if scene.count(o.category) == 1]
        if not objs:
            continue
        target = objs[0]
        views = do_views(scene, target.uid, 0.1)
        for view, image in views.as_dict().items():
            image.save(folder / f"{seed}_{view}.png")
        for level in range(4):
            rows.append({"id": f"{seed}-A{level}", "scene_id": seed, "image": f"{seed}_Full.png", "series": "A",
                         "level": level, "view": "Full", "object": target.category, "answer": "yes",
                         "question": existence_question(target.category, do_prior(level, target.category, True))})
        for view in ("Cluster", "Crop"):
            rows.append({"id": f"{seed}-{view}", "scene_id": seed, "image": f"{seed}_{view}.png", "series": "A",
                         "level": 0, "view": view, "object": target.category, "answer": "yes", "margin": 0.1,
                         "question": existence_question(target.category)})
    data = folder / "dobench.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} instances to {data}")

vlm_eval(["--model", args.model, "--tasks", "", "--data", f"dobench={data}", "--no_progress",
          "--output_path", args.output_path or str(folder / "run")])
