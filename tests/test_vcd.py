"""Visual contrastive decoding as hooks: exact against a naive two-pass reference, every
decoding mode, batch invariance, every architecture, exact removal, clear errors."""

from __future__ import annotations

import pytest
import torch

from hooks import hook_state, resolve
from hooks.testing import TINY_MODEL_TYPES, build_tiny_model, tiny_adapter, tiny_inputs
from mitigate import VCD, Plausibility, PriorSuppression, attach
from mitigate.vcd import allowed, plausibility_mask

from _chunked import generate_scores, skip_unless_chunking_is_exact

NEW = 5


@pytest.fixture(scope="module")
def llava():
    return build_tiny_model("llava")


def _gen(model, inputs, **kw):
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=NEW, pad_token_id=0, **kw)


def _naive_vcd_greedy(model, inputs, vcd: VCD, steps: int):
    """Two full forwards per token (no cache): the reference VCD loop, written plainly."""
    points = resolve(model)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    if vcd.distortion == "no_image":
        contrast_extra = extra
    else:
        contrast_extra = {**extra, "pixel_values": vcd._distort(inputs["pixel_values"])}
    image = points.image_token_mask(ids)
    per_step = []
    for _ in range(steps):
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            a = model(input_ids=ids, attention_mask=mask, position_ids=pos, **extra).logits[:, -1]
            cmask = mask.clone()
            if vcd.distortion == "no_image":
                cmask[:, : image.shape[1]] = cmask[:, : image.shape[1]].masked_fill(image, 0)
            b = model(input_ids=ids, attention_mask=cmask, position_ids=pos, **contrast_extra).logits[:, -1]
        combined = vcd.combine(a, [b])
        per_step.append(combined)
        nxt = combined.argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
        mask = torch.cat([mask, torch.ones_like(nxt)], 1)
    return ids, per_step


@pytest.mark.parametrize("distortion", ["diffusion_noise", "no_image", "gaussian_blur", "patch_mask"])
@pytest.mark.parametrize("batch", [1, 3])
def test_batched_vcd_matches_naive_two_pass_reference(llava, distortion, batch):
    inputs = tiny_inputs(llava, batch_size=batch, text_lengths=[6, 3, 5][:batch], seed=4)
    vcd = VCD(alpha=1.0, beta=0.1, distortion=distortion, seed=3)
    ref_ids, ref_logits = _naive_vcd_greedy(llava, inputs, vcd, NEW)
    with attach(llava, vcd):
        out = _gen(llava, inputs, do_sample=False, output_logits=True, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref_ids)
    for step, (ours, ref) in enumerate(zip(out.logits, ref_logits)):
        finite = allowed(ref)
        assert torch.equal(finite, allowed(ours)), f"plausible set differs at step {step}"
        torch.testing.assert_close(ours[finite], ref[finite], rtol=0, atol=1e-5)


def test_vcd_changes_the_output(llava):
    inputs = tiny_inputs(llava, batch_size=3, text_lengths=[6, 3, 5], seed=1)
    with attach(llava, VCD(alpha=3.0, beta=0.01)):
        mitigated = _gen(llava, inputs, do_sample=False)
    assert not torch.equal(mitigated, _gen(llava, inputs, do_sample=False))


@pytest.mark.parametrize("distortion", ["diffusion_noise", "no_image"])
@pytest.mark.parametrize("batch", [1, 4])
def test_alpha_zero_reproduces_the_unmitigated_model(llava, distortion, batch):
    inputs = tiny_inputs(llava, batch_size=batch, text_lengths=[6, 2, 5, 4][:batch], seed=5)
    greedy = _gen(llava, inputs, do_sample=False)
    torch.manual_seed(7)
    sampled = _gen(llava, inputs, do_sample=True, top_k=20, temperature=0.9)
    with attach(llava, VCD(alpha=0.0, distortion=distortion)):
        assert torch.equal(_gen(llava, inputs, do_sample=False), greedy)
        torch.manual_seed(7)
        assert torch.equal(_gen(llava, inputs, do_sample=True, top_k=20, temperature=0.9), sampled)


