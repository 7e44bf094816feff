"""Answer extraction: hand-written cases, including the awkward ones."""

import pytest

from evaluators.answers import box_iou, parse_box, parse_choice, parse_number, parse_option, parse_yes_no


@pytest.mark.parametrize("text, expected", [
    ("yes", True), ("Yes.", True), ("Yes, there is a dog.", True), (" yes </s>", True),
    ("no", False), ("No, there isn't.", False), ("Not at all", False), ("NO!", False),
    ("maybe", None), ("", None), ("yes and no", True), ("no, yes", False),
])
def test_yes_no(text, expected):
    assert parse_yes_no(text) is expected if expected is not None else parse_yes_no(text) is None


@pytest.mark.parametrize("text, expected", [
    ("b", "b"), ("B)", "b"), ("(c) image 3", "c"), ("image 2", "b"), ("none of the above", "d"), ("z", None),
])
def test_option(text, expected):
    assert parse_option(text, ["image 1", "image 2", "image 3", "none of the above"]) == expected


@pytest.mark.parametrize("text, expected", [("three", 3), ("3 dogs", 3), ("zero", 0), ("none", 0), ("many", None)])
def test_number(text, expected):
    assert parse_number(text) == expected


def test_choice_and_boxes():
    assert parse_choice("it is Blue.", ["red", "blue"]) == "blue"
    assert parse_choice("teal", ["red", "blue"]) is None
    assert parse_box("<c0> <c2> <c3> <c3>", 128) == (0.0, 16.0, 32.0, 32.0)
    assert parse_box("[1, 2, 30, 40]", 128) == (1.0, 2.0, 30.0, 40.0)
    assert parse_box("none", 128) == "none"
    assert parse_box("somewhere", 128) is None
    assert box_iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert box_iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert box_iou((0, 0, 0, 0), (0, 0, 0, 0)) == 0.0


@pytest.mark.parametrize("text, expected", [
    ("between 25 and 40", (25, 40)), ("25 to 40 dogs", (25, 40)), ("25-40", (25, 40)), ("3 - 5", (3, 5)),
    ("from three to five", (3, 5)), ("I count 7 dogs", 7), ("3 and 5", 3), ("between 3 and", 3), ("no idea", None),
])
def test_parse_count_reads_a_stated_range_as_one(text, expected):
    from evaluators.answers import parse_count

    assert parse_count(text) == expected


def test_keywords_found_skips_denied_words():
    from evaluators.answers import keywords_found

    assert keywords_found("a fork", ["fork"]) == {"fork"}
    assert keywords_found("there is no fork on the plate", ["fork", "plate"]) == {"plate"}
    assert keywords_found("not a spoon but a fork", ["fork", "spoon"]) == {"fork"}


def test_a_negation_reaches_only_within_its_clause_and_never_a_ground_truth_word():
    from evaluators.answers import keywords_found, parse_count

    assert keywords_found("No. A fork.", ["fork"]) == {"fork"}
    assert keywords_found("No, a fork.", ["fork"]) == {"fork"}
    assert keywords_found("A no entry sign", ["no", "entry", "sign"]) == {"no", "entry", "sign"}
    assert keywords_found("there is no fork", ["fork"]) == set()
    assert parse_count("it is 5 - 1 = 4") == 5  # not a range: its ends are reversed
