"""fastnorm's developer tools for a GPU machine, one command each (`--help` lists them, with their purpose):
timings of fixed shapes, A/B runs of planner overrides and environment switches, and single runs of kernel
paths for compute-sanitizer and ncu. Shared set-up and timing live in fastnorm_dev/measure.py.

Usage: python benchmarks/devtool.py COMMAND [ARGS...]   (fastnorm importable: installed, or PYTHONPATH=src)
"""
import argparse
import sys

from fastnorm_dev import kernel_runs, overrides, timing  # beside this file: on sys.path when run as a script

COMMANDS = {c.name: c for module in (timing, overrides, kernel_runs) for c in module.COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="devtool.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in COMMANDS.values():
        parser = sub.add_parser(command.name, help=command.purpose.replace("%", "%%"), description=command.purpose,
                                epilog=f"example: {command.example}")
        if command.configure is not None:
            command.configure(parser)
        parser.set_defaults(run=command.run)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # What follows `--` is handed to the command as is (`ab`'s shapes), the same on every Python version.
    rest = []
    if "--" in argv:
        split = argv.index("--")
        argv, rest = argv[:split], argv[split + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    if rest and not getattr(args, "takes_rest", False):
        parser.error(f"{args.command} takes no arguments after --")
    args.rest = rest
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
