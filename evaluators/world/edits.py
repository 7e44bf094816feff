"""Exact interventions on a scene: each returns a new :class:`Scene` whose rendering and
annotations follow from the edit, with nothing else changed (same seed, so the same
background texture shows through where an object was)."""

from __future__ import annotations

from .scene import MIN_SIDE, Obj, Scene, aspect, min_size
from .vocab import CATEGORIES, check_category, check_colour


def _require(scene: Scene, uid: int, seen: bool = False) -> Obj:
    """Object ``uid`` of ``scene``; with ``seen``, one with a visible pixel: removing,
    recolouring or replacing an object that later ones cover entirely changes no pixel, so
    the "edited" image would be the original's."""
    if not isinstance(scene, Scene):
        raise ValueError(f"scene must be a Scene, got {type(scene).__name__}")
    obj = scene.get(uid)  # raises ValueError naming the uid
    if seen and all(o.uid != uid for o in scene.visible()):
        raise ValueError(f"uid: object {uid} is hidden (covered by later objects or off the image); editing it "
                         "would change no pixel")
    return obj


def remove(scene: Scene, uid: int) -> Scene:
    """The scene without object ``uid`` (a visible one); the background shows through."""
    _require(scene, uid, seen=True)
    return scene.with_objects(o for o in scene.objects if o.uid != uid)


def remove_category(scene: Scene, category: str) -> Scene:
    """The scene without any instance of ``category`` (which must be present)."""
    if not isinstance(scene, Scene):
        raise ValueError(f"scene must be a Scene, got {type(scene).__name__}")
    check_category(category)
    if not scene.present(category):
        raise ValueError(f"category: {category!r} is not in the scene, nothing to remove")
    return scene.with_objects(o for o in scene.objects if o.category != category)


def replace(scene: Scene, uid: int, category: str, *, colour: str | None = None) -> Scene:
    """Object ``uid`` becomes ``category`` in the same place and size (HalluSegBench's pair):
    the same centre, and the largest box of the new shape that fits in the old box.

    Shapes differ in aspect (a knife is a flat bar, a dog a square), so keeping the size
    number would grow a knife's 1 x 0.38 box into a square 2.6 times as tall, reaching
    out of the image or over a neighbour: the pair would then differ in more than the one
    object. Inside the old box it cannot. The colour is kept unless given. Replacing with
    the same category, or with one whose box there would be under MIN_SIDE on a side
    (:func:`can_replace`), is an error.
    """
    obj = _require(scene, uid, seen=True)
    check_category(category)
    if category == obj.category:
        raise ValueError(f"category: object {uid} already is a {category!r}")
    if not can_replace(obj, category):
        x0, y0, x1, y1 = obj.box
        raise ValueError(f"category: a {category!r} inside object {uid}'s {x1 - x0:.1f} x {y1 - y0:.1f} px box "
                         f"would be under {MIN_SIDE:g} px on a side")
    new = obj.replace(category=category, size=replaced_size(obj, category),
                      colour=obj.colour if colour is None else check_colour(colour))
    return scene.with_objects(new if o.uid == uid else o for o in scene.objects)


def replaced_size(obj: Obj, category: str) -> float:
    """The size :func:`replace` gives ``category`` in ``obj``'s place: that of its shape's
    largest box inside ``obj``'s box."""
    (ow, oh), (nw, nh) = aspect(obj.shape), aspect(CATEGORIES[check_category(category)])
    return obj.size * min(ow / nw, oh / nh)


def can_replace(obj: Obj, category: str) -> bool:
    """Whether :func:`replace` can put ``category`` in ``obj``'s place: another category whose
    box there is at least :data:`~evaluators.world.scene.MIN_SIDE` on each side (a bar in a
    small bar's box can be thinner)."""
    return category != obj.category and replaced_size(obj, category) >= min_size(CATEGORIES[category])


def recolour(scene: Scene, uid: int, colour: str) -> Scene:
    """Object ``uid`` (a visible one) in another colour (a counterfactual attribute)."""
    obj = _require(scene, uid, seen=True)
    check_colour(colour)
    if colour == obj.colour:
        raise ValueError(f"colour: object {uid} already is {colour!r}")
    return scene.with_objects(obj.replace(colour=colour) if o.uid == uid else o for o in scene.objects)


def move(scene: Scene, uid: int, cx: float, cy: float) -> Scene:
    """Object ``uid`` moved to centre ``(cx, cy)``; it must stay inside the image."""
    obj = _require(scene, uid)
    moved = Obj(obj.uid, obj.category, obj.colour, cx, cy, obj.size)  # checks cx, cy are finite numbers
    x0, y0, x1, y1 = moved.box
    if x0 < 0 or y0 < 0 or x1 > scene.resolution or y1 > scene.resolution:
        raise ValueError(f"cx, cy: ({cx}, {cy}) puts object {uid} outside the {scene.resolution}px image")
    return scene.with_objects(moved if o.uid == uid else o for o in scene.objects)


def add(scene: Scene, obj: Obj) -> Scene:
    """The scene with ``obj`` added on top (its uid must be new)."""
    if not isinstance(scene, Scene):
        raise ValueError(f"scene must be a Scene, got {type(scene).__name__}")
    if not isinstance(obj, Obj):
        raise ValueError(f"obj must be an Obj, got {type(obj).__name__}")
    if any(o.uid == obj.uid for o in scene.objects):
        raise ValueError(f"obj: uid {obj.uid} already used in the scene")
    x0, y0, x1, y1 = obj.box
    if x0 < 0 or y0 < 0 or x1 > scene.resolution or y1 > scene.resolution:
        raise ValueError(f"obj: box {obj.box} is outside the {scene.resolution}px image")
    return scene.with_objects((*scene.objects, obj))