def test_alpha_zero_with_beam_search_and_branch_caches_follow_the_beams(llava):
    inputs = tiny_inputs(llava, batch_size=2, text_lengths=[6, 3], seed=6)
    beams = _gen(llava, inputs, do_sample=False, num_beams=3)
    with attach(llava, VCD(alpha=0.0, distortion="no_image")):
        assert torch.equal(_gen(llava, inputs, do_sample=False, num_beams=3), beams)
    # with a real contrast the branch rows must be reordered with the beams: compare
    # against the same beam search where the branch rows are recomputed from scratch
    with attach(llava, VCD(alpha=1.0, distortion="no_image")):
        cached = _gen(llava, inputs, do_sample=False, num_beams=3)
        fresh = _gen(llava, inputs, do_sample=False, num_beams=3, use_cache=False)
    assert torch.equal(cached, fresh)


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_distorted_branch_follows_the_beams_on_every_architecture(model_type):
    """generate() expands the encoded images per beam before the branches exist; the
    distorted images must be expanded the same way: every beam's first step equals the
    direct forward of its sample, and the cached beam search equals one recomputed
    from scratch at every step (branch rows reordered with the beams)."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[6, 3], seed=6)
    with attach(model, VCD(alpha=1.0, seed=2)):
        with torch.no_grad():
            direct = model(**inputs).logits[:, -1]
        out = _gen(model, inputs, do_sample=False, num_beams=3, output_logits=True, return_dict_in_generate=True)
        torch.testing.assert_close(out.logits[0], direct.repeat_interleave(3, dim=0), rtol=0, atol=1e-5)
        # a random tiny model may emit the image token, which a cache-free rerun would
        # read as an image placeholder: keep it out of both runs
        no_image_token = {"suppress_tokens": [resolve(model).image_token_id]}
        cached = _gen(model, inputs, do_sample=False, num_beams=3, **no_image_token)
        fresh = _gen(model, inputs, do_sample=False, num_beams=3, use_cache=False, **no_image_token)
    assert torch.equal(cached, fresh)


def test_distorted_branch_with_several_returned_samples(llava):
    inputs = tiny_inputs(llava, batch_size=2, text_lengths=[6, 3], seed=8)
    with attach(llava, VCD(alpha=1.0, seed=2)):
        with torch.no_grad():
            direct = llava(**inputs).logits[:, -1]
        out = _gen(llava, inputs, do_sample=True, num_return_sequences=2, output_logits=True,
                   return_dict_in_generate=True)
    torch.testing.assert_close(out.logits[0], direct.repeat_interleave(2, dim=0), rtol=0, atol=1e-5)
    assert out.sequences.shape[0] == 4


def test_distorted_branch_refuses_pre_encoded_features(llava):
    inputs = tiny_inputs(llava, batch_size=1, seed=6)
    with torch.no_grad():
        encoded = llava.model.get_image_features(pixel_values=inputs["pixel_values"], return_dict=True)
    rest = {k: v for k, v in inputs.items() if k != "pixel_values"}
    with attach(llava, VCD()), pytest.raises(ValueError, match="mm_encoder_outputs"):
        _gen(llava, {**rest, "mm_encoder_outputs": {"image": encoded}})


def test_a_second_attach_with_branches_is_refused_and_the_first_stays_exact(llava):
    inputs = tiny_inputs(llava, batch_size=1, seed=6)
    before = hook_state(llava)
    with attach(llava, VCD(seed=1)):
        with pytest.raises(ValueError, match="already attached"):
            attach(llava, VCD())
        with pytest.raises(ValueError, match="already attached"):
            attach(llava, PriorSuppression(mode="output"))
        out = _gen(llava, inputs, output_logits=True, return_dict_in_generate=True)
        with torch.no_grad():
            direct = llava(**inputs).logits[:, -1]
        torch.testing.assert_close(out.logits[0], direct, rtol=0, atol=1e-5)
    assert hook_state(llava) == before and "_contrast_branches" not in vars(llava)


@pytest.mark.parametrize("model_type", ["qwen2_vl", "llava"])
def test_feature_extraction_while_attached_gets_the_plain_features(model_type):
    """Only generate()'s pre-encoding encodes the branches' images: a user's own
    get_image_features call (Qwen's top level passes pixels positionally) is untouched."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=1, seed=3)
    kw = {k: v for k, v in inputs.items() if k in ("pixel_values", "image_grid_thw")}
    with torch.no_grad():
        plain = model.get_image_features(**kw, return_dict=True).pooler_output
        with attach(model, VCD()) as handle:
            got = model.get_image_features(**kw, return_dict=True).pooler_output
            assert handle.branches._encoded is None
    for a, b in zip(plain if isinstance(plain, (list, tuple)) else [plain], got if isinstance(got, (list, tuple)) else [got]):
        assert torch.equal(a, b)


def test_distortion_keeps_padding_images_of_image_splitting_models():
    """Idefics3/SmolVLM pad rows with fewer images by all-zero images, which the model
    drops; a distorted branch must keep them zero or it would add images."""
    model = build_tiny_model("idefics3")
    pixels = torch.randn(2, 2, 3, 8, 8)
    pixels[1, 1] = 0
    with attach(model, VCD(seed=1)) as handle:
        branch = handle.branches.branches[0]
        out = handle.branches._distorted(branch, pixels)
    assert torch.equal(out[1, 1], torch.zeros(3, 8, 8))
    assert not torch.equal(out[0], pixels[0]) and not torch.equal(out[1, 0], pixels[1, 0])


@pytest.mark.parametrize("distortion", ["diffusion_noise", "no_image"])
def test_batch_size_never_changes_greedy_outputs(llava, distortion):
    lengths = [6, 2, 5, 4]
    inputs = tiny_inputs(llava, batch_size=4, text_lengths=lengths, seed=8)
    with attach(llava, VCD(alpha=1.0, distortion=distortion)):
        together = _gen(llava, inputs, do_sample=False)
        for row in range(4):
            real = inputs["attention_mask"][row].bool()
            single = {k: (v[row : row + 1, real] if k in ("input_ids", "attention_mask") else v[row : row + 1])
                      for k, v in inputs.items()}
            alone = _gen(llava, single, do_sample=False)
            assert torch.equal(alone[0, -NEW:], together[row, -NEW:]), row


def test_sampling_and_streamer_work(llava):
    from transformers import TextStreamer

    class Collect(TextStreamer):
        def __init__(self):
            self.chunks = []

        def put(self, value):
            self.chunks.append(value)

        def end(self):
            pass

    inputs = tiny_inputs(llava, batch_size=1, seed=9)
    streamer = Collect()
    with attach(llava, VCD(seed=1)):
        torch.manual_seed(0)
        a = _gen(llava, inputs, do_sample=True, top_p=0.9, streamer=streamer)
        torch.manual_seed(0)
        b = _gen(llava, inputs, do_sample=True, top_p=0.9)
    assert torch.equal(a, b), "seeded sampling is reproducible"
    assert len(streamer.chunks) == NEW + 1
    # the streamer sees the prompt, then exactly the VCD tokens generate() returns
    start = inputs["input_ids"].shape[1]
    assert torch.equal(streamer.chunks[0], inputs["input_ids"])
    assert torch.equal(torch.cat([c.reshape(-1) for c in streamer.chunks[1:]]), a[0, start:])


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_every_architecture(model_type):
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[6, 3], seed=2)
    points = resolve(model)
    before = hook_state(model)
    plain = _gen(model, inputs, do_sample=False)
    with attach(model, VCD(alpha=0.0, distortion="no_image")):
        assert torch.equal(_gen(model, inputs, do_sample=False), plain)
    with attach(model, VCD(alpha=1.0, distortion="no_image")):
        out = _gen(model, inputs, do_sample=False)
        assert out.shape == plain.shape
        with torch.no_grad():
            logits = model(**inputs).logits
        assert logits.shape[0] == 2
    with attach(model, VCD(alpha=1.0)):
        with torch.no_grad():
            direct = model(**inputs).logits[:, -1]  # distorted branch, pixels expanded at the forward
        out = _gen(model, inputs, do_sample=False, output_logits=True, return_dict_in_generate=True)
        # generate() pre-encodes images: its first step must equal the direct forward
        torch.testing.assert_close(out.logits[0], direct, rtol=0, atol=1e-5)
    assert hook_state(model) == before
    rope = points.adapter.rope_state
    if rope:
        owner, _, attr = rope.rpartition(".")
        assert getattr(model.get_submodule(owner), attr).shape[0] == 2, "M-RoPE state restored to the batch"
    assert torch.equal(_gen(model, inputs, do_sample=False), plain), "detached: outputs as before"


def test_detach_restores_hooks_and_outputs_exactly(llava):
    inputs = tiny_inputs(llava, batch_size=2, text_lengths=[6, 3], seed=3)
    before = hook_state(llava)
    with torch.no_grad():
        plain = llava(**inputs).logits
    handle = attach(llava, VCD())
    assert handle.attached and handle.rows_per_sample == 2
    handle.detach()
    assert hook_state(llava) == before and not handle.attached
    with torch.no_grad():
        assert torch.equal(llava(**inputs).logits, plain)
    with pytest.raises(RuntimeError, match="boom"), attach(llava, VCD()):
        raise RuntimeError("boom")
    assert hook_state(llava) == before


