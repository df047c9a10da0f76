"""`python -m lab.attendout PART ...`: the first word picks the part, one of report, longhorizon,
longhorizon-report, reassess, information, information-report, decisive, decisive-report, decisive-power,
placebo-log, placebo-log-report (default: run, the placebo experiment)."""
import sys

from . import (
    decisive,
    decisive_report,
    information,
    longhorizon,
    longhorizon_report,
    placebo_log,
    reassess,
    report,
    run,
)


def main(argv: list[str]) -> int:
    parts = {"report": report.main, "longhorizon": longhorizon.main,
             "longhorizon-report": longhorizon_report.main, "reassess": reassess.main,
             "information": information.main, "information-report": information.report_main,
             "decisive": decisive.main, "decisive-report": decisive_report.main,
             "decisive-power": decisive_report.power_main,
             "placebo-log": placebo_log.main, "placebo-log-report": placebo_log.report_main}
    if argv and argv[0] in parts:
        return parts[argv[0]](argv[1:])
    return run.main(argv)


sys.exit(main(sys.argv[1:]))
