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
    """Run protoc (bundled with grpcio-tools) on federation.proto into out_dir."""
    import shutil

    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        # The proto is compiled from a trellis/protos/ tree so that the generated code imports
        # `from trellis.protos import ...`, the installed name of this folder.
        source = Path(tmp) / "src"
        (source / "trellis" / "protos").mkdir(parents=True)
        shutil.copy(HERE / "federation.proto", source / "trellis" / "protos")
        built = Path(tmp) / "out"
        built.mkdir()
        args = ["protoc", f"-I{source}", f"--python_out={built}", f"--pyi_out={built}",
                f"--grpc_python_out={built}",
                str(source / "trellis" / "protos" / "federation.proto")]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in GENERATED:
            shutil.copy(built / "trellis" / "protos" / name, out_dir / name)


def stale_files(folder: Path = HERE) -> list[str]:
    """Names of generated files in folder that differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        return [name for name in GENERATED
                if not (folder / name).exists()
                or not filecmp.cmp(Path(tmp) / name, folder / name, shallow=False)]


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
    generate(HERE)


if __name__ == "__main__":
    main()