@pytest.mark.parametrize("model_type", ["llava", "qwen2_vl", "idefics3"])
def test_a_keyboard_interrupt_leaves_the_attached_handle_usable(model_type):
    """Ctrl-C inside a forward skips even ``always_call`` forward hooks; a flag the
    pre-hook had set stayed set, and the next generate() under the same handle lost its
    distorted images ("needs to encode the distorted pixels itself"). It now equals a
    fresh attach."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[6, 3], seed=3)
    with attach(model, VCD(seed=1)):
        fresh = _gen(model, inputs, do_sample=False)

    def interrupt(module, args, kwargs):
        raise KeyboardInterrupt

    with attach(model, VCD(seed=1)):
        stop = resolve(model).language_model.register_forward_pre_hook(interrupt, with_kwargs=True)
        with pytest.raises(KeyboardInterrupt):
            _gen(model, inputs, do_sample=False)
        stop.remove()
        assert torch.equal(_gen(model, inputs, do_sample=False), fresh)


def test_the_users_exception_leaves_an_attach_block_when_a_hook_cannot_be_removed():
    """An attribute the handle patched (crop-and-verify's generate()) replaced again inside
    the block, then the user's error: that error leaves the block (a RuntimeError from
    detach() had replaced it), with a warning, and once the user's patch is undone detach()
    restores the model. (Two crop-and-verify handles on one model, the first way here, are
    refused since session 46.)"""
    from evaluators.organism import ORGANISM_DIR, load_organism
    from mitigate import CropVerify

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    model, processor = load_organism()
    before = hook_state(model)
    with pytest.raises(KeyError), pytest.warns(RuntimeWarning, match="KeyError"):
        with attach(model, CropVerify(processor)) as first:
            ours = model.generate
            model.generate = lambda *args, **kwargs: ours(*args, **kwargs)  # a user's wrapper on top
            raise KeyError("the user's")
    assert first.attached  # what could not be removed is still owned: detach() retries it
    model.generate = ours
    first.detach()
    assert hook_state(model) == before and not first.attached and "generate" not in vars(model)


def test_one_mitigation_object_given_twice_is_refused(llava):
    from mitigate import CropVerify
    from hooks.testing import WordIds

    vcd = VCD()
    before = hook_state(llava)
    with pytest.raises(ValueError, match="given twice"):
        attach(llava, vcd, Plausibility(), vcd)
    processor = type("Processor", (), {"tokenizer": WordIds(), "image_processor": object()})()
    with pytest.raises(ValueError, match="CropVerify is given more than once"):  # was: "... already patched by this group"
        attach(llava, CropVerify(processor), VCD(), CropVerify(processor))
    assert hook_state(llava) == before


@pytest.mark.parametrize("kwargs, argument", [
    ({"alpha": -0.5}, "alpha"), ({"alpha": float("inf")}, "alpha"), ({"beta": 0.0}, "beta"), ({"beta": 1.5}, "beta"),
    ({"distortion": "jpeg"}, "distortion"), ({"noise_step": 1000}, "noise_step"), ({"mask_ratio": 0}, "mask_ratio"),
    ({"distortion": "gaussian_blur", "blur_sigma": -1}, "blur_sigma"), ({"alpha": True}, "alpha"),
    ({"beta": "0.1"}, "beta"), ({"alpha": float("nan")}, "alpha"), ({"blur_sigma": "2"}, "blur_sigma"),
])
def test_bad_config_names_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        VCD(**kwargs)


def test_numpy_scalars_are_settings_like_floats():
    """np.float32(0.1) was refused as a beta while np.float64 (a float subclass) passed; numpy
    scalars of any width are taken, and kept as Python floats (a run records its settings as
    JSON); an int or float is kept as given (its repr is part of a run's identity)."""
    import json

    import numpy as np

    from hooks.testing import WordIds
    from mitigate import CropVerify

    with pytest.raises(ValueError, match="alpha must be a finite number >= 0"):
        VCD(alpha=10**400)  # beyond a float: an OverflowError before
    assert VCD(noise_step=np.int64(500)).noise_step == 500
    vcd = VCD(alpha=np.float32(0.5), beta=np.float16(0.25), blur_sigma=np.int64(3))
    assert (vcd.alpha, vcd.beta, vcd.blur_sigma) == (0.5, 0.25, 3.0)
    assert all(type(v) is float for v in (vcd.alpha, vcd.beta, vcd.blur_sigma))
    json.dumps([vcd.alpha, vcd.beta])
    assert "alpha=1," in repr(VCD(alpha=1)) and type(VCD(alpha=1).alpha) is int
    assert type(PriorSuppression(WordIds(), strength=np.float32(0.5)).strength) is float
    processor = type("Processor", (), {"tokenizer": WordIds(), "image_processor": object()})()
    assert CropVerify(processor, tau=np.float32(0.5)).tau == 0.5


def test_call_without_pixels_is_a_clear_error(llava):
    inputs = tiny_inputs(llava, batch_size=1, seed=1, images_per_sample=0)
    with attach(llava, VCD()), pytest.raises(ValueError, match="no pixel inputs"):
        _gen(llava, inputs)
    with attach(llava, VCD(distortion="no_image")), pytest.raises(ValueError, match="image tokens"):
        _gen(llava, inputs)


def test_plausibility_alone_masks_implausible_tokens(llava):
    inputs = tiny_inputs(llava, batch_size=2, text_lengths=[6, 3], seed=3)
    with torch.no_grad():
        plain = llava(**inputs).logits
        with attach(llava, Plausibility(beta=0.5)):
            cut = llava(**inputs).logits
    keep = plausibility_mask(plain, 0.5)
    assert torch.equal(allowed(cut), keep)
    assert torch.equal(cut[keep], plain[keep])
    # labels: the loss was the unmitigated model's beside cut logits; refused (all -100: no target, kept)
    labels = inputs["input_ids"].clone()
    with torch.no_grad(), attach(llava, Plausibility(beta=0.5)):
        with pytest.raises(ValueError, match="do not pass labels"):
            llava(**inputs, labels=labels)
        assert torch.equal(llava(**inputs, labels=torch.full_like(labels, -100)).logits, cut)
    # outside the set: below every plausible token, in the model's own order
    lowest = plain.masked_fill(~keep, float("inf")).amin(-1, keepdim=True)
    assert bool((cut[~keep] < lowest.expand_as(cut)[~keep] - 1000).all())
    row = plain[0, -1]
    out = cut[0, -1][~keep[0, -1]]
    assert torch.equal(out.argsort(), row[~keep[0, -1]].argsort())
    from mitigate.vcd import cut_implausible

    for half in (torch.bfloat16, torch.float16):  # the order survives a half-precision model's logits
        low = cut_implausible(plain.to(half), plain.to(half), 0.5)
        assert low.dtype == torch.float32
        assert torch.equal(low[0, -1][~keep[0, -1]].argsort(stable=True),
                           plain.to(half)[0, -1][~keep[0, -1]].float().argsort(stable=True))
    with pytest.raises(ValueError, match="beta"):
        Plausibility(beta=2)


def test_a_cut_attached_before_the_branches_sees_only_the_combined_rows(llava):
    """Plausibility attached in its own attach() before VCD: the combine hook still runs
    first, so the cut never sees (and -inf's) the contrast rows that (1 + a) l - a c then
    turns into +inf; the tokens equal one attach() of both, and sampling runs."""
    inputs = tiny_inputs(llava, batch_size=2, text_lengths=[6, 3], seed=4)
    with attach(llava, VCD(seed=3), Plausibility(beta=0.8)):
        together = _gen(llava, inputs)
    with attach(llava, Plausibility(beta=0.8)), attach(llava, VCD(seed=3)):
        apart = _gen(llava, inputs, output_logits=True, return_dict_in_generate=True)
        assert not any(bool(torch.isposinf(step).any()) for step in apart.logits)
        torch.manual_seed(0)
        with torch.no_grad():
            llava.generate(**inputs, max_new_tokens=4, do_sample=True, pad_token_id=0)
    assert torch.equal(together, apart.sequences)


def test_pipeline_image_text_to_text_works_with_vcd():
    from evaluators.organism.package import build_model_config, build_processor, build_tokenizer
    from PIL import Image
    from transformers import LlavaForConditionalGeneration, pipeline

    tokenizer = build_tokenizer(["is", "there", "a", "dog", "?", "yes", "no"])
    processor = build_processor(tokenizer)
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(build_model_config(len(tokenizer))).eval()
    pipe = pipeline("image-text-to-text", model=model, processor=processor)
    message = [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (64, 64), "red")},
                                             {"type": "text", "text": "is there a dog?"}]}]
    three = {"max_new_tokens": 3, "min_new_tokens": 3, "do_sample": False}
    plain = pipe(text=message, generate_kwargs=three, return_full_text=False)
    with attach(model, VCD(alpha=0.0)) as handle:  # the branch runs in the pipeline's generate() ...
        same = pipe(text=message, generate_kwargs=three, return_full_text=False)
    assert handle.branches.forward_calls == 3  # the prefill and two decoding steps, each with the branch
    assert same[0]["generated_text"] == plain[0]["generated_text"]  # ... and alpha = 0 is exactly plain
    with attach(model, VCD()) as handle:
        out = pipe(text=message, generate_kwargs=three, return_full_text=False)
    assert handle.branches.forward_calls == 3 and isinstance(out[0]["generated_text"], str)


@pytest.mark.parametrize("model_type", [t for t in TINY_MODEL_TYPES if tiny_adapter(t).pixel_layout == "flat_patches"])
def test_flat_patch_images_are_distorted_one_by_one(model_type):
    """Flat-patch pixels (Qwen-VL, GLM-4V) are one (patches, C*T*P*P) tensor for the whole batch; each image's
    rows (from image_grid_thw) get their own seeded noise, so the distorted image the
    encoder sees is the same alone and in a batch."""
    from PIL import Image

    model = build_tiny_model(model_type)
    points = resolve(model)
    rng = torch.Generator().manual_seed(3)
    images = [Image.fromarray((torch.rand(h, w, 3, generator=rng) * 255).byte().numpy()) for h, w in ((56, 84), (84, 56))]
    seen = []

    def grab(module, args, kwargs):
        seen.append((args[0] if args else kwargs["hidden_states"]).clone())

    pair = tiny_inputs(model, images=images, seed=4)
    first = tiny_inputs(model, images=images[:1], seed=4)
    handle = points.vision_encoder.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with attach(model, VCD(seed=2)):
            _gen(model, pair, do_sample=False)
            _gen(model, first, do_sample=False)
    finally:
        handle.remove()
    # generate() encodes the original images, then the branch's distorted ones
    (original, distorted), (alone_original, alone_distorted) = seen[:2], seen[2:]
    rows = int(first["image_grid_thw"].prod(-1).sum())
    assert torch.equal(alone_original, original[:rows])  # the same image ...
    assert torch.equal(alone_distorted, distorted[:rows])  # ... gets the same noise in both batches
    assert not torch.equal(distorted[:rows], original[:rows])


