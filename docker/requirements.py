"""Print the project's runtime requirements from pyproject.toml, one per line (Docker build).

    python requirements.py pyproject.toml [--with-ray]

Without ``--with-ray``, ``flwr[simulation]`` becomes plain ``flwr``: the deployed roles run
Flower's SuperLink/SuperNode and never its Ray-based simulation engine. The ``client`` extra's
requirements are included (the image serves every role).
"""

import sys
import tomllib


def main(argv: list[str]) -> int:
    project = tomllib.loads(open(argv[0], encoding="utf-8").read())["project"]
    deps = list(project["dependencies"])
    deps += list(project.get("optional-dependencies", {}).get("client", []))
    for dep in deps:
        compact = dep.replace(" ", "")
        if "--with-ray" not in argv and compact.startswith("flwr[simulation]"):
            dep = "flwr" + compact[len("flwr[simulation]"):]
        print(dep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
