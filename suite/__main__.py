"""python -m suite: fine-tune encoders with attention methods over grids of tasks and seeds, and report.

  python -m suite list
  python -m suite run --methods vanilla,scores_dropout,uniform --tasks rte,mrpc --data-dir ../shared/data/glue
  python -m suite run --methods 'scores_*' --tasks glue --seeds 1,2,3,4,5 --sweep scores_dropout.p=0.1,0.2,0.3
  python -m suite run --preset paper --methods all --tasks glue          # bert-base + roberta-base, needs the hub
"""
import sys
from pathlib import Path

import suite


def shadowed_by() -> str | None:
    """The folder that `import suite` found instead of the package, or None. A folder named `suite` without an
    `__init__.py` in the current directory (the parent of a clone named `suite`) is imported as a namespace package,
    before an editable install's package; this module itself still comes from the installed package."""
    if getattr(suite, "__file__", None) is not None:
        return None
    return next(iter(getattr(suite, "__path__", [])), "suite")


if __name__ == "__main__":
    if (folder := shadowed_by()) is not None:
        root = Path(__file__).resolve().parents[1]  # an editable install's checkout
        hint = f", e.g. the project root: cd {root}" if (root / "pyproject.toml").is_file() else ""
        print(f"python -m suite: the folder {folder} is not the suite package and hides it; run from another "
              f"folder{hint}", file=sys.stderr)
        raise SystemExit(2)
    from suite.commands import main

    raise SystemExit(main())
