"""Where the tests find the repository and the papers' datasets (beside the checkout)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
TU_ROOT = SHARED_DATA / "tu"
HETERO_ROOT = SHARED_DATA / "hetero"
