"""Answer extraction: hand-written cases, including the awkward ones."""

import pytest

from evaluators.answers import box_iou, parse_box, parse_choice, parse_number, parse_option, parse_yes_no


@pytest.mark.parametrize("text, expected", [
    ("yes", True), ("Yes.", True), ("Yes, there is a dog.", True), (" yes </s>", True),
    ("no", False), ("No, there isn't.", False), ("Not at all", False), ("NO!", False),
    ("maybe", None), ("", None), ("no, yes", False), ("Yes, though there is no plate.", True),
    # an echoed "yes or no" answers nothing (it had read as its first word, yes: an audit,
    # session 39); colloquial and one-word answers
    ("yes and no", None), ("Yes or no?", None), ("Yes/No", None), ("Yes or no? Yes.", True), ("No / yes", None),
    ("Nope.", False), ("Yep", True), ("None.", None), ("Absent.", False), ("Present.", True),
    ("No doubt, there is a cup.", None), ("Yes - no doubt.", True),
    # denials without "no" (an audit, session 38: these were unreadable, so wrong on Q_a)
    ("There is not a dog in this image.", False), ("There isn't a dog.", False), ("There's not a cup.", False),
    ("I don't see a dog.", False), ("I can't see any dog here.", False), ("The dog is not visible.", False),
    # hedges say neither (they had been read as "no": right on every absent question)
    ("Not sure.", None), ("No idea.", None), ("I'm not sure.", None), ("I can't tell.", None),
    ("Not sure, but yes.", True), ("No idea -- no, there is none.", False),
    # a "not" that denies no existence is not a "no"
    ("The dog is not on the table.", None), ("Yes, though it is not large.", True),
])
def test_yes_no(text, expected):
    assert parse_yes_no(text) is expected if expected is not None else parse_yes_no(text) is None


@pytest.mark.parametrize("text, expected", [
    ("b", "b"), ("B)", "b"), ("(c) image 3", "c"), ("image 2", "b"), ("none of the above", "d"), ("z", None),
])
def test_option(text, expected):
    assert parse_option(text, ["image 1", "image 2", "image 3", "none of the above"]) == expected


@pytest.mark.parametrize("text, expected", [
    ("three", 3), ("3 dogs", 3), ("zero", 0), ("none", 0), ("many", None),
    # compound words and grouped digits had been read as their last word / first group: 1
    ("twenty-one", 21), ("Twenty one people", 21), ("ninety", 90), ("fifteen", 15), ("1,500", 1500),
    ("12,000 birds", 12000), ("3, 4", 3), ("1,50", 1), ("twenty no", 20),
])
def test_number(text, expected):
    assert parse_number(text) == expected


def test_choice_and_boxes():
    assert parse_choice("it is Blue.", ["red", "blue"]) == "blue"
    assert parse_choice("teal", ["red", "blue"]) is None
    assert parse_box("<c0> <c2> <c3> <c3>", 128) == (0.0, 16.0, 32.0, 32.0)
    assert parse_box("[1, 2, 30, 40]", 128) == (1.0, 2.0, 30.0, 40.0)
    assert parse_box("none", 128) == "none"
    assert parse_box("somewhere", 128) is None
    # not boxes: corners out of order, a bin past the 16-bin grid, a JSON box with no area
    assert parse_box("<c9> <c5> <c3> <c12>", 128) is None and parse_box("<c3> <c5> <c16> <c9>", 128) is None
    assert parse_box("<c3> <c3> <c3> <c3>", 128) == (24.0, 24.0, 32.0, 32.0)  # one bin: inclusive end
    assert parse_box("[30, 2, 1, 40]", 128) is None and parse_box("[1, 2, 1, 40]", 128) is None
    assert box_iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert box_iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert box_iou((0, 0, 0, 0), (0, 0, 0, 0)) == 0.0


