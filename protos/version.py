"""Which Trellis this is: the package version and the protocol it speaks (for --version)."""

from __future__ import annotations

import platform
from importlib import metadata

from trellis.protos.messages import PROTOCOL_VERSION


def package_version() -> str:
    """The installed trellis-fgl version ("unknown" when run from an uninstalled tree)."""
    try:
        return metadata.version("trellis-fgl")
    except metadata.PackageNotFoundError:
        return "unknown"


def version_line(command: str) -> str:
    """One line for `<command> --version`: package, protocol and Python versions."""
    return (f"{command} {package_version()} (trellis-fgl; protocol {PROTOCOL_VERSION}; "
            f"python {platform.python_version()})")