@pytest.mark.parametrize("model_type", [t for t in TINY_MODEL_TYPES if tiny_adapter(t).pixel_layout
                                        in ("flat_patches", "batch_patches")])
def test_patch_row_pixels_mask_whole_patches_and_refuse_blur(model_type):
    """Pixels given as patch rows (Qwen-VL / GLM-4V flat, Gemma 4 per image) cannot be
    blurred as images: a clear error naming the distortions that apply; patch masking zeroes
    whole patch rows, about ``mask_ratio`` of them, and generate() runs with it."""
    model = build_tiny_model(model_type)
    points = resolve(model)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[3, 5], seed=4)
    pixels = inputs[points.pixel_inputs[0]]
    with pytest.raises(ValueError, match="patch rows.*patch_mask"):
        with attach(model, VCD(distortion="gaussian_blur")):
            _gen(model, inputs, do_sample=False)
    seen = []
    handle = points.vision_encoder.register_forward_pre_hook(
        lambda m, a, k: seen.append((a[0] if a else k.get("hidden_states", k.get("pixel_values"))).clone()),
        with_kwargs=True)
    try:
        with attach(model, VCD(distortion="patch_mask", mask_ratio=0.5, seed=1)):
            _gen(model, inputs, do_sample=False)
    finally:
        handle.remove()
    original, distorted = seen[0], seen[1]
    assert original.shape == distorted.shape == pixels.shape
    rows = original.reshape(-1, original.shape[-1])
    mean = 0.5 if points.adapter.pixel_range == "unit" else 0.0  # the normalised space's 0
    masked = (distorted.reshape(-1, distorted.shape[-1]) == mean).all(-1) & (rows != 0).any(-1)
    kept = (distorted.reshape(-1, distorted.shape[-1]) == rows).all(-1)
    assert bool((masked | kept).all())  # every patch row either zeroed whole or untouched
    assert 0.25 < float(masked.float().sum() / (rows != 0).any(-1).sum()) < 0.75


def _distorted_pixels(model, points, runs, distortions) -> list:
    """Per distortion, the pixels VCD's branch hands the vision tower for each of ``runs``
    (inputs generated from in turn): the tower sees each run's original pixels, then its
    distorted ones."""
    seen = []
    handle = points.vision_encoder.register_forward_pre_hook(
        lambda m, a, k: seen.append(k.get("pixel_values", a[0] if a else None).clone()), with_kwargs=True)
    try:
        for distortion in distortions:
            for inputs in runs:
                with attach(model, VCD(distortion=distortion, seed=2)):
                    _gen(model, inputs, do_sample=False)
    finally:
        handle.remove()
    per = 2 * len(runs)
    return [tuple(seen[start + 2 * k + 1] for k in range(len(runs))) for start in range(0, per * len(distortions), per)]


def test_padded_patch_rows_distort_each_image_alone():
    """Gemma 4 pads each image's patch rows to the batch's longest: the distortion acts on an
    image's real patches only, so the same image is distorted the same alone and beside a
    larger one, and the padding stays as the processor left it."""
    model = build_tiny_model("gemma4")
    points = resolve(model)
    pair = tiny_inputs(model, batch_size=2, seed=4)  # 32x48 (96 patches) and 32x32 (64, padded to 96)
    alone = {k: v[1:] for k, v in pair.items()}
    real = (pair["image_position_ids"][1] != -1).all(-1)
    assert int(real.sum()) == 64 and pair["pixel_values"].shape[1] == 96
    for both, single in _distorted_pixels(model, points, (pair, alone), ("diffusion_noise", "patch_mask")):
        torch.testing.assert_close(both[1, :64], single[0, :64], rtol=0, atol=0)
        assert torch.equal(both[1, 64:], pair["pixel_values"][1, 64:])  # padding untouched
        assert not torch.equal(both[1, :64], pair["pixel_values"][1, :64])


