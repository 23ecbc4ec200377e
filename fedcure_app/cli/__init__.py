"""The ``fedcure`` command line: one sub-command per module in this package.

Each sub-command module exposes ``register(subparsers)``, which adds its parser and sets
``func(args) -> int`` as the handler. A user's mistake (:class:`~fedcure_app.cli.errors.UsageError`,
a configuration or dataset error, a file that cannot be read or written) is one line on stderr
naming the option or configuration key at fault, and exit code 2; ``--help`` pages show the
defaults (:class:`~fedcure_app.cli.errors.HelpFormatter`). Modules are imported only when listed here, and import their
heavy dependencies (torch, flwr) inside the handler, so ``fedcure form`` starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from fedcure_app.cli.errors import Parser
from fedcure_app.config import ConfigError

#: Sub-command modules, in the order ``fedcure --help`` lists them.
SUBCOMMANDS: tuple[str, ...] = ("form", "data", "task", "simulate", "launch", "testbed",
                                 "model", "certs", "experiment")


class VersionAction(argparse.Action):
    """``--version``: FedCure's version, the installed Flower's and whether the fast path is on
    (:func:`fedcure_app.flower.fastpath.gate.summary`), then exit."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: None = None, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        from fedcure_app.flower.fastpath.gate import summary

        try:
            own = version("fedcure")
        except PackageNotFoundError:
            own = "(not installed)"
        print(f"fedcure {own}\n{summary()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="fedcure",
        description="FedCure: semi-asynchronous hierarchical federated learning on Flower.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument("--version", action=VersionAction,
                        help="print FedCure's and Flower's versions and whether the fast path "
                             "is on, then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"fedcure_app.cli.{name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    from fedcure_app.data.model_consent import trust_working_folder

    trust_working_folder()  # every command's task is the user's own file
    try:
        return int(args.func(args) or 0)
    except (ConfigError, ValueError, OSError) as err:
        text = " ".join(str(err).split()) or type(err).__name__
        print(f"fedcure {args.command}: error: {text}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fedcure {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
