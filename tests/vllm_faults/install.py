"""Install the planted-fault vLLM plugins (tests/vllm_faults/eagleflow_vllm_faults.py) into a directory of
their own, as pip would a wheel: the module and a dist-info whose entry points vLLM finds
(`vllm.general_plugins`). An engine sees them only with that directory on its PYTHONPATH.

    python tests/vllm_faults/install.py DIR     (prints DIR)
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLUGINS = {
    "eagleflow_fault_shift_aux": "eagleflow_vllm_faults:shift_aux",
    "eagleflow_fault_verify": "eagleflow_vllm_faults:corrupt_verify",
}


def install(target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HERE / "eagleflow_vllm_faults.py", target / "eagleflow_vllm_faults.py")
    info = target / "eagleflow_vllm_faults-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: eagleflow-vllm-faults\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\n" + "".join(f"{name} = {ref}\n" for name, ref in PLUGINS.items())
    )
    (info / "top_level.txt").write_text("eagleflow_vllm_faults\n")
    return target


if __name__ == "__main__":
    print(install(Path(sys.argv[1])))
