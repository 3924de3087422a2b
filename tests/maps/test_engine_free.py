from __future__ import annotations

import subprocess
import sys


def test_maps_calibration_and_models_never_import_sglang():
    code = (
        "import sys; import sgl_ridgefill.maps, sgl_ridgefill.calibration, sgl_ridgefill.models; "
        "from sgl_ridgefill.calibration import pipeline, statpass, solve, stats, corpus, capture; "
        "bad = sorted(m for m in sys.modules if m == 'sglang' or m.startswith('sglang.')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
