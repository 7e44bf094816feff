"""The mitigations on a CUDA device answer as they do on the CPU.

The rest of the suite runs on the CPU (CI has no GPU), and
``tests/test_device_placement.py`` only scans the source for tensors made on a fixed
device. Users run on GPUs, so where one is present these tests run every mitigation on it:

* every family's tiny model, plain and under VCD (diffusion noise, no image), prior
  suppression (context and output mode) and VCD with prior suppression composed: the same
  greedy tokens as on the CPU and every step's scores within 1e-4;
* the organism through the evaluators (``HFModel``) with every mitigation, crop-and-verify
  included: the same answers on ``cuda`` as on the CPU, and bf16 on the GPU answers.

TF32 is switched off for the comparison: it is a precision choice of the user's, not of
ours (it moves logits by ~1e-3, enough to flip a near-tie of a random model).
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from hooks import resolve
from hooks.testing import TINY_MODEL_TYPES, build_tiny_model, tiny_inputs
from mitigate import VCD, PriorSuppression, attach

#: the accelerator compared with the CPU; ``VLM_TEST_DEVICE=cpu`` runs these tests' own
#: plumbing without a GPU (the comparison is then trivially exact)
DEVICE = os.environ.get("VLM_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="needs a GPU")

NEW = 4
ATOL = 1e-4


@pytest.fixture(autouse=True)
def no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class WordIds:
    """Token i decodes to 'w<i>' (the tiny models have ids, not words)."""

    all_special_ids = [0, 1, 2]

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return " ".join(f"w{i}" for i in ids)


def _span_strings(model, inputs) -> list[list[str]]:
    """Per row, two adjacent text tokens of its prompt (not image, special or the last)."""
    image = resolve(model).image_token_mask(inputs["input_ids"])
    rows = []
    for row, ids in enumerate(inputs["input_ids"].tolist()):
        real = inputs["attention_mask"][row].nonzero().flatten().tolist()
        ok = [p for p in real[1:-2] if not image[row, p] and not image[row, p + 1]
              and ids[p] not in WordIds.all_special_ids and ids[p + 1] not in WordIds.all_special_ids]
        p = ok[len(ok) // 2]
        rows.append([f"w{ids[p]} w{ids[p + 1]}"])
    return rows


MITIGATIONS = {
    "plain": lambda spans: [],
    "vcd": lambda spans: [VCD(seed=3)],
    "vcd_no_image": lambda spans: [VCD(distortion="no_image")],
    "prior_context": lambda spans: [PriorSuppression(WordIds(), spans=spans)],
    "prior_output": lambda spans: [PriorSuppression(WordIds(), mode="output", spans=spans)],
    "vcd_and_prior": lambda spans: [VCD(seed=3), PriorSuppression(WordIds(), spans=spans)],
}


def _run(model, inputs, mitigations):
    with contextlib.ExitStack() as stack, torch.no_grad():
        if mitigations:
            stack.enter_context(attach(model, *mitigations))
        out = model.generate(**inputs, max_new_tokens=NEW, do_sample=False, pad_token_id=0, output_logits=True,
                             return_dict_in_generate=True)
    return out.sequences.cpu(), [s.float().cpu() for s in out.logits]


def _same_run(cpu, gpu, what: str) -> None:
    """Equal tokens and close scores; a token may differ only at a near-tie of the CPU's
    scores (then the runs part ways and nothing after it is compared)."""
    (seq_c, logits_c), (seq_g, logits_g) = cpu, gpu
    start = seq_c.shape[1] - len(logits_c)
    for step, (a, b) in enumerate(zip(logits_c, logits_g)):
        finite = torch.isfinite(a)
        assert torch.equal(finite, torch.isfinite(b)), f"{what}: step {step} masks other tokens on cuda"
        torch.testing.assert_close(b[finite], a[finite], rtol=0, atol=ATOL, msg=lambda m: f"{what} step {step}: {m}")
        if not torch.equal(seq_c[:, start + step], seq_g[:, start + step]):
            top = a.topk(2, -1).values
            assert float((top[:, 0] - top[:, 1]).min()) < 10 * ATOL, f"{what}: step {step} chose another token"
            return
    assert torch.equal(seq_c, seq_g), what


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_every_mitigation_on_the_device_matches_the_cpu(model_type):
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=3)
    spans = _span_strings(model, inputs)
    on_cpu = {name: _run(model, inputs, make(spans)) for name, make in MITIGATIONS.items()}
    model.to(DEVICE)
    gpu_inputs = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    for name, make in MITIGATIONS.items():
        _same_run(on_cpu[name], _run(model, gpu_inputs, make(spans)), f"{model_type} {name}")


ORGANISM_MITIGATIONS = ("", "vcd:alpha=1", "prior_suppression:mode=both", "crop_verify",
                        "vcd:alpha=1,prior_suppression")


@pytest.fixture(scope="module")
def queries():
    from evaluators.benchmarks.dobench.suite import build
    from evaluators.benchmarks.mioh.suite import build as mioh

    return build(n_scenes=2, seed=3)[:8] + mioh(n_per_condition=1, seed=3)[:4]


def _answers(model, processor, queries, mitigations=ORGANISM_MITIGATIONS) -> dict[str, list[str]]:
    from evaluators.cli import parse_mitigations
    from evaluators.model import HFModel

    return {m: HFModel(model, processor, mitigations=parse_mitigations(m, processor.tokenizer, processor),
                       max_new_tokens=4)(queries) for m in mitigations}


def test_the_organism_answers_on_the_device_as_on_the_cpu(eval_model_path, queries):
    from evaluators.model import load_hf

    on_cpu = _answers(*load_hf(eval_model_path), queries)
    model, processor = load_hf(eval_model_path, device=DEVICE)
    assert model.device.type == torch.device(DEVICE).type
    assert _answers(model, processor, queries) == on_cpu
    half = _answers(*load_hf(eval_model_path, device=DEVICE, dtype="bf16"), queries)
    assert all(len(a) == len(queries) and all(isinstance(t, str) for t in a) for a in half.values())
