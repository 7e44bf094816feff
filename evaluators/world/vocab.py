"""The world's vocabulary: object categories (each drawn as its own shape), colours and
scene contexts. Plain data; the knobs that bias a world live in :mod:`.generator`."""

from __future__ import annotations

# category -> shape drawn for it (see scene._draw_shape). Names read like COCO objects so
# probes read naturally ("Is there a fork in the image?"); the shapes make them learnable
# by a tiny vision encoder at 32x32 input.
CATEGORIES: dict[str, str] = {
    "cup": "square",
    "plate": "ring",
    "fork": "vbar",
    "knife": "hbar",
    "banana": "inv_triangle",
    "tree": "triangle",
    "dog": "diamond",
    "ball": "circle",
    "bench": "frame",
    "bird": "plus",
}

# category -> surface pattern (a darker shade of the object's colour on pattern pixels), so a
# category is recognisable from any fragment of its surface, as real objects are from their
# texture; the period is a few source pixels, so small objects blur it away after resizing.
PATTERNS: dict[str, str] = {
    "cup": "solid",
    "plate": "hstripes",
    "fork": "vstripes",
    "knife": "checker",
    "banana": "diagonal",
    "tree": "dots",
    "dog": "antidiagonal",
    "ball": "grid",
    "bench": "bigchecker",
    "bird": "rings",
}

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 210, 30),
    "white": (250, 250, 250),
    "purple": (150, 60, 190),
    "black": (20, 20, 20),
}

# context -> background colour. The context is a scene-level prior: which objects are typical.
CONTEXTS: dict[str, tuple[int, int, int]] = {
    "kitchen": (205, 185, 150),
    "park": (150, 190, 140),
}

# context -> the categories typical of it (a scene-level prior the biased world uses; probes
# pick "expected" and "out-of-context" objects from it)
CONTEXT_CATEGORIES: dict[str, tuple[str, ...]] = {
    "kitchen": ("cup", "plate", "fork", "knife", "banana"),
    "park": ("tree", "dog", "ball", "bench", "bird"),
}

# Synonyms, for answer parsing and CHAIR-style caption scoring.
SYNONYMS: dict[str, tuple[str, ...]] = {
    "cup": ("cup", "cups", "mug", "mugs"),
    "plate": ("plate", "plates", "dish", "dishes"),
    "fork": ("fork", "forks"),
    "knife": ("knife", "knives"),
    "banana": ("banana", "bananas"),
    "tree": ("tree", "trees"),
    "dog": ("dog", "dogs", "puppy"),
    "ball": ("ball", "balls"),
    "bench": ("bench", "benches"),
    "bird": ("bird", "birds"),
}

# Reasoning descriptions, for HalluSegBench's reasoning split (Sec. 3: queries that name an
# object by what it is for, e.g. "item used for watering plants"; the counterfactual query
# swaps in the replacing class's description). One per category, each true of that
# category only within this vocabulary.
REASONING: dict[str, str] = {
    "cup": "something you drink from",
    "plate": "something food is served on",
    "fork": "something with prongs to pick up food",
    "knife": "something with a blade to cut food",
    "banana": "a fruit you peel before eating",
    "tree": "something with leaves and a trunk",
    "dog": "an animal that barks",
    "ball": "something you throw and catch",
    "bench": "a seat in a park",
    "bird": "an animal with wings and feathers",
}

RELATIONS = ("left of", "right of", "above", "below")


def check_category(category: str, argument: str = "category") -> str:
    if category not in CATEGORIES:
        raise ValueError(f"{argument}: unknown category {category!r}; known: {sorted(CATEGORIES)}")
    return category


def check_colour(colour: str, argument: str = "colour") -> str:
    if colour not in COLOURS:
        raise ValueError(f"{argument}: unknown colour {colour!r}; known: {sorted(COLOURS)}")
    return colour


def check_context(context: str, argument: str = "context") -> str:
    if context not in CONTEXTS:
        raise ValueError(f"{argument}: unknown context {context!r}; known: {sorted(CONTEXTS)}")
    return context