@pytest.mark.parametrize("text, expected", [
    ("between 25 and 40", (25, 40)), ("25 to 40 dogs", (25, 40)), ("25-40", (25, 40)), ("3 - 5", (3, 5)),
    ("from three to five", (3, 5)), ("I count 7 dogs", 7), ("3 and 5", 3), ("between 3 and", 3), ("no idea", None),
    ("twenty-one to thirty", (21, 30)), ("between 1,000 and 2,000", (1000, 2000)), ("21-25", (21, 25)),
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


@pytest.mark.parametrize("text, expected", [
    ("a fork", "c"),  # an article, not the letter a: the option's text decides
    ("A fork.", "c"), ("a", "a"), ("A.", "a"), ("(a) neither", "a"), ("b) a knife", "b"),
    ("The answer is (B).", "b"), ("answer: c", "c"), ("I think the answer is a fork", "c"),
    ("A\nThe image shows nothing of the kind.", "a"), ("B the knife", "b"), ("I think neither", "a"),
])
def test_option_letters_are_not_articles(text, expected):
    assert parse_option(text, ["neither", "a knife reading a book", "a fork"]) == expected


@pytest.mark.parametrize("text, expected", [
    # forms that had been unreadable, so scored wrong (MIOH audit, session 37)
    ("**B**", "b"), ("`b`", "b"), ("[B]", "b"), ("Option B", "b"), ("option (c): image 3", "c"),
    ("The correct option is B.", "b"), ("The answer is option B.", "b"), ("I think it's B", "b"), ("It is (a).", "a"),
    ("None.", "d"), ("None of them.", "d"), ("Neither", "d"), ("No image contains a cup.", "d"),
    ("In none of the images.", "d"),
    # still unreadable: two options named, a sentence cut off at an article, a number inside another
    ("Neither image 1 nor image 2", None), ("the cup is a", None), ("it is in image 10", None), ("No.", None),
])
def test_option_forms_models_write(text, expected):
    assert parse_option(text, ["image 1", "image 2", "image 3", "none of the above"]) == expected


def test_a_bare_no_is_the_one_option_that_starts_with_no():
    options = ["Yes, in image 1", "Yes, in image 2", "No, in none of them"]
    assert parse_option("No", options) == "c" and parse_option("No.", options) == "c"
    assert parse_option("No", ["no dog", "no cat"]) is None  # two such options: unreadable


def test_choice_skips_denied_mentions_and_contractions_negate():
    from evaluators.answers import keywords_found

    assert parse_choice("It is not green; it is red.", ["green", "red"]) == "red"
    assert parse_choice("It isn't green, it's red", ["green", "red"]) == "red"
    assert parse_choice("not green but red", ["green", "red"]) == "red"
    assert keywords_found("The dog wasn't removed", ["dog", "removed"]) == {"dog"}
    assert keywords_found("it isn't a fork", ["fork"]) == set()
    assert keywords_found("I can't see a fork", ["fork", "see"]) == {"fork"}  # two words back only
    assert keywords_found("The dog was removed", ["dog", "removed"]) == {"dog", "removed"}


def test_counts_read_denials_as_zero_and_a_closing_answer_first():
    from evaluators.query import Query, parse

    def count(text):
        return parse(Query("q", "reactbench", [], "how many fork are there ?", "number", 0), text)

    assert count("There are no forks in the image.") == 0
    assert count("three") == 3
    assert count("Step 1: scan the first row , one fork . Final answer: 9.") == 9
    assert count("I see 2 forks") == 2
    yes_no = Query("q", "reactbench", [], "is there a fork ?", "yes_no", "no")
    assert parse(yes_no, "Yes, a fork could be expected. The answer is no.") is False
    assert parse(yes_no, "The answer is unclear, but yes.") is True  # the tail says nothing: the whole text


@pytest.mark.parametrize("kind, text, expected", [
    # the bare word "answer" is not a closing answer (a reviewer's regressions, each read
    # from the words after it before this fix)
    ("yes_no", "Yes, there is a dog in the image. This answer assumes no occlusion.", True),
    ("yes_no", "No, there is no dog. (You asked me to answer yes or no.)", False),
    ("yes_no", "Is the fork red? Please answer yes or no. No", False),  # the echoed "yes or no" says nothing
    ("yes_no", "Yes, the answer is not obvious but there is a cat.", True),
    ("yes_no", "Yes. The answer could be no if the table were removed.", True),
    ("yes_no", "The answer is yes, there is no doubt.", True),
    ("number", "I count 4 forks. My answer is based on the visible ones; one could be hidden.", 4),
    ("number", "There are three forks; to answer your question, no other utensils.", 3),
    ("number", "Step 1: I see 2 knives. Step 2: there are 5 forks. Final answer: 5", 5),
    ("choice", "Red. The answer might seem yellow but it's red.", "red"),
    ("choice", "Step 1: bananas are usually yellow. Step 2: this one looks red. Final answer: red", "red"),
    ("keywords", "The fork was removed. To answer this, I compared both images.", ["fork", "removed"]),
    ("keywords", "The fork was removed. My answer is based on both images.", ["fork", "removed"]),
    ("option", "B) Image 2. To answer this, I looked at each image; image 1 has a cat.", "b"),
    ("option", "A - the first image", "a"),
])
def test_a_closing_answer_is_read_first_and_the_bare_word_answer_is_not_one(kind, text, expected):
    from evaluators.query import Query, parse

    truth = {"keywords": ["fork", "removed"], "option": "b"}.get(kind)
    options = {"choice": ["red", "yellow"], "option": ["image 1", "image 2", "none of the above"]}.get(kind)
    assert parse(Query("q", "reactbench", [], "p", kind, truth, options=options), text) == expected


@pytest.mark.parametrize("text, subject, expected", [
    # an existence statement about the object asked is a yes (it had been unreadable: a false
    # denial of every present object; an audit, session 39), about another object nothing
    ("There is a small cup in the image.", "cup", True), ("I can see two cups.", "cup", True),
    ("The cup is visible.", "cup", True), ("No doubt, there is a cup.", "cup", True),
    ("There is a cat.", "cup", None), ("There is a small cup in the image.", None, None),
    ("There is a cup next to the plate, but no spoon.", "spoon", False),
    ("There is a cup next to the plate, but no spoon.", "cup", True),  # it had read no
    ("I cannot see it clearly, but there is a cup.", "cup", True),
    ("There is no cup, but there is a plate.", "cup", False), ("There is no cup, but there is a plate.", "plate", True),
    ("I don't see any cup.", "cup", False), ("The cup is not visible.", "cup", False), ("None.", "cup", False),
    ("There isn't a cup.", "cup", False), ("Yes, no cup is visible.", "cup", True),
])
def test_yes_no_reads_what_an_answer_says_of_the_asked_object(text, subject, expected):
    assert parse_yes_no(text, subject=subject) is expected


def test_existence_subject_is_the_last_object_asked_and_none_for_other_questions():
    from evaluators.query import existence_subject

    assert existence_subject("i am sure there is no cup . is there a cup ?") == "cup"
    assert existence_subject("Is there a traffic light in the image?") == "traffic light"
    assert existence_subject("Are there any forks visible?") == "forks"
    assert existence_subject("is the tree green ? answer yes or no .") is None
    assert existence_subject("was the dog removed ?") is None


def test_options_are_not_chosen_where_denied_and_counts_fall_in_interval_options():
    """An audit, session 39: "There is not a fork" chose the option "a fork", and "9" was
    unreadable against "eight to nine"."""
    absurd = ["a fork", "neither", "a knife reading a book"]
    assert parse_option("There is not a fork in the image.", absurd) is None
    assert parse_option("I don't see a fork.", absurd) is None
    assert parse_option("A fork, not a knife reading a book.", absurd) == "a"
    assert parse_option("The banana is not yellow; it is blue.", ["yellow", "blue", "red"]) == "b"
    assert parse_option("No, in none of them", ["Yes, all of them", "Yes, in some of them", "No, in none of them"]) == "c"
    ranges = ["two to three", "eight to nine", "four to five"]
    assert parse_option("9", ranges) == "b" and parse_option("There are 9 bananas.", ranges) == "b"
    assert parse_option("There are 7 bananas.", ranges) is None  # in no option
    assert parse_option("9", ["image 1", "image 2"]) is None  # not ranges


def test_counting_idioms_and_chain_of_thought_final_sentences():
    from evaluators.answers import parse_count
    from evaluators.query import Query, parse

    assert parse_count("Counting them one by one, there are 9 in total.") == 9
    cot = {"mode": "cot"}
    count = Query("q", "reactbench", [], "how many banana are there ?", "number", 9, cot)
    assert parse(count, "The banana are in 2 rows. In total there are 9.") == 9
    assert parse(count, "Row 1 has 3, row 2 has 3, row 3 has 3. So there are 9 bananas.") == 9
    assert parse(count, "There are 9 bananas. I hope this helps.") == 9  # the last sentence says nothing
    standard = Query("q", "reactbench", [], "how many banana are there ?", "number", 9)
    assert parse(standard, "There are 9 bananas. They are in 2 rows.") == 9  # standard mode: the first
    yes_no = Query("q", "reactbench", [], "is there a fork ?", "yes_no", "no", cot)
    assert parse(yes_no, "Is there a knife? Yes, on the left. Is there a fork? No fork is visible. "
                         "So no, there is no fork.") is False


def test_a_premise_colour_is_read_last_and_places_are_not_claims():
    from evaluators.query import Query, parse

    colours = ["green", "white", "red", "yellow"]
    premise = Query("q", "reactbench", [], "what colour is the green tree ?", "choice", "white", options=colours)
    assert parse(premise, "the green tree is white .") == "white"
    assert parse(premise, "it is green .") == "green"
    vocabulary = ["cup", "dog", "knife", "tree", "moved", "removed", "added", "up", "left", "right"]
    moved = Query("q", "reactbench", [], "what changed ?", "keywords", ["cup", "moved", "up"], options=vocabulary)
    assert parse(moved, "in the lower right , the cup moved up") == ["cup", "moved", "up"]
    assert parse(moved, "the cup moved from the right to the left") == ["cup", "left", "moved"]
    added = Query("q", "reactbench", [], "what changed ?", "keywords", ["tree", "added"], options=vocabulary)
    assert parse(added, "a tree was added next to the knife") == ["added", "tree"]
    assert parse(added, "a tree and a knife were added") == ["added", "knife", "tree"]  # still a claim


def test_a_reasoning_models_think_block_is_never_read():
    """Thinking VLMs write their reasoning in a think block before the answer; the reasoning
    weighs yes and no, other counts and boxes on its way. Only what follows it (or GLM-4.1V-
    Thinking's <answer> block) is read; a block the token limit cut off answers nothing."""
    import numpy as np

    from evaluators.answers import after_reasoning
    from evaluators.masks import answer_mask
    from evaluators.query import Query, parse

    yes_no = Query("q", "dobench", [], "is there a dog in the image ?", "yes_no", "yes")
    count = Query("q", "reactbench", [], "how many banana are there ?", "number", 9)
    thought = "<think>No dog at first sight... wait, there is one behind the bench, so no is wrong.</think>\n\nYes."
    assert parse(yes_no, thought) is True
    assert parse(yes_no, "The user asks about a dog. No, I see no dog. Hmm, yes I do.</think>Yes") is True  # opened by the template
    assert parse(yes_no, "◁think▷Is it a dog? No... it is.◁/think▷Yes, there is a dog.") is True  # Kimi-VL
    assert parse(yes_no, "<think>I see no dog</think><answer>Yes</answer>") is True  # GLM-4.1V-Thinking
    assert parse(yes_no, "<think>Let me look. No dog on the left. Now the right") is None  # cut off
    assert parse(count, "<think>3 in row one, 3 in row two, maybe 6 in all</think>There are 9 bananas.") == 9
    assert after_reasoning("Yes, a dog.") == "Yes, a dog."
    mask, invalid = answer_mask("<think>maybe [0, 0, 5, 5]</think>[10, 10, 20, 20]", (32, 32))
    assert not invalid and mask.sum() == 100 and mask[15, 15] and not mask[2, 2]
    mask, invalid = answer_mask("<think>it could be at [0, 0, 5, 5]", (32, 32))
    assert invalid and not np.any(mask)
    from evaluators.benchmarks.causal_halbench.suite import assemble

    (caption,) = assemble([{"objects": ["dog"], "answer": "<think>a cat? a bird?</think>A dog on a bench."}])
    assert caption["caption"] == "A dog on a bench."  # CHAIR reads no object the reasoning named


def test_a_think_block_opened_by_the_chat_template_is_closed_or_unanswered():
    """Thinking models' templates open the think block in the prompt, so the answer holds
    only the closing tag -- or, cut off by the token limit, no tag at all. HFModel puts the
    opening tag back: the organism under such a template (it never closes the block) is
    read as unanswered, not as its reasoning; under its own template nothing changes."""
    import copy

    from evaluators.benchmarks.dobench.suite import build
    from evaluators.model import HFModel, load_hf
    from evaluators.query import parse

    model, processor = load_hf("organism")
    queries = build(n_scenes=1, seed=0)[:3]
    plain = HFModel(model, processor, max_new_tokens=3)(queries)
    thinking = copy.deepcopy(processor)
    thinking.chat_template = processor.chat_template + "{% if add_generation_prompt %} <think>{% endif %}"
    answers = HFModel(model, thinking, max_new_tokens=3)(queries)
    assert all(a.startswith("<think>") for a in answers) and not any(a.startswith("<think>") for a in plain)
    assert [parse(q, a) for q, a in zip(queries, answers)] == [None] * 3
    assert all(parse(q, a) is not None for q, a in zip(queries, plain))
