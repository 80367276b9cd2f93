"""Regenerate the Python code for protos/federation.proto (``make protos``).

With ``--check`` it regenerates into a temporary folder and fails if the committed files differ,
so stale generated code cannot go unnoticed.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GENERATED = ("federation_pb2.py", "federation_pb2_grpc.py", "federation_pb2.pyi")


def generate(out_dir: Path) -> None:
    """Run protoc (bundled with grpcio-tools) on federation.proto into out_dir/protos."""
    from grpc_tools import protoc

    target = out_dir / "protos"
    target.mkdir(parents=True, exist_ok=True)
    # Import paths are rooted at the repository so the generated code says `from protos import`.
    args = ["protoc", f"-I{HERE.parent}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}", str(HERE / "federation.proto")]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def stale_files(folder: Path = HERE) -> list[str]:
    """Names of generated files in folder that differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        return [name for name in GENERATED
                if not (folder / name).exists()
                or not filecmp.cmp(Path(tmp) / "protos" / name, folder / name, shallow=False)]


def main() -> None:
    """Entry point: regenerate, or check with --check."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    if parser.parse_args().check:
        stale = stale_files()
        if stale:
            sys.exit("generated code is stale, run `make protos`: " + ", ".join(stale))
        print("generated code is up to date")
        return
    generate(HERE.parent)


if __name__ == "__main__":
    main()
