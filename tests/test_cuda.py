"""The mitigations on a CUDA device answer as they do on the CPU.

The rest of the suite runs on the CPU (CI has no GPU), and
``tests/test_device_placement.py`` only scans the source for tensors made on a fixed
device. Users run on GPUs, so where one is present these tests run the mitigations on it
and compare with an independent CPU run of the same model:

* every family's tiny model, plain and under every VCD distortion, prior suppression in
  each mode (``compact_positions`` too) and VCD with prior suppression: the same greedy
  tokens, each step's scores within ``ATOL``; a mitigation a family refuses must be
  refused on the device too; and under a static cache on the device against the CPU's
  default one;
* the organism: the same scores under VCD, prior suppression and both; crop-and-verify's
  records (answers, confidences, which queries were verified, the views' p(yes), boxes)
  with each localiser, through ``attach()``'s ``generate()`` and image by image for MIOH's
  multi-image questions; the evaluators' answers; and bf16 on the device agreeing with
  fp32 on most answers.

TF32 is switched off for the comparison: it is a precision choice of the user's, not of
ours (it moves logits by ~1e-3, enough to flip a near-tie of a random model).
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from hooks.testing import TINY_MODEL_TYPES, WordIds, build_tiny_model, tiny_inputs
from mitigate import VCD, CropVerify, PriorSuppression, attach
from mitigate.vcd import allowed

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


def _prior(tokenizer, spans, **kwargs):
    return PriorSuppression(tokenizer, spans=spans, **kwargs)


#: name -> mitigations, given (tokenizer, per-row span strings or None to detect them)
MITIGATIONS = {
    "plain": lambda tok, spans: [],
    "vcd": lambda tok, spans: [VCD(seed=3)],
    "vcd_blur": lambda tok, spans: [VCD(distortion="gaussian_blur")],
    "vcd_patch_mask": lambda tok, spans: [VCD(distortion="patch_mask", seed=3)],
    "vcd_no_image": lambda tok, spans: [VCD(distortion="no_image")],
    "prior_context": lambda tok, spans: [_prior(tok, spans)],
    "prior_compact": lambda tok, spans: [_prior(tok, spans, compact_positions=True)],
    "prior_output": lambda tok, spans: [_prior(tok, spans, mode="output")],
    "prior_both": lambda tok, spans: [_prior(tok, spans, mode="both")],
    "vcd_and_prior": lambda tok, spans: [VCD(seed=3), _prior(tok, spans)],
}


def _run(model, inputs, mitigations, **generate_kwargs):
    """``(sequences, per-step logits)`` on the host, or ``("refused", message)``."""
    try:
        with contextlib.ExitStack() as stack, torch.no_grad():
            if mitigations:
                stack.enter_context(attach(model, *mitigations))
            out = model.generate(**inputs, max_new_tokens=NEW, do_sample=False, pad_token_id=0, output_logits=True,
                                 return_dict_in_generate=True, **generate_kwargs)
    except ValueError as error:  # a mitigation this family refuses (blur on patch rows, ...)
        return "refused", str(error)
    return out.sequences.cpu(), [s.float().cpu() for s in out.logits]


def _same_run(cpu, device, what: str) -> None:
    """Equal tokens and close scores, row by row. A row may take another token only where the
    CPU's two best scores for it were within ``10 * ATOL`` (a near-tie); that row is not
    compared after it, the others are."""
    if cpu[0] == "refused" or device[0] == "refused":
        assert cpu == device, f"{what}: refused on one device only: {cpu[1] if cpu[0] == 'refused' else device[1]}"
        return
    (seq_c, logits_c), (seq_d, logits_d) = cpu, device
    assert seq_c.shape[0] == seq_d.shape[0], what
    start = seq_c.shape[1] - len(logits_c)
    alive = torch.ones(seq_c.shape[0], dtype=torch.bool)
    for step, (a, b) in enumerate(zip(logits_c, logits_d)):
        a, b = a[alive], b[alive]
        finite = allowed(a)
        assert torch.equal(finite, allowed(b)), f"{what}: step {step} masks other tokens on {DEVICE}"
        torch.testing.assert_close(b[finite], a[finite], rtol=0, atol=ATOL, msg=lambda m: f"{what} step {step}: {m}")
        rows = alive.nonzero().flatten()
        for k, row in enumerate(rows.tolist()):
            if int(seq_c[row, start + step]) != int(seq_d[row, start + step]):
                top = a[k][finite[k]].topk(2).values
                assert float(top[0] - top[1]) < 10 * ATOL, f"{what}: row {row} step {step} chose another token"
                alive[row] = False
    assert torch.equal(seq_c[alive], seq_d[alive]), what


def _to(inputs: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_every_mitigation_on_the_device_matches_the_cpu(model_type):
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=3)
    spans = WordIds.middle_pair(model, inputs)
    on_cpu = {name: _run(model, inputs, make(WordIds(), spans)) for name, make in MITIGATIONS.items()}
    assert on_cpu["plain"][0] != "refused" and on_cpu["vcd"][0] != "refused"
    model.to(DEVICE)
    for name, make in MITIGATIONS.items():
        _same_run(on_cpu[name], _run(model, _to(inputs, DEVICE), make(WordIds(), spans)), f"{model_type} {name}")


STATIC = ("plain", "vcd", "vcd_no_image", "prior_context", "prior_output", "prior_both")


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_a_static_cache_on_the_device_matches_the_cpus_dynamic_cache(model_type):
    """``cache_implementation="static"`` (what compiled decoding on a GPU uses: 4-D masks
    built by generate(), a fixed-size cache) against the CPU's default cache, for the
    mitigations whose masks and caches it changes. "plain" runs first, so generate()
    compiles its steps on the device before any mitigation is attached: this test found
    that the mitigations then ran in a graph traced without their hooks (hooks.compiled;
    tests/test_compiled.py repeats it on the CPU)."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=3)
    spans = WordIds.middle_pair(model, inputs)
    on_cpu = {name: _run(model, inputs, MITIGATIONS[name](WordIds(), spans)) for name in STATIC}
    model.to(DEVICE)
    for name in STATIC:
        device = _run(model, _to(inputs, DEVICE), MITIGATIONS[name](WordIds(), spans), cache_implementation="static")
        _same_run(on_cpu[name], device, f"{model_type} {name} static")


