"""Timed comparisons of the mitigations against plain ``generate()`` (see ``conftest.py``)."""