@pytest.mark.parametrize("model_type", ["mistral3", "llava_pixtral"])
def test_padded_images_distort_each_image_alone_and_batching_keeps_greedy_tokens(model_type):
    """A Pixtral tower's processor pads a batch's images to the largest one (image_sizes says
    each one's top-left size): the distortion acts on an image's own pixels only, so the same
    image is distorted the same alone and beside a larger one (its noise seeded by its own
    pixels, a blur drawing nothing from the padding), the padding stays as it was, and VCD's
    greedy tokens do not depend on the batch (a review finding: the noise had been drawn over
    the padded canvas and seeded by it)."""
    model = build_tiny_model(model_type)
    points = resolve(model)
    pair = tiny_inputs(model, batch_size=2, text_lengths=[4, 4], seed=4)  # 32x48 and 48x40, padded to 48x48
    (h, w) = pair["image_sizes"][0].tolist()
    alone = {k: v[:1] for k, v in pair.items()}
    alone["pixel_values"] = alone["pixel_values"][..., :h, :w]
    for both, single in _distorted_pixels(model, points, (pair, alone), ("diffusion_noise", "gaussian_blur")):
        torch.testing.assert_close(both[0, :, :h, :w], single[0], rtol=0, atol=1e-6)
        assert torch.equal(both[0, :, h:], pair["pixel_values"][0, :, h:]) and torch.equal(
            both[0, :, :, w:], pair["pixel_values"][0, :, :, w:])  # its padding untouched
        assert not torch.equal(both[0, :, :h, :w], pair["pixel_values"][0, :, :h, :w])
    with attach(model, VCD(alpha=1.0, seed=3)):
        together = _gen(model, pair, do_sample=False)
        first = _gen(model, alone, do_sample=False)
    assert torch.equal(first[0, -NEW:], together[0, -NEW:])


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_every_architecture_matches_two_plain_forwards_per_token(model_type):
    """Per family, ours against the naive reference with no hooks at all: each step, one
    plain forward on the image and one on the distorted image (both recomputed from the
    whole sequence, no cache), combined by VCD's formula -- tokens equal, logits within 1e-5."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=1, seed=5)
    points = resolve(model)
    vcd = VCD(alpha=1.0, beta=0.1, seed=7)
    pixel = points.pixel_inputs[0]
    if points.adapter.pixel_range == "unit":  # [0, 1] pixels (Gemma 4): noise where the model maps them, 2x - 1
        distorted = {**inputs, pixel: (vcd._distort(2 * inputs[pixel] - 1) + 1) / 2}
    else:
        distorted = {**inputs, pixel: vcd._distort(inputs[pixel])}
    ids, steps = inputs["input_ids"], []
    per_token = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.shape == ids.shape}
    # what a generated token gets: mask 1; token type 0 (text), except PaliGemma's prefix-LM
    # types, where 1 marks the suffix (causal) and 0 the bidirectional prefix
    new_value = {"attention_mask": 1, "token_type_ids": int(model.config.model_type == "paligemma")}
    for _ in range(3):
        grown = {k: ids if k == "input_ids" else
                 torch.cat([v, torch.full_like(v[:, : ids.shape[1] - v.shape[1]], new_value.get(k, 0))], 1)
                 for k, v in per_token.items()}
        with torch.no_grad():
            a = model(**{**inputs, **grown}).logits[:, -1]
            b = model(**{**distorted, **grown}).logits[:, -1]
        combined = vcd.combine(a, [b])
        steps.append(combined)
        ids = torch.cat([ids, combined.argmax(-1, keepdim=True)], 1)
    with attach(model, vcd):
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False, pad_token_id=0, output_logits=True,
                             return_dict_in_generate=True)
    assert torch.equal(out.sequences, ids)
    for ours, ref in zip(out.logits, steps):
        finite = allowed(ref)
        assert torch.equal(finite, allowed(ours))
        torch.testing.assert_close(ours[finite], ref[finite], rtol=0, atol=1e-5)


def test_assisted_decoding_with_a_separate_assistant_gives_vcds_tokens():
    """Speculative (assisted) decoding: the assistant drafts unmitigated, the mitigated model
    verifies several positions in one forward -- its branch rows are combined per position and
    cropped with the cache -- so greedy output is exactly VCD's own. On the trained organism,
    where VCD changes the answers."""
    import copy

    from evaluators.organism import ORGANISM_DIR, load_organism
    from evaluators.organism.package import format_prompt
    from evaluators.world import BIASED, World

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    model, processor = load_organism()
    assistant = copy.deepcopy(model)
    world, changed = World(BIASED), 0
    for i in range(4):  # assisted generation takes one prompt at a time
        inputs = processor(text=[format_prompt("describe the image .")], images=[world.scene(10**9 + 50 + i).render()],
                           return_tensors="pt")
        with torch.no_grad():
            plain = model.generate(**inputs, max_new_tokens=12, do_sample=False)
            with attach(model, VCD()):
                vcd = model.generate(**inputs, max_new_tokens=12, do_sample=False)
                assisted = model.generate(**inputs, max_new_tokens=12, do_sample=False, assistant_model=assistant)
        assert torch.equal(assisted, vcd), i
        changed += not torch.equal(vcd, plain)
    assert changed, "VCD changes some of these answers, so the equality says something"
    with attach(model, VCD()), pytest.raises(ValueError, match="separate copy as the assistant"):
        model.generate(**inputs, max_new_tokens=4, do_sample=False, assistant_model=model)  # itself: the drafts


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_image_free_branch_under_a_static_cache(model_type):
    """With a compilable cache (``cache_implementation="static"``) ``generate()`` hands the
    model 4-D masks of its own -- one tensor, or one per layer type -- and, without padding,
    none at the prefill. The image-free branch hid the image only in a 2-D mask, so it
    decoded with the image in view there (and the distorted-image branch failed on
    per-layer-type masks). Now the image-free rows get a 2-D mask read back from the
    full-attention mask: the scores equal those of the default dynamic cache at every step,
    for VCD's no-image branch, prior suppression's output mode and VCD's distorted image,
    sliding-window families (Gemma 3/4, Aya Vision; windows of a few tokens) included."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[6, 3], seed=2)
    try:
        _gen(model, inputs, do_sample=False, cache_implementation="static")
    except Exception as error:  # noqa: BLE001 -- the family's own refusal, without us
        pytest.skip(f"{model_type}: no static cache in transformers ({type(error).__name__})")
    for seed, lengths in ((2, [6, 3]), (3, [7, 5])):  # with and without padding
        inputs = tiny_inputs(model, batch_size=2, text_lengths=lengths, seed=seed)
        for mitigation in (VCD(distortion="no_image"), PriorSuppression(mode="output"), VCD()):
            scores = {}
            for cache in ("static", None):
                kw = {"cache_implementation": cache} if cache else {}
                with attach(model, mitigation):
                    out = _gen(model, inputs, do_sample=False, output_scores=True, return_dict_in_generate=True,
                               min_new_tokens=NEW, **kw)
                scores[cache] = torch.stack(out.scores).nan_to_num(0.0, 0.0, 0.0)
            torch.testing.assert_close(scores["static"], scores[None], rtol=0, atol=1e-4)


def test_padding_mask_read_back_from_generates_masks(llava):
    """What the image-free rows' 2-D mask is made from: a 2-D mask as given, none as all
    ones, a 4-D mask (bool or additive; a dict by its full-attention entry) at the prefill
    as its diagonal -- a real token sees itself, under a causal or a sliding mask alike --
    and at a decoding step the prefill's padding with ones for the new positions (a sliding
    window's narrow buffer masks are never read); a static cache filled before the call is
    refused."""
    from mitigate.branches import _CallState

    with attach(llava, VCD(distortion="no_image")) as handle:
        branches = handle.branches
        read = branches._padding_mask
        two_d = torch.tensor([[0, 1, 1], [1, 1, 1]])
        assert read(two_d, 2, 0, 3, "cpu") is two_d
        assert torch.equal(read(None, 2, 0, 3, "cpu"), torch.ones(2, 3, dtype=torch.long))
        causal = torch.tril(torch.ones(3, 4, dtype=torch.bool))[None, None].repeat(2, 1, 1, 1)  # 4 = cache room
        causal[0, ..., 0] = False  # row 0 left-padded
        assert torch.equal(read(causal, 2, 0, 3, "cpu"), two_d)
        additive = torch.zeros(causal.shape).masked_fill(~causal, torch.finfo(torch.float32).min)
        assert torch.equal(read(additive, 2, 0, 3, "cpu"), two_d)
        sliding = causal & ~torch.tril(torch.ones(3, 4, dtype=torch.bool), diagonal=-2)  # a window of 2
        assert torch.equal(read({"full_attention": causal, "sliding_attention": sliding}, 2, 0, 3, "cpu"), two_d)
        assert torch.equal(read({"sliding_attention": sliding}, 2, 0, 3, "cpu"), two_d)
        assert torch.equal(read({"full_attention": None}, 2, 0, 3, "cpu"), torch.ones(2, 3, dtype=torch.long))
        branches.state = _CallState(2, None, padding=two_d)  # after that prefill: a decoding step
        step = read({"sliding_attention": sliding[:, :, -1:, :2]}, 2, 3, 4, "cpu")
        assert torch.equal(step, torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))
        branches.state = _CallState(2, None)
        with pytest.raises(ValueError, match="did not see filled"):
            read(causal[:, :, -1:], 2, 2, 3, "cpu")


def test_image_free_branch_under_a_static_cache_of_sliding_layers_only():
    """A language model whose every layer slides (Mistral 3 with a window of 8, the prompt
    four times longer): its static masks are a window's buffer, and the padding read from
    them at the prefill must not take the tokens outside the window for padding (a review
    found the read-back did, then refused the first decoding step). Equal to the dynamic
    cache at every step."""
    from transformers import AutoModelForImageTextToText

    from hooks.testing import tiny_config

    config = tiny_config("mistral3", "sdpa")
    config.text_config.sliding_window = 8
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa").float().eval()
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[6, 3], seed=2)
    assert inputs["input_ids"].shape[1] > 4 * 8
    scores = {}
    for cache in ("static", None):
        kw = {"cache_implementation": cache} if cache else {}
        with attach(model, VCD(distortion="no_image")):
            out = _gen(model, inputs, do_sample=False, output_scores=True, return_dict_in_generate=True,
                       min_new_tokens=NEW, **kw)
        scores[cache] = torch.stack(out.scores).nan_to_num(0.0, 0.0, 0.0)
    torch.testing.assert_close(scores["static"], scores[None], rtol=0, atol=1e-4)


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_image_free_branch_under_a_chunked_prefill(model_type):
    """``prefill_chunk_size`` sends the prompt in several forwards over the cache; the
    image tokens of every chunk are hidden from the image-free rows (only the first chunk's
    were, and the branch saw the rest of the image), so the scores equal an unchunked
    prefill's -- wherever transformers' own chunking leaves the plain model's unchanged."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=3)
    first_image = int(resolve(model).image_token_mask(inputs["input_ids"]).any(0).nonzero()[0])
    chunk = max(8, first_image + 1)

    skip_unless_chunking_is_exact(model_type, model, inputs, chunk, max_new_tokens=NEW)
    for mitigation in (VCD(distortion="no_image"), PriorSuppression(mode="output")):
        torch.testing.assert_close(generate_scores(model, inputs, mitigation, prefill_chunk_size=chunk, max_new_tokens=NEW),
                                   generate_scores(model, inputs, mitigation, max_new_tokens=NEW), rtol=0, atol=1e-4)


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_hidden_states_and_attentions_are_the_original_rows(model_type):
    """``output_hidden_states`` / ``output_attentions`` came back with every branch's rows
    appended (twice the batch under VCD); they are the original rows', as the logits are:
    at alpha = 0 (same tokens) equal to the unmitigated model's at every step."""
    model = build_tiny_model(model_type, attn_implementation="eager")
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[6, 3], seed=2)
    kw = dict(do_sample=False, return_dict_in_generate=True, output_hidden_states=True, output_attentions=True)
    plain = _gen(model, inputs, **kw)
    for mitigation in (VCD(alpha=0.0), VCD(alpha=0.0, distortion="no_image")):
        with attach(model, mitigation):
            ours = _gen(model, inputs, **kw)
        assert torch.equal(ours.sequences, plain.sequences)
        for name in ("hidden_states", "attentions"):
            for step_plain, step_ours in zip(getattr(plain, name), getattr(ours, name)):
                for a, b in zip(step_plain, step_ours):
                    if isinstance(a, torch.Tensor):  # a hybrid decoder's linear layers give no attentions
                        torch.testing.assert_close(b, a, rtol=0, atol=1e-4)