# -- the organism ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def queries():
    from evaluators.benchmarks.dobench.suite import build
    from evaluators.benchmarks.mioh.suite import build as mioh

    return build(n_scenes=2, seed=3)[:8] + mioh(n_per_condition=1, seed=3)[:4]


@pytest.fixture(scope="module")
def organism_pair(eval_model_path):
    """The organism twice: on the CPU and on the device."""
    from evaluators.model import load_hf

    return load_hf(eval_model_path), load_hf(eval_model_path, device=DEVICE)


def _single(queries):
    return [q for q in queries if len(q.images) == 1]


def _encode(processor, queries, device):
    from evaluators.organism.package import format_prompt

    return _to(processor(text=[format_prompt(q.prompt) for q in queries], images=[q.load_images() for q in queries],
                         return_tensors="pt", padding=True), device)


@pytest.mark.parametrize("name", ["plain", "vcd", "prior_both", "vcd_and_prior"])
def test_the_organisms_scores_on_the_device_match_the_cpu(organism_pair, queries, name):
    (cpu, processor), (dev, _) = organism_pair
    batch = _single(queries)
    make = MITIGATIONS[name]
    ref = _run(cpu, _encode(processor, batch, "cpu"), make(processor.tokenizer, None))
    _same_run(ref, _run(dev, _encode(processor, batch, DEVICE), make(processor.tokenizer, None)), f"organism {name}")


def _records_agree(a: list[dict], b: list[dict], what: str) -> int:
    """Crop-and-verify records: the same first answers (confidence within ``ATOL``) and the
    same verified queries; then, for every query whose views were cut at the same place
    (boxes within a pixel), the same final answer and the views' p(yes) within ``ATOL``.
    A window chosen at a near-tie of the attention map may move by a patch on another
    device, and its views then see other pixels: those queries are counted, not compared.
    Returns how many were left out."""
    assert [r["first_answer"] for r in a] == [r["first_answer"] for r in b], what
    assert [r["verified"] for r in a] == [r["verified"] for r in b], what
    moved = 0
    for i, (x, y) in enumerate(zip(a, b)):
        assert abs(x["confidence"] - y["confidence"]) <= ATOL, f"{what} row {i}"
        if x["verified"] and max(abs(p - q) for p, q in zip(x["box"], y["box"])) > 1.0:
            moved += 1
            continue
        assert x["answer"] == y["answer"], f"{what} row {i}"
        for view, got in x.get("views", {}).items():
            assert abs(got["p_yes"] - y["views"][view]["p_yes"]) <= ATOL, f"{what} row {i} view {view}"
    return moved


@pytest.mark.parametrize("locate", ["attention", "embedding", "zoom"])
def test_crop_and_verify_on_the_device_matches_the_cpu(organism_pair, queries, locate):
    (cpu, processor), (dev, _) = organism_pair
    batch = _single(queries)
    images, prompts = [q.load_images()[0] for q in batch], [q.prompt for q in batch]
    runs = []
    for model in (cpu, dev):
        cv = CropVerify(processor, locate=locate, gate=1.0, tau=0.0)  # verify every "no", overturn on any "yes"
        runs.append((cv.answer(model, images, prompts, max_new_tokens=NEW), cv.stats))
    (a, stats_a), (b, stats_b) = runs
    assert stats_a["verified"] > 0, "the comparison must reach the views"
    moved = _records_agree(a, b, f"crop_verify locate={locate}")
    assert moved <= stats_a["verified"] // 4, f"{moved} of {stats_a['verified']} windows moved on {DEVICE}"
    if not moved:
        assert stats_a == stats_b


