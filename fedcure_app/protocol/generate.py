"""Regenerate the Python stubs of ``cloud.proto`` with grpcio-tools.

    python -m fedcure_app.protocol.generate          # rewrite cloud_pb2.py, cloud_pb2_grpc.py, .pyi
    python -m fedcure_app.protocol.generate --check  # exit 1 when the committed stubs are stale

The proto is compiled with the repository root as include path, so its descriptor is registered
as ``fedcure_app/protocol/cloud.proto`` (no clash with other ``cloud.proto`` files in the same
process), and the ``import ... cloud_pb2`` line grpcio-tools writes into ``cloud_pb2_grpc.py`` is
rewritten to the package-relative ``from . import cloud_pb2``.

The generated code checks the runtime at import: it needs protobuf >= the protoc version of the
grpcio-tools used here (same major) and grpcio >= that grpcio-tools version.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROTO = HERE / "cloud.proto"
OUTPUTS = ("cloud_pb2.py", "cloud_pb2_grpc.py", "cloud_pb2.pyi")

_ABS_IMPORT = re.compile(r"^from fedcure_app\.protocol import cloud_pb2 as (\w+)$", re.M)


def generate(out_dir: Path) -> list[Path]:
    """Compile ``cloud.proto`` into ``out_dir``; return the three generated files."""
    try:
        from grpc_tools import protoc
    except ImportError:  # pragma: no cover
        raise SystemExit("grpcio-tools is not installed: pip install grpcio-tools") from None
    import importlib.resources

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{ROOT}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(PROTO.relative_to(ROOT)),
        ]
        code = protoc.main(args)
        if code != 0:
            raise SystemExit(f"protoc failed with exit code {code}")
        gen = Path(tmp) / "fedcure_app" / "protocol"
        grpc_file = gen / "cloud_pb2_grpc.py"
        text, n = _ABS_IMPORT.subn(r"from . import cloud_pb2 as \1", grpc_file.read_text())
        if n != 1:
            raise SystemExit("could not find the cloud_pb2 import to make package-relative")
        grpc_file.write_text(text)
        out_dir.mkdir(parents=True, exist_ok=True)
        out = []
        for name in OUTPUTS:
            shutil.copyfile(gen / name, out_dir / name)
            out.append(out_dir / name)
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 when the committed stubs differ")
    args = parser.parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            stale = [p.name for p in generate(Path(tmp))
                     if not (HERE / p.name).is_file()
                     or p.read_bytes() != (HERE / p.name).read_bytes()]
        if stale:
            print(f"stale generated stubs: {', '.join(stale)}; "
                  "run python -m fedcure_app.protocol.generate", file=sys.stderr)
            return 1
        print("generated stubs are up to date")
        return 0
    for p in generate(HERE):
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