def test_a_cache_allocated_for_the_batch_alone_is_refused(llava):
    """A static cache with ``prefill_chunk_size`` is allocated before the first forward, for
    the caller's rows only: the branch rows cannot fit, a clear error (it was an
    ``index_copy_`` shape error from inside the cache)."""
    inputs = tiny_inputs(llava, batch_size=2, text_lengths=[7, 5], seed=3)
    _gen(llava, inputs, do_sample=False, cache_implementation="static", prefill_chunk_size=8)  # plain runs
    with attach(llava, VCD(distortion="no_image")):
        with pytest.raises(ValueError, match="allocated for 2"):
            _gen(llava, inputs, do_sample=False, cache_implementation="static", prefill_chunk_size=8)


def test_a_tuple_output_is_refused_not_returned_uncombined(llava):
    """``return_dict=False`` returns a tuple, which the forward hook cannot combine: a clear
    error, where it used to return the branch rows' logits appended, twice the batch."""
    inputs = tiny_inputs(llava, batch_size=2, text_lengths=[7, 5], seed=3)
    with attach(llava, VCD()), torch.no_grad():
        with pytest.raises(ValueError, match="return_dict=True"):
            llava(**inputs, return_dict=False)
        assert llava(**inputs).logits.shape[0] == 2


def test_a_cache_from_another_call_is_refused_and_a_manual_loop_runs(llava):
    """A forward that continues a cache must continue the last prefill's: the branch rows,
    image positions and padding the hooks hold are that call's. A manual decoding loop over
    the cache the model made at the prefill runs (VCD's tokens); continuing a first call's
    cache after a second call is a clear error, not the second call's state applied."""
    inputs = tiny_inputs(llava, batch_size=2, text_lengths=[7, 5], seed=3)
    other = tiny_inputs(llava, batch_size=2, text_lengths=[4, 6], seed=4)
    with attach(llava, VCD(distortion="no_image")), torch.no_grad():
        expected = _gen(llava, inputs, do_sample=False)[:, inputs["input_ids"].shape[1]:]
        out = llava(**inputs, use_cache=True)
        mask, tokens = inputs["attention_mask"], []
        positions = mask.sum(-1, keepdim=True) - 1
        for _ in range(NEW):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(token)
            mask = torch.cat([mask, torch.ones_like(token)], 1)
            positions = positions + 1
            out = llava(input_ids=token, attention_mask=mask, position_ids=positions, cache=out.cache, use_cache=True)
        assert torch.equal(torch.cat(tokens, 1), expected)
        first = llava(**inputs, use_cache=True)
        llava(**other, use_cache=True)  # another call in between
        token = first.logits[:, -1].argmax(-1, keepdim=True)
        with pytest.raises(ValueError, match="continues a cache that is not"):
            llava(input_ids=token, attention_mask=torch.cat([inputs["attention_mask"], torch.ones_like(token)], 1),
                  cache=first.cache, use_cache=True)


