"""Native-format loaders: good files load, malformed ones name file/line/field, missing or
corrupt images mark a sample invalid instead of stopping anything."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from evaluators.benchmarks import causal_halbench, hallusegbench
from evaluators.data import DataError, read_jsonl


def _png(path, size=(8, 8), grey=0):
    Image.fromarray(np.full((*size, 3), grey, dtype=np.uint8)).save(path)


def _mask(path, size=(8, 8), box=(2, 2, 5, 6)):
    array = np.zeros(size, dtype=np.uint8)
    array[box[1]:box[3], box[0]:box[2]] = 255
    Image.fromarray(array).save(path)


def test_hallusegbench_data_json(tmp_path):
    _png(tmp_path / "f.png")
    _png(tmp_path / "c.png", grey=9)  # the edit: a counterfactual with I's pixels is refused
    for name in ("fm.png", "cm.png"):
        _mask(tmp_path / name)
    (tmp_path / "bad.png").write_bytes(b"not an image")
    entries = [
        {"factual_image_path": "f.png", "factual_mask_path": "fm.png", "counterfactual_image_path": "c.png",
         "counterfactual_mask_path": "cm.png", "factual_label": "dog", "counterfactual_label": "cat"},
        {"factual_image_path": "f.png", "factual_mask_path": "fm.png", "counterfactual_image_path": "missing.png",
         "counterfactual_mask_path": "cm.png", "factual_label": "dog", "counterfactual_label": "cat",
         "question": "what guards the house?", "counterfactual_question": "what purrs?"},
        {"factual_image_path": "bad.png", "factual_mask_path": "fm.png", "counterfactual_image_path": "c.png",
         "counterfactual_mask_path": "cm.png", "factual_label": "dog", "counterfactual_label": "cat"},
    ]
    (tmp_path / "data.json").write_text(json.dumps(entries))
    samples = hallusegbench.load(tmp_path)
    assert [s.split for s in samples] == ["referring", "reasoning", "referring"]
    assert samples[0].problem is None
    assert "missing image" in samples[1].problem
    assert "corrupt image" in samples[2].problem
    assert samples[0].factual_image.open().size == (8, 8)


def test_hallusegbench_mask_that_cannot_be_scored_is_an_invalid_input(tmp_path):
    """An empty ground-truth mask (the object only in the alpha channel, say) or one of
    another size than its image: named as the sample's problem, not scored (an audit found
    the first scored IoU_fact 0 in the means and left out of CMS, the second a pixel-exact
    box at IoU 0.25)."""
    _png(tmp_path / "f.png")
    _png(tmp_path / "c.png", grey=9)
    _mask(tmp_path / "good.png")
    _mask(tmp_path / "small.png", size=(4, 4), box=(1, 1, 3, 3))
    Image.fromarray(np.zeros((8, 8, 4), dtype=np.uint8)).save(tmp_path / "alpha.png")  # transparent: no grey
    entry = {"factual_image_path": "f.png", "counterfactual_image_path": "c.png", "factual_label": "dog",
             "counterfactual_label": "cat"}
    (tmp_path / "data.json").write_text(json.dumps([
        {**entry, "id": 0, "factual_mask_path": "good.png", "counterfactual_mask_path": "good.png"},
        {**entry, "id": 1, "factual_mask_path": "alpha.png", "counterfactual_mask_path": "good.png"},
        {**entry, "id": 2, "factual_mask_path": "good.png", "counterfactual_mask_path": "small.png"},
    ]))
    good, empty, small = hallusegbench.load(tmp_path)
    assert good.problem is None
    assert "alpha.png has no object pixel" in empty.problem
    assert "small.png is 4x4, its image" in small.problem and "8x8" in small.problem


def test_hallusegbench_pair_without_an_edit_is_refused(tmp_path):
    """I' is I with c replaced by c' (Sec. 3): the factual file named twice is a DataError on
    its field, and a counterfactual file with the factual pixels (a copy) an invalid input,
    so ΔIoU_visual is never scored on a pair that shows no edit."""
    _png(tmp_path / "f.png")
    _png(tmp_path / "copy.png")
    _mask(tmp_path / "m.png")
    entry = {"factual_image_path": "f.png", "factual_mask_path": "m.png", "counterfactual_mask_path": "m.png",
             "factual_label": "dog", "counterfactual_label": "cat"}
    (tmp_path / "data.json").write_text(json.dumps([{**entry, "counterfactual_image_path": "./f.png"}]))
    with pytest.raises(DataError, match=r"field 'counterfactual_image_path': is the factual image 'f.png'"):
        hallusegbench.load(tmp_path)
    (tmp_path / "data.json").write_text(json.dumps([{**entry, "counterfactual_image_path": "copy.png"}]))
    (copied,) = hallusegbench.load(tmp_path)
    assert "copy.png has the pixels of the factual image" in copied.problem


def test_hallusegbench_malformed_entry_names_file_item_and_field(tmp_path):
    (tmp_path / "data.json").write_text(json.dumps([{"factual_image_path": "f.png"}]))
    with pytest.raises(DataError, match=r"data.json, line 1, field 'factual_mask_path': missing"):
        hallusegbench.load(tmp_path)
    # a pair of one label scores dIoU_textual 0 by construction
    entry = {"factual_image_path": "f.png", "factual_mask_path": "fm.png", "counterfactual_image_path": "c.png",
             "counterfactual_mask_path": "cm.png", "factual_label": "dog", "counterfactual_label": "Dog "}
    (tmp_path / "data.json").write_text(json.dumps([entry]))
    with pytest.raises(DataError, match=r"field 'counterfactual_label': is the factual label 'dog'"):
        hallusegbench.load(tmp_path)
    (tmp_path / "data.json").write_text("[{")
    with pytest.raises(DataError, match="invalid JSON"):
        hallusegbench.load(tmp_path)


def test_causal_halbench_qa_json_and_pairs(tmp_path):
    (tmp_path / "images").mkdir()
    _png(tmp_path / "images" / "000123.jpg")
    items = [
        {"image_name": "000123.jpg", "q": "Is there a fork?", "type": "target", "tag": "origin", "id": 1, "answer": "yes"},
        {"image_name": "000123001.jpg", "q": "Is there a fork?", "type": "target", "tag": "inpainted", "id": 2,
         "answer": "yes"},
    ]
    (tmp_path / "qa.json").write_text(json.dumps(items))
    loaded = causal_halbench.load(tmp_path)
    assert loaded[1].base_name == "000123.jpg"
    assert loaded[0].problem is None and "missing" in loaded[1].problem
    ((a, b),) = causal_halbench.pairs(loaded)
    assert (a.id, b.id) == ("1", "2")
    # the original asked the question again (for another counterfactual of it): the pair keeps the first
    items.insert(1, {**items[0], "id": 5})
    (tmp_path / "qa.json").write_text(json.dumps(items))
    assert [(a.id, b.id) for a, b in causal_halbench.pairs(causal_halbench.load(tmp_path))] == [("1", "2")]


def test_causal_halbench_pairs_the_releases_underscore_names(tmp_path):
    """The authors' release names a counterfactual ``<origin stem>_001.jpg``; cutting three
    characters off the stem formed no pair at all, so CPR was empty on the real data."""
    items = [
        {"image_name": "COCO_val2014_000000580294.jpg", "q": "Is there a fork?", "type": "target", "tag": "origin",
         "id": 1, "answer": "yes"},
        {"image_name": "COCO_val2014_000000580294_001.jpg", "q": "Is there a fork?", "type": "target",
         "tag": "inpainted", "id": 2, "answer": "yes"},
        {"image_name": "COCO_val2014_000000000123.jpg", "q": "Is there a cup?", "type": "target", "tag": "origin",
         "id": 3, "answer": "yes"},
        {"image_name": "COCO_val2014_000000000123002.jpg", "q": "Is there a cup?", "type": "target",
         "tag": "inpainted", "id": 4, "answer": "yes"},  # the bare form still pairs
    ]
    (tmp_path / "qa.json").write_text(json.dumps(items))
    loaded = causal_halbench.load(tmp_path)
    assert [it.base_name for it in loaded[1::2]] == ["COCO_val2014_000000580294.jpg", "COCO_val2014_000000000123.jpg"]
    assert [(a.id, b.id) for a, b in causal_halbench.pairs(loaded)] == [("1", "2"), ("3", "4")]


def test_causal_halbench_ids_need_be_unique_only_within_a_base_images_group(tmp_path):
    """The authors' metric.py keys an item by (base image, id): ids restarting per base image
    loaded nowhere (every repeat was refused); now they are qualified by their base image,
    and a repeat inside one group, which the authors' key would silently collapse, is refused."""
    def item(name, tag, i):
        return {"image_name": name, "q": "Is there a fork?", "type": "target", "tag": tag, "id": i, "answer": "yes"}

    items = [item("a.jpg", "origin", 0), item("a_001.jpg", "inpainted", 1),
             item("b.jpg", "origin", 0), item("b_001.jpg", "inpainted", 1)]
    (tmp_path / "qa.json").write_text(json.dumps(items))
    loaded = causal_halbench.load(tmp_path)
    assert [it.id for it in loaded] == ["a.jpg/0", "a.jpg/1", "b.jpg/0", "b.jpg/1"]
    assert [(a.id, b.id) for a, b in causal_halbench.pairs(loaded)] == [("a.jpg/0", "a.jpg/1"), ("b.jpg/0", "b.jpg/1")]
    (tmp_path / "qa.json").write_text(json.dumps(items[:2] + [item("a_002.jpg", "inpainted", 1)]))
    with pytest.raises(DataError, match=r"line 3, field 'id': '1' already used by item 2 \(both in the group of base "
                       r"image 'a.jpg'\)"):
        causal_halbench.load(tmp_path)