def test_crop_and_verify_through_generate_and_image_by_image_on_the_device(organism_pair, queries):
    (cpu, processor), (dev, _) = organism_pair
    batch = _single(queries)
    multi = [q for q in queries if len(q.images) > 1]
    out = []
    for model, device in ((cpu, "cpu"), (dev, DEVICE)):
        cv = CropVerify(processor, gate=1.0, tau=0.0, which_image=True)
        with attach(model, cv), torch.no_grad():  # the processor's output, then plain generate()
            seq = model.generate(**_encode(processor, batch, device), max_new_tokens=NEW, do_sample=False)
        which = cv.answer_which_image(model, [q.load_images() for q in multi], [q.prompt for q in multi],
                                      max_new_tokens=NEW)
        out.append((seq.cpu(), dict(cv.stats), [r["answer"] for r in which]))
    assert out[0][1].get("verified", 0) > 0
    assert torch.equal(out[0][0], out[1][0])
    assert out[0][1:] == out[1][1:]


ORGANISM_MITIGATIONS = ("", "vcd:alpha=1", "prior_suppression:mode=both", "crop_verify",
                        "vcd:alpha=1,prior_suppression")


def _answers(model, processor, queries, mitigations=ORGANISM_MITIGATIONS) -> dict[str, list[str]]:
    from evaluators.cli import parse_mitigations
    from evaluators.model import HFModel

    return {m: HFModel(model, processor, mitigations=parse_mitigations(m, processor.tokenizer, processor),
                       max_new_tokens=NEW)(queries) for m in mitigations}


def test_the_organism_answers_on_the_device_as_on_the_cpu(organism_pair, eval_model_path, queries):
    from evaluators.model import load_hf

    (cpu, processor), (dev, _) = organism_pair
    on_cpu = _answers(cpu, processor, queries)
    assert dev.device.type == torch.device(DEVICE).type
    assert _answers(dev, processor, queries) == on_cpu
    # bf16 rounds every activation; it must still give most of fp32's answers
    half = _answers(*load_hf(eval_model_path, device=DEVICE, dtype="bf16"), queries)
    for m, answers in half.items():
        same = sum(x == y for x, y in zip(answers, on_cpu[m]))
        assert same >= 0.75 * len(queries), f"{m}: bf16 gives {same} of {len(queries)} of fp32's answers"


@pytest.mark.parametrize("name", ["vcd", "context", "crop_verify"])
def test_threads_generating_at_once_on_the_device_get_their_sequential_answers(organism_pair, queries, name):
    """A server's threads calling generate() at once on an attached model on the device: each
    gets the answer it gets alone there (the calls run one at a time, ``OneCallAtATime``),
    and that answer is the CPU's."""
    import threading

    (cpu, processor), (dev, _) = organism_pair
    batch = _single(queries)[:4]
    make = {"vcd": lambda: VCD(seed=0), "context": lambda: PriorSuppression(processor.tokenizer),
            "crop_verify": lambda: CropVerify(processor, gate=1.0, tau=0.0)}[name]

    def ask(model, device, i):
        with torch.no_grad():
            return model.generate(**_encode(processor, [batch[i]], device), max_new_tokens=NEW, do_sample=False).cpu()

    with attach(cpu, make()):
        on_cpu = [ask(cpu, "cpu", i) for i in range(len(batch))]
    got, errors = {}, []

    def work(i):
        try:
            got[i] = ask(dev, DEVICE, i)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(f"{type(err).__name__}: {err}")

    with attach(dev, make()):
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batch))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors[0]
    assert [torch.equal(got[i], on_cpu[i]) for i in range(len(batch))] == [True] * len(batch)


def test_crop_and_verify_gates_on_the_models_own_scores_under_near_greedy_sampling_on_the_device(organism_pair,
                                                                                                 queries):
    """Under a shipped near-greedy sampling config (Qwen2-VL-Instruct's top_k=1, top_p=0.001,
    temperature=0.01) the gate reads the model's first-step distribution, not generate()'s
    processed scores: on the device it verifies what greedy decoding verifies on the CPU."""
    (cpu, processor), (dev, _) = organism_pair
    batch = _single(queries)
    images, prompts = [q.load_images()[0] for q in batch], [q.prompt for q in batch]
    greedy = CropVerify(processor, gate=0.9, tau=0.5)
    ref = greedy.answer(cpu, images, prompts, max_new_tokens=NEW)
    sampled = CropVerify(processor, gate=0.9, tau=0.5)
    torch.manual_seed(0)
    got = sampled.answer(dev, images, prompts, max_new_tokens=NEW, do_sample=True, top_k=1, top_p=0.001,
                         temperature=0.01)
    assert greedy.stats["verified"] > 0, "the comparison must reach the views"
    moved = _records_agree(ref, got, "near-greedy sampling on the device")
    assert moved <= greedy.stats["verified"] // 4
