"""Shared fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # `pytest -n N` (the README's command): N processes on N cores,
    import torch  # one torch thread each; two threads per worker would oversubscribe the cores

    torch.set_num_threads(1)


@pytest.fixture
def held_elsewhere():
    """Start a live process holding a folder's run lock (:mod:`evaluators.folder_lock`), as
    a run writing there does; returns it (``.pid``). Killed after the test if still alive."""
    import subprocess
    import sys

    from evaluators.folder_lock import AVAILABLE

    if not AVAILABLE:
        pytest.skip("no flock on this platform")
    started = []
    code = ("import sys; from evaluators.folder_lock import hold\n"
            "with hold(sys.argv[1]):\n    print('held', flush=True); sys.stdin.read()")

    def start(folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
        holder = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        started.append(holder)
        assert holder.stdout.readline().strip() == "held"
        return holder

    yield start
    for holder in started:
        holder.kill()
        holder.wait()


def save_tiny_organism(path: Path, seed: int = 0) -> Path:
    """A random-weight organism (the organism's tokenizer, processor and architecture,
    shrunk: 32 px images in 8 px patches, two small decoder layers) saved for ``--model``.

    Its answers are arbitrary but deterministic and differ from query to query, which is
    what checks of plumbing (sharding, merging, resuming, placement) need; loading and a
    generate() take well under a second.
    """
    import torch
    from transformers import LlavaForConditionalGeneration

    from evaluators.organism import build_model_config, build_processor, build_tokenizer, save_organism
    from evaluators.organism.tasks import vocabulary

    tokenizer = build_tokenizer(vocabulary())
    processor = build_processor(tokenizer, image_size=32, patch_size=8)
    config = build_model_config(
        len(tokenizer), image_size=32, patch_size=8,
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64),
        text_config=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=128),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config).eval()
    return save_organism(model, processor, path)


@pytest.fixture(scope="module")
def organism():
    """The shipped organism ``(model, processor)``, loaded once per test module (skipped
    where its checkpoint is missing)."""
    from evaluators.organism import ORGANISM_DIR, load_organism

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    model, processor = load_organism()
    # one forward: transformers installs its output-recording hooks at a model's first forward,
    # so a test comparing hook_state before and after would see them appear if it ran first
    # in its process (which test that is depends on pytest-xdist's scheduling)
    import torch
    from PIL import Image

    from hooks.prompting import user_prompt

    enc = processor(text=[user_prompt(processor, "is there a dog ?")], images=[Image.new("RGB", (64, 64))],
                    return_tensors="pt")
    with torch.no_grad():
        model(**enc)
    return model, processor


@pytest.fixture(scope="session")
def eval_model_path(tmp_path_factory) -> str:
    """The trained organism when its checkpoint is there, else a tiny random organism."""
    from evaluators.organism import ORGANISM_DIR

    if (ORGANISM_DIR / "config.json").exists():
        return str(ORGANISM_DIR)
    return str(save_tiny_organism(tmp_path_factory.mktemp("tiny_organism")))