def _continued(model, inputs, seq, cache=None, **kw):
    """Plain greedy continuation of ``seq`` (the prompt of ``inputs`` and tokens after it):
    over ``cache`` (which holds all of ``seq`` but its last token), or from scratch with the
    prompt's image inputs, its per-token ones extended over the generated tokens (PaliGemma's
    token types: 1, the suffix)."""
    grow = seq.shape[1] - inputs["input_ids"].shape[1]
    mask = torch.nn.functional.pad(inputs["attention_mask"], (0, grow), value=1)
    extra = {}
    if cache is None:
        for name, value in inputs.items():
            if name in ("input_ids", "attention_mask"):
                continue
            if value.dim() == 2 and value.shape == inputs["input_ids"].shape:
                value = torch.nn.functional.pad(value, (0, grow), value=int(name == "token_type_ids"
                                                                            and model.config.model_type == "paligemma"))
            extra[name] = value
    else:
        extra["cache"] = cache
    with torch.no_grad():
        return model.generate(input_ids=seq, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0,
                              output_scores=True, return_dict_in_generate=True, **extra, **kw)


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_the_returned_cache_continues_plainly_after_detach(model_type):
    """The KV cache a mitigated ``generate()`` returns held the branch rows after ``detach()``,
    so continuing it (a chat's next turn) was a shape error from inside the model. Detaching
    cuts it back to the caller's rows: plain decoding over it gives the tokens and scores of
    the unmitigated model over the whole conversation without a cache -- on every family:
    sliding-window layers (Gemma 3), shared-KV placeholders (Gemma 4), linear-attention
    states (Qwen3.5), M-RoPE."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=3)
    with attach(model, VCD(distortion="no_image")), torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
        held = {layer.keys.shape[0] for layer in out.past_key_values.layers if getattr(layer, "keys", None) is not None
                and layer.keys.dim() > 0}
        assert held == {4}  # while attached: the caller's two rows and the branch's two
    kept = _continued(model, inputs, out.sequences, cache=out.past_key_values)
    fresh = _continued(model, inputs, out.sequences)
    assert torch.equal(kept.sequences, fresh.sequences)
    for a, b in zip(kept.scores, fresh.scores):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


def test_an_earlier_calls_cache_is_cut_when_the_next_prompt_runs(llava):
    """Only the last call's cache can be continued under the hooks; an earlier one is cut
    back as soon as another prompt runs (beam search's rows: batch x beams), is still
    refused while attached, and continues plainly after detach."""
    inputs = tiny_inputs(llava, batch_size=2, text_lengths=[7, 5], seed=3)
    other = tiny_inputs(llava, batch_size=2, text_lengths=[4, 6], seed=4)
    with attach(llava, VCD()), torch.no_grad():
        beams = llava.generate(**inputs, max_new_tokens=3, num_beams=3, do_sample=False, pad_token_id=0,
                               return_dict_in_generate=True).past_key_values
        assert beams.layers[0].keys.shape[0] == 12  # 2 rows x 3 beams, twice
        first = llava.generate(**inputs, max_new_tokens=3, do_sample=False, pad_token_id=0,
                               return_dict_in_generate=True)
        assert beams.layers[0].keys.shape[0] == 6
        llava.generate(**other, max_new_tokens=2, do_sample=False, pad_token_id=0)
        cache = first.past_key_values
        assert cache.layers[0].keys.shape[0] == 2
        mask = torch.nn.functional.pad(inputs["attention_mask"], (0, 3), value=1)
        with pytest.raises(ValueError, match="continues a cache that is not"):
            llava(input_ids=first.sequences[:, -1:], attention_mask=mask, cache=cache, use_cache=True)
    kept = _continued(llava, inputs, first.sequences, cache=cache)
    assert torch.equal(kept.sequences, _continued(llava, inputs, first.sequences).sequences)


def test_a_static_cache_keeps_its_branch_rows():
    """A static cache is allocated for the rows the first forward brings (the branches'
    too) and reused as it is by the next ``generate()``: detaching leaves it untouched
    (documented) rather than reshaping a cache transformers may hand back."""
    from hooks.cache import keep_first_rows
    from transformers import StaticCache

    model = build_tiny_model("llava")
    cache = StaticCache(config=model.config.get_text_config(), max_cache_len=8)
    with torch.no_grad():
        model.model.language_model(inputs_embeds=torch.zeros(4, 3, model.config.text_config.hidden_size),
                                   cache=cache, use_cache=True)
    assert not keep_first_rows(cache, 2, 4)
    assert cache.layers[0].keys.shape[0] == 4


def test_a_processor_that_forbids_the_whole_plausible_set_leaves_the_models_best_allowed_token():
    """On the organism a question whose plausible set is only the end token: under
    ``min_new_tokens`` an -inf cut left all -inf rows (greedy emitted <pad>, sampling
    raised). The cut is finite, so decoding takes the best allowed token, never <pad>,
    and sampling runs; without the processor the tokens are VCD's as before."""
    from evaluators.organism import ORGANISM_DIR, load_organism
    from evaluators.organism.package import format_prompt
    from evaluators.world import BIASED, World

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    model, processor = load_organism()
    inputs = processor(text=[format_prompt("is there a dog ?")], images=[World(BIASED).scene(10**9 + 51).render()],
                       return_tensors="pt")
    n = inputs["input_ids"].shape[1]
    with torch.no_grad(), attach(model, VCD()):
        free = model.generate(**inputs, do_sample=False, max_new_tokens=6, output_logits=True,
                              return_dict_in_generate=True)
        held = model.generate(**inputs, do_sample=False, max_new_tokens=6, min_new_tokens=4)
        torch.manual_seed(1)
        sampled = model.generate(**inputs, do_sample=True, max_new_tokens=6, min_new_tokens=4)
    eos, pad = model.generation_config.eos_token_id, processor.tokenizer.pad_token_id
    assert int(allowed(free.logits[1][0]).sum()) == 1 and int(free.sequences[0, n + 1]) == eos  # only </s> allowed
    assert pad not in held[0, n:].tolist() and pad not in sampled[0, n : n + 4].tolist()
    assert int(held[0, n]) == int(free.sequences[0, n])  # before the constraint bites: VCD's token


def test_classifier_free_guidance_is_a_clear_error_for_every_mitigation(llava):
    """``generate(guidance_scale=...)`` runs the model a second time per step, on an
    unconditional prompt, from inside its logits processor, and every mitigation's hooks
    acted on that forward too: the contrast branches failed with "need keyword inputs" (the
    caller did pass keywords), the plausibility cut also cut the unconditional logits (the
    guidance then lifted tokens by ~(guidance_scale - 1) * 1e4), and prior suppression's
    context mode took the unconditional prompt for a new one and dropped the generated
    prompt's spans from the second step on. Each is now an error naming guidance_scale;
    the handle stays usable, and a plain positional call outside the guidance still runs."""
    from hooks.testing import WordIds

    inputs = tiny_inputs(llava, batch_size=1, text_lengths=[7], seed=3)
    spans = WordIds.middle_pair(llava, inputs)
    plain = _gen(llava, inputs, do_sample=False)
    for mitigation in (VCD(), VCD(distortion="no_image"), Plausibility(), PriorSuppression(mode="output"),
                       PriorSuppression(WordIds(), spans=spans)):
        with attach(llava, mitigation):
            with pytest.raises(ValueError, match="guidance_scale"):
                _gen(llava, inputs, do_sample=False, guidance_scale=1.5)
            assert _gen(llava, inputs, do_sample=False).shape == plain.shape  # still usable
    with attach(llava, Plausibility()), torch.no_grad():
        llava(inputs["input_ids"][:, -3:])  # a positional text-only call of one's own is not guidance


def test_a_cache_filled_before_attach_is_a_clear_error(llava):
    """A prompt cached before ``attach()`` (prefix caching) and continued by ``generate()``
    while attached has no branch rows: a clear error naming the cause, where it was a
    RuntimeError that the hooks "lost track of the batch"."""
    from transformers import DynamicCache

    inputs = tiny_inputs(llava, batch_size=1, text_lengths=[7], seed=3)
    ids, mask, cut = inputs["input_ids"], inputs["attention_mask"], inputs["input_ids"].shape[1] - 2
    for mitigation in (VCD(), PriorSuppression(mode="output")):
        cache = DynamicCache(config=llava.config.get_text_config())
        with torch.no_grad():
            llava(input_ids=ids[:, :cut], attention_mask=mask[:, :cut], pixel_values=inputs["pixel_values"],
                  cache=cache, use_cache=True)
        with attach(llava, mitigation), pytest.raises(ValueError, match="no prefill filled while they were attached"):
            _gen(llava, {"input_ids": ids, "attention_mask": mask}, do_sample=False, cache=cache)


def test_an_exponential_length_penalty_over_a_plausibility_cut_is_a_clear_error(llava):
    """transformers' ``exponential_decay_length_penalty`` lifts the end token's score by its
    magnitude, and the cut leaves an implausible end token 1e4 below: it became certain as
    soon as the factor passed 2 (the organism's description stopped after 5 of 12 tokens).
    Refused, naming the option, wherever a cut applies; without a cut (alpha = 0, gamma = 0)
    the penalty runs as on the plain model."""
    inputs = tiny_inputs(llava, batch_size=1, text_lengths=[7], seed=3)
    penalty = {"exponential_decay_length_penalty": (2, 1.5)}
    plain = _gen(llava, inputs, do_sample=False, **penalty)
    for mitigation in (VCD(), VCD(distortion="no_image"), Plausibility(), PriorSuppression(mode="output")):
        with attach(llava, mitigation):
            with pytest.raises(ValueError, match="exponential_decay_length_penalty"):
                _gen(llava, inputs, do_sample=False, **penalty)
            _gen(llava, inputs, do_sample=False)  # without the penalty: runs
    for mitigation in (VCD(alpha=0), PriorSuppression(mode="output", gamma=0)):
        with attach(llava, mitigation):
            assert torch.equal(_gen(llava, inputs, do_sample=False, **penalty), plain)


def test_continuous_batching_is_a_clear_error(llava):
    """``cache_implementation="paged"`` (continuous batching) packs every request into one
    row of a ``PagedAttentionCache``, which has no ``get_seq_length``: the contrast branches
    and context mode failed with an AttributeError from inside the hook (which transformers'
    batching thread logs, returning no tokens); now a ValueError naming the option.
    Plausibility, row-wise on each position's logits, needs neither and runs there."""
    from hooks.testing import WordIds
    from transformers.generation.continuous_batching.cache import PagedAttentionCache

    paged = object.__new__(PagedAttentionCache)  # the real class; the hooks refuse it before the model reads it
    inputs = tiny_inputs(llava, batch_size=1, text_lengths=[7], seed=3)
    spans = WordIds.middle_pair(llava, inputs)
    for mitigation in (VCD(), PriorSuppression(mode="output"), PriorSuppression(WordIds(), spans=spans)):
        with attach(llava, mitigation), torch.no_grad(), pytest.raises(ValueError, match="cache_implementation='paged'"):
            llava(**inputs, cache=paged)


def test_continuous_batching_through_generate_raises_in_the_callers_thread(llava):
    """Under a mitigation that cannot run there, ``generate(cache_implementation="paged")``
    and ``generate_batch()`` raised nothing: transformers' batching thread logged the hook's
    ValueError and returned the prompts unextended (a user's walkthrough, session 39).
    attach() now makes ``init_continuous_batching``, where every such path starts, raise it;
    detach restores the instance; Plausibility alone still runs there."""
    inputs = tiny_inputs(llava, batch_size=1, text_lengths=[7], seed=3)
    for mitigation in (VCD(), PriorSuppression(mode="output")):
        with attach(llava, mitigation):
            with pytest.raises(ValueError, match=f"continuous batching.*{mitigation.name}"):
                llava.generate(**inputs, max_new_tokens=2, do_sample=False, cache_implementation="paged")
            with pytest.raises(ValueError, match="continuous batching"):
                llava.generate_batch([inputs["input_ids"][0].tolist()])
        assert "init_continuous_batching" not in vars(llava)
    with attach(llava, Plausibility()):
        assert "init_continuous_batching" not in vars(llava)


def test_drafts_that_repeat_the_image_token_stay_in_view_of_the_image_free_branch():
    """Prompt-lookup (and assisted) decoding verifies several drafted tokens in one forward,
    which the branches took for more prompt: a draft repeating the image token's id (copied
    from the prompt; the tiny Gemma 3 generates it) was hidden from the image-free rows,
    where a decoding step one token at a time leaves it in view -- the tokens differed from
    plain greedy VCD. Drafts are generated tokens, never image: the same tokens now."""
    model = build_tiny_model("gemma3")
    inputs = tiny_inputs(model, batch_size=1, seed=2)
    image_id, n = resolve(model).image_token_id, inputs["input_ids"].shape[1]
    options = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False, pad_token_id=0)
    with attach(model, VCD(distortion="no_image")), torch.no_grad():
        stepwise = model.generate(**inputs, **options)
        drafted = model.generate(**inputs, prompt_lookup_num_tokens=3, **options)
    assert image_id in stepwise[0, n:].tolist()  # the case: a generated token with the image token's id
    assert torch.equal(drafted, stepwise)


