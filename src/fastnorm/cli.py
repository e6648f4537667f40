"""`fastnorm` command line: bench (the main job), eval, solve.

Each subcommand lives with its concept and exposes `main(argv) -> int`; this file only routes.
"""
import sys

_COMMANDS = {
    "bench": ("fastnorm.bench.cli", "time fastnorm against PyTorch eager, torch.compile and a device copy"),
    "eval": ("fastnorm.harness.cli", "build, verify and time KernelBench-style ModelNew candidates"),
    "solve": ("fastnorm.solve.cli", "turn a reference problem file into a verified single-file ModelNew"),
}


def _usage() -> str:
    lines = ["usage: fastnorm COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<6} {help_}" for name, (_, help_) in _COMMANDS.items()]
    lines += ["", "`fastnorm COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in _COMMANDS:
        print(f"fastnorm: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    import importlib

    module = importlib.import_module(_COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
