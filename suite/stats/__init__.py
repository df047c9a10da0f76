"""Statistical procedures of the suite, free of report formatting.

  cochran_cox.py the t reference distribution of a variance with a seed part and a dev-example part
  evidence.py    one comparison over seeds and dev examples: interval, test, equivalence (TOST), verdict; the same
                 on a benchmark average; the bootstrap seed of each comparison (`bootstrap_seed`)
  examples.py    the dev-example part of the variance (bootstrap over the per-example predictions)
  power.py       power, seeds needed and detectable differences from a comparison's own variance
  families.py    primary (Holm) and exploratory (Benjamini-Hochberg) families of comparisons
  collapse.py    runs below a declared floor: rates per method, medians where outcomes are bimodal
  constant.py    whether a cell beats the constant (majority-class / constant-mean) predictor
  aso.py         almost stochastic order, where a comparison's outcomes are bimodal
  curves.py      the data-efficiency table's tests (each size of a curve against the reference), one family
  sequential.py  group-sequential looks for adding seeds until decided
  evp.py         expected validation performance: the expected best tuning score of k configurations drawn
"""
