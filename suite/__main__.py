"""python -m suite: fine-tune encoders with attention methods over grids of tasks and seeds, and report.

  python -m suite list
  python -m suite run --methods vanilla,scores_dropout,uniform --tasks rte,mrpc --data-dir ../shared/data/glue
  python -m suite run --methods 'scores_*' --tasks glue --seeds 1,2,3,4,5 --sweep scores_dropout.p=0.1,0.2,0.3
  python -m suite run --preset paper --methods all --tasks glue          # bert-base + roberta-base, needs the hub
"""
from suite.commands import main

if __name__ == "__main__":
    raise SystemExit(main())
