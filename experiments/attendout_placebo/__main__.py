"""`python -m experiments.attendout_placebo [report] ...`: the first word picks the part (default: run)."""
import sys

from . import report, run


def main(argv: list[str]) -> int:
    parts = {"report": report.main}
    if argv and argv[0] in parts:
        return parts[argv[0]](argv[1:])
    return run.main(argv)


sys.exit(main(sys.argv[1:]))
