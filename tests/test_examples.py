"""Every example runs, so none can rot."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


NEEDS_ORGANISM = {"vcd.py", "prior_suppression.py", "crop_verify.py", "compose.py", "user_data.py", "judge.py",
                  "custom_mitigation.py"}  # default model: the trained organism


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_example_runs(script):
    from evaluators.organism import ORGANISM_DIR

    if script in NEEDS_ORGANISM and not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("the organism checkpoint is not trained yet")
    result = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_user_data_example_cleans_up_unless_given_an_output_folder(tmp_path):
    """Its stand-in data and run go to a temporary folder that is deleted at the end (each run
    left a /tmp/user_data_* folder of images behind); with --output_path both are kept there."""
    import os

    from evaluators.organism import ORGANISM_DIR

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("the organism checkpoint is not trained yet")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    result = subprocess.run([sys.executable, str(EXAMPLES / "user_data.py")], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "dobench: accuracy=" in result.stdout
    assert not list(scratch.glob("user_data_*")), "the temporary folder was left behind"
    kept = tmp_path / "kept"
    result = subprocess.run([sys.executable, str(EXAMPLES / "user_data.py"), "--output_path", str(kept)],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (kept / "results.json").exists() and (kept / "data" / "dobench.jsonl").exists()
    assert list((kept / "data").glob("*.png"))
    assert not list(scratch.glob("user_data_*"))
