"""Every example runs, so none can rot."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


NEEDS_ORGANISM = {"vcd.py", "prior_suppression.py", "crop_verify.py", "compose.py", "user_data.py"}  # default model: the trained organism


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_example_runs(script):
    from evaluators.organism import ORGANISM_DIR

    if script in NEEDS_ORGANISM and not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("the organism checkpoint is not trained yet")
    result = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
