"""MIOH has no public release: one JSON Lines record per multi-image question (Sec. 4:
four object-centric tasks, three question types, difficulty conditions Easy / HN / HP,
number of images 2/4/8/10, linguistic context LC-S / LC-I)."""

from ...schema import Field, load_jsonl

SCHEMA = (
    Field("id", (str, int), doc="unique question id"),
    Field("task", str, choices=("existence", "counting", "attribute", "position"), doc="object-centric task"),
    Field("question_type", str, choices=("comprehensive", "comparative", "selective"), doc="question type"),
    Field("condition", str, choices=("easy", "HN", "HP", "NI", "LC-S", "LC-I"),
          doc="Easy, hard negative, hard positive, number-of-images, sycophantic or instructional context"),
    Field("images", list, images=True, doc="the image set, in order (Image 1, Image 2, ...)"),
    Field("question", str, doc="the question, any linguistic context included"),
    Field("options", list, doc="option texts, in letter order (the last is often 'None of the above')"),
    Field("answer", str, doc="the correct option letter"),
    Field("per_image_answers", list, optional=True,
          doc="ground truth per image, kept for your own §5.5 analysis (decomposed_accuracy): the "
              "runner asks no decomposed questions of user data (it would need each question's object), "
              "and says so when the field is given"),
)


def load(path, image_root=None):
    return load_jsonl(path, SCHEMA, image_root)