@pytest.mark.parametrize("bad, fieldname", [
    ({"tag": "edited"}, "tag"), ({"answer": "maybe"}, "answer"), ({"type": "other"}, "type"), ({"q": 3}, "q"),
    ({"tag": "inpainted", "image_name": "x.jpg"}, "image_name"),
    # Sec. 4.3 fixes the truth by type: Q_c and Q_cf "yes", Q_a "no" (CHR and AAC assume it)
    ({"answer": "no"}, "answer"), ({"type": "absent"}, "answer"),
    ({"type": "inpaint", "tag": "inpainted", "image_name": "a_001.jpg", "answer": "no"}, "answer"),
])
def test_causal_halbench_bad_values(tmp_path, bad, fieldname):
    item = {"image_name": "a.jpg", "q": "Is there a cat?", "type": "target", "tag": "origin", "id": 1, "answer": "yes"}
    (tmp_path / "qa.json").write_text(json.dumps([item, {**item, "id": 2, **bad}]))  # id 1 again: a repeated id
    with pytest.raises(DataError, match=rf"line 2, field '{fieldname}'"):
        causal_halbench.load(tmp_path)


def test_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n\n{"a": \n')
    with pytest.raises(DataError, match="x.jsonl, line 3: invalid JSON"):
        list(read_jsonl(path))


@pytest.mark.parametrize("name", ["dobench", "reactbench", "mioh"])
def test_schema_docs_are_in_step_with_the_code(name):
    import importlib
    from pathlib import Path

    from evaluators.schema import schema_markdown

    module = importlib.import_module(f"evaluators.benchmarks.{name}")
    text = (Path(module.__file__).parent / "schema.md").read_text()
    table = schema_markdown("x", module.SCHEMA).split("\n", 2)[2]
    assert table in text


def test_dobench_jsonl_loader(tmp_path):
    from evaluators.benchmarks import dobench

    _png(tmp_path / "s1.png")
    good = {"id": 1, "scene_id": "s1", "image": "s1.png", "series": "A", "level": 3, "view": "Full", "object": "dog",
            "question": "I am certain there is no dog in the image. Is there a dog?", "answer": "yes", "source": "x"}
    missing = {**good, "id": 2, "scene_id": "s2", "image": "nope.png"}
    (tmp_path / "d.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(missing) + "\n")
    rows = dobench.load(tmp_path / "d.jsonl")
    assert rows[0]["_problem"] is None and rows[0]["source"] == "x" and rows[0]["_line"] == 1
    assert "missing image" in rows[1]["_problem"]
    (tmp_path / "d.jsonl").write_text(json.dumps({**good, "level": 4}) + "\n")
    with pytest.raises(DataError, match=r"d.jsonl, line 1, field 'level'"):
        dobench.load(tmp_path / "d.jsonl")


def test_a_directory_is_not_reported_as_a_missing_file(tmp_path):
    from evaluators.data import read_json_list

    with pytest.raises(DataError, match="is a directory, not a file: give a JSON Lines file"):
        list(read_jsonl(tmp_path))
    with pytest.raises(DataError, match="is a directory, not a file: give a JSON file holding a list"):
        list(read_json_list(tmp_path))
    with pytest.raises(DataError, match="file not found"):
        list(read_jsonl(tmp_path / "nope.jsonl"))


def test_json_true_and_false_are_not_integers(tmp_path):
    """JSON's booleans are Python ints: "level": true had loaded as level 1."""
    from evaluators.data import field

    with pytest.raises(DataError, match=r"line 3, field 'level': expected int, got bool True"):
        field({"level": True}, "level", int, "x.jsonl", 3, choices=(0, 1, 2, 3))
    with pytest.raises(DataError, match="expected str/int, got bool"):
        field({"id": False}, "id", (str, int), "x.jsonl", 3)
    assert field({"flag": True}, "flag", (bool, str), "x.jsonl", 3) is True
    assert field({"level": 1}, "level", int, "x.jsonl", 3) == 1
