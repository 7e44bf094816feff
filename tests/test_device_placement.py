"""Large-model loading: dtype names, device_map, per-rank placement, and mitigations whose
tensors follow the activations onto whatever device a split model puts them.

On CPU the split itself cannot be exercised (one device); there, a source scan checks
that no mitigation or hook makes a tensor on a fixed device. With two GPUs a real split
(decoder layers over cuda:0 and cuda:1) must answer as the model on one GPU does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from evaluators.cli import parse_mitigations
from evaluators.distributed import Ranks, placement
from evaluators.model import HFModel, load_hf

ROOT = Path(__file__).resolve().parents[1]
MITIGATIONS = ("", "vcd:alpha=1", "prior_suppression:mode=both")


@pytest.fixture(scope="module")
def queries():
    from evaluators.benchmarks.dobench.suite import build
    from evaluators.benchmarks.mioh.suite import build as mioh

    return build(n_scenes=1, seed=3)[:4] + mioh(n_per_condition=1, seed=3)[:2]


def _answers(model, processor, queries) -> dict[str, list[str]]:
    return {m: HFModel(model, processor, mitigations=parse_mitigations(m, processor.tokenizer, processor),
                       max_new_tokens=4)(queries) for m in MITIGATIONS}


def test_dtype_names(eval_model_path):
    assert load_hf(eval_model_path, dtype="bf16")[0].dtype == torch.bfloat16
    assert load_hf(eval_model_path, dtype="fp16")[0].dtype == torch.float16
    assert load_hf(eval_model_path, dtype="fp32")[0].dtype == torch.float32
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_hf(eval_model_path, dtype="int3")
    with pytest.raises(ValueError, match="not both"):
        load_hf(eval_model_path, device="cpu", device_map="auto")
    with pytest.raises(ValueError, match="give device_map too"):
        load_hf(eval_model_path, max_memory={0: "1GiB"})


def test_device_map_auto_and_bf16_answer_with_every_mitigation(eval_model_path, queries):
    plain = _answers(*load_hf(eval_model_path), queries)
    assert _answers(*load_hf(eval_model_path, device_map="auto"), queries) == plain
    half = _answers(*load_hf(eval_model_path, device_map="auto", dtype="bf16"), queries)
    assert all(len(a) == len(queries) and all(isinstance(t, str) for t in a) for a in half.values())


def test_placement_leaves_one_process_and_cpu_runs_alone():
    asked = {"dtype": "bf16", "device_map": "auto"}
    assert placement(Ranks(), asked) == asked
    if not torch.cuda.is_available():
        assert placement(Ranks(1, 2, 1, 2), {}) == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_placement_gives_each_rank_its_own_gpu():
    n = torch.cuda.device_count()
    assert placement(Ranks(1, 2, 1, 2), {}) == {"device": f"cuda:{1 % n}"}
    if n >= 2:
        assert set(placement(Ranks(1, 2, 1, 2), {"device_map": "auto"})["max_memory"]) == set(range(n // 2, n))


# --- nothing on a fixed device -------------------------------------------------------------

FACTORIES = {"zeros", "ones", "full", "empty", "arange", "tensor", "as_tensor", "eye", "linspace",
             "rand", "randn", "randint", "randperm"}
HOST_SIDE = {  # (file, function): why a host tensor is right there
    ("mitigate/distortions.py", "sigmoid_betas"): "a scalar schedule read with float()",
    ("mitigate/distortions.py", "diffusion_noise"): "noise drawn on the CPU generator (same noise on any device), then .to(pixels.device)",
    ("mitigate/distortions.py", "patch_mask"): "mask drawn on the CPU generator, then .to(images.device)",
    ("mitigate/spans.py", "spans_to_mask"): "a per-row host mask copied into the device mask",
    ("mitigate/localize.py", "object_token_mask"): "host masks from decoded offsets, moved to the input's device",
    ("mitigate/vcd.py", "_distort"): "pixels hashed on the host to seed the distortion",
    ("mitigate/crop_verify_generate.py", "_fingerprint"): "pixels fingerprinted on the host",
    ("mitigate/crop_verify_generate.py", "_probe"): "a generate() call's pixels fingerprinted on the host",
    ("mitigate/localize.py", "region_heat"): "the heat canvas lives on the host, where best_window searches it",
    ("hooks/layout.py", "indices"): "geometry: small index tensors, moved to the maps' device where they index",
    ("hooks/layout.py", "_anyres"): "an empty shape probe for transformers' unpad_image (geometry only)",
    ("hooks/layout.py", "_patch_positions"): "geometry: the patch grid read off the processor's positions",
}


def _fixed_device_uses() -> list[str]:
    found = []
    files = [p for d in ("mitigate", "hooks") for p in sorted((ROOT / d).rglob("*.py")) if "testing" not in p.parts]
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text())
        parent = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}

        def function(node):
            while node in parent:
                node = parent[node]
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    return node.name
            return "<module>"

        for node in ast.walk(tree):
            if (rel, function(node)) in HOST_SIDE:
                continue
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                    node.value in ("cpu", "cuda") or node.value.startswith("cuda:")):
                found.append(f"{rel}:{node.lineno} device literal {node.value!r}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                    and "device" not in {k.arg for k in node.keywords}
                    and not (isinstance(parent.get(node), ast.Attribute) and parent[node].attr == "to")):
                found.append(f"{rel}:{node.lineno} {ast.unparse(node)[:60]} without device=")
    return found


def test_mitigations_and_hooks_make_tensors_where_their_inputs_are():
    assert _fixed_device_uses() == []


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="a split needs two GPUs")
def test_a_model_split_over_two_gpus_answers_as_on_one(eval_model_path, queries):
    one = _answers(*load_hf(eval_model_path, device="cuda:0"), queries)
    model, processor = load_hf(eval_model_path, device="cuda:0")
    layers = model.config.text_config.num_hidden_layers
    del model
    split = {"model.vision_tower": 0, "model.multi_modal_projector": 0, "model.language_model.embed_tokens": 0,
             "model.language_model.rotary_emb": 0, "model.language_model.norm": 1, "lm_head": 1}
    split.update({f"model.language_model.layers.{i}": int(i >= layers // 2) for i in range(layers)})
    model, processor = load_hf(eval_model_path, device_map=split)
    assert {p.device.index for p in model.parameters()} == {0, 1}
    assert _answers(model, processor, queries) == one
