"""A coordinator installed without the privacy extra (`pip install trellis-fgl`: no dp-accounting,
no scipy) serves plans without privacy, and refuses a private plan in one line naming the extra.

Each test runs the real `coordinator` command line in its own process, with dp-accounting made
unimportable the way Python marks a package as absent (``sys.modules[name] = None``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from trellis.crypto.pki import init_ca

EXTRA = "pip install 'trellis-fgl[privacy]'"
PLAN = ('[federation]\nid = "f"\nalgorithm = "fedstar"\nrounds = 2\nsilos = ["a", "b", "c"]\n'
        '[server]\nlisten = "127.0.0.1:0"\n')


def _without_dp_accounting(*argv: str) -> subprocess.CompletedProcess[str]:
    script = ("import sys; sys.modules['dp_accounting'] = None\n"
              f"sys.argv = ['coordinator', *{list(argv)!r}]\n"
              "from trellis.coordinator.cli import main; main()\n")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)


def _workspace(tmp_path: Path, privacy: str) -> Path:
    init_ca(tmp_path / "ca", ["localhost", "127.0.0.1"])   # a real server identity to serve with
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN + privacy)
    return plan


def test_serving_a_private_plan_without_the_extra_is_one_line_naming_it(tmp_path: Path) -> None:
    plan = _workspace(tmp_path, '[privacy]\nmechanism = "local-gaussian"\n'
                                'noise_multiplier = 1.0\ndesign_graphs = 100\n')
    done = _without_dp_accounting("serve", "--plan", str(plan))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
    assert EXTRA in done.stderr and "private" in done.stderr
    assert not (tmp_path / "state").exists()     # refused before anything was written


def test_a_private_plan_calibrated_to_epsilon_names_the_extra(tmp_path: Path) -> None:
    # noise_multiplier left at 0: the plan's loading calibrates it, which needs the accountant.
    plan = _workspace(tmp_path, '[privacy]\nmechanism = "local-gaussian"\nepsilon = 4.0\n'
                                'design_graphs = 100\n')
    done = _without_dp_accounting("serve", "--plan", str(plan))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert EXTRA in done.stderr and "privacy.epsilon" in done.stderr


def test_a_plan_without_privacy_needs_no_accountant(tmp_path: Path) -> None:
    plan = _workspace(tmp_path, "")
    script = ("import sys; sys.modules['dp_accounting'] = None\n"
              "from pathlib import Path\n"
              "from trellis.coordinator.cli.common import load_plan_or_exit\n"
              "from trellis.coordinator.serving import service  # noqa: F401\n"
              f"print(load_plan_or_exit(Path({str(plan)!r})).federation)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "f\n"