@pytest.mark.parametrize("mitigations", ["vcd", "context", "crop_verify"])
def test_threads_generating_at_once_on_an_attached_model_get_their_sequential_answers(organism, mitigations):
    """Four threads calling generate() at once (a web server's pool) interleaved their forwards
    over the mitigations' per-call state and failed with errors about another call's cache
    (a user review); the calls now run one at a time and each gets its own answer."""
    import threading

    from evaluators.world import BIASED, World
    from hooks.prompting import user_prompt
    from mitigate import CropVerify

    model, processor = organism
    questions = ["is there a dog in the image ? answer yes or no .", "how many cats are in the image ?",
                 "i think there is a bird . is there a bird in the image ? answer yes or no .",
                 "is there a bird in the image ? answer yes or no ."]
    world = World(BIASED)
    make = {"vcd": lambda: VCD(seed=0), "context": lambda: PriorSuppression(processor.tokenizer),
            "crop_verify": lambda: CropVerify(processor, tau=0.5)}[mitigations]

    def ask(i):
        enc = processor(text=[user_prompt(processor, questions[i])], images=[world.scene(i).render()],
                        return_tensors="pt")
        return model.generate(**enc, max_new_tokens=6, do_sample=False)

    with attach(model, make()):
        alone = [ask(i) for i in range(4)]
    got, errors = {}, []

    def work(i):
        try:
            got[i] = ask(i)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(f"{type(err).__name__}: {err}")

    with attach(model, make()):
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors[0]
    assert all(torch.equal(got[i], alone[i]) for i in range(4))
    assert "generate" not in vars(model)


def test_two_attaches_detach_in_any_order_and_an_attached_model_deep_copies(llava):
    """Each attach() had put its own lock on generate(), so detaching the first of two
    handles raised "generate was replaced after this patch", and deepcopy failed on the
    lock (a review): the model's lock is taken by the first attach() only."""
    import copy

    from hooks import hook_state

    inputs = tiny_inputs(llava, batch_size=1, seed=2)
    with torch.no_grad():
        llava(**inputs)
    before = hook_state(llava)
    first, second = attach(llava, VCD(seed=0)), attach(llava, Plausibility(beta=1.0))
    copy.deepcopy(llava)
    first.detach()
    with torch.no_grad():
        cut = llava(**inputs).logits
    assert bool((cut < -1000).any())  # the plausibility cut still acts
    second.detach()
    assert hook_state(llava) == before and "generate" not in vars(llava)


def test_register_refuses_what_the_command_line_could_not_use_and_takes_a_rerun_cell():
    """A subclass without its own name registered as "mitigation" and blocked the next; a
    non-dataclass registered and then crashed vlm-eval; a notebook cell run twice was
    refused; attach(model, VCD) said only "got type" (a researcher's review)."""
    from dataclasses import dataclass

    from mitigate import Mitigation, register
    from mitigate.base import MITIGATIONS

    @dataclass
    class Nameless(Mitigation):
        k: int = 1

    with pytest.raises(ValueError, match="must set its own name"):
        register(Nameless)

    class Plain(Mitigation):
        name = "plain_test_mitigation"

    with pytest.raises(TypeError, match="must be a @dataclass"):
        register(Plain)

    class Undecorated(VCD):  # a dataclass's subclass without @dataclass: its gamma would be no setting
        gamma: float = 0.5
        name = "undecorated_test_vcd"

    with pytest.raises(TypeError, match="must be a @dataclass"):
        register(Undecorated)
    with pytest.raises(TypeError, match="takes a Mitigation subclass"):
        register(int)

    def cell():  # the same class defined again, as a notebook cell run twice defines it
        @dataclass
        class Rerun(Mitigation):
            name = "rerun_test_mitigation"

        return Rerun

    try:
        first, second = register(cell()), register(cell())
        assert MITIGATIONS["rerun_test_mitigation"] is second is not first

        @dataclass
        class Other(Mitigation):
            name = "rerun_test_mitigation"

        with pytest.raises(ValueError, match="registered already"):
            register(Other)
    finally:
        MITIGATIONS.pop("rerun_test_mitigation", None)
    with pytest.raises(TypeError, match=r"got the class VCD, pass VCD\(\)"):
        attach(build_tiny_model("llava"), VCD)


def test_two_handles_refusing_continuous_batching_detach_in_any_order(llava):
    """Each handle with a contrast branch patched init_continuous_batching again, so detaching
    the first one raised and left its patch on the model: the refusal is shared, holds while
    any handle is attached, and the last one out restores the model."""
    from hooks import hook_state
    from hooks.testing import WordIds
    from mitigate import PriorSuppression
    from mitigate.base import attached

    inputs = tiny_inputs(llava, batch_size=1, seed=2)
    with torch.no_grad():
        llava.generate(**inputs, max_new_tokens=2, do_sample=False)
    before = hook_state(llava)
    first = attach(llava, VCD())
    second = attach(llava, PriorSuppression(WordIds()))  # context mode: no branch, no continuous batching
    assert attached(llava) == [*first.mitigations, *second.mitigations]
    first.detach()
    with pytest.raises(ValueError, match="prior_suppression need"):
        llava.init_continuous_batching()
    second.detach()
    assert hook_state(llava) == before and "init_continuous_batching" not in vars(llava)
    assert attached(llava) == []


def test_a_detach_refused_for_a_later_patch_can_be_retried_once_it_is_undone(llava):
    """The shared continuous-batching refusal dropped its holder before checking that the
    attribute was still its own: the retried detach failed on list.remove and the refusal
    stayed on the model for good (a review)."""
    from mitigate.base import attached

    handle = attach(llava, VCD())
    mine = llava.init_continuous_batching
    llava.init_continuous_batching = lambda *a, **k: "a user's patch"
    with pytest.raises(RuntimeError, match="init_continuous_batching was replaced after attach"):
        handle.detach()
    llava.init_continuous_batching = mine
    handle.detach()
    assert "init_continuous_batching" not in vars(llava) and not handle.attached and attached(llava) == []
