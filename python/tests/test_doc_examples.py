"""The Python README's examples are complete programs (issue 12, item 6):
``examples/python/quickstart_*.py``, the same text as the README blocks (checked by
``scripts/check_doc_examples.py``), run here on the embedded store and checked by
their output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _examples() -> Path:
    env = os.environ.get("MWS_EXAMPLES_DIR")
    d = Path(env) if env else Path(__file__).resolve().parents[2] / "examples" / "python"
    assert (d / "quickstart_state_dict.py").is_file(), f"examples not found in {d} (set MWS_EXAMPLES_DIR)"
    return d


@pytest.mark.parametrize("name, expect", [
    ("quickstart_state_dict.py", "TP rank 1/2: every shard matches"),
    ("quickstart_low_level.py", "every byte matches"),
    ("quickstart_live_state_dict.py", "generation 3: 16512 bytes, every server tensor matches"),
])
def test_readme_example_runs(name, expect, tmp_path):
    r = subprocess.run([sys.executable, str(_examples() / name)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert expect in r.stdout, r.stdout
