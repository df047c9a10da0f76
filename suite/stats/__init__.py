"""Statistical procedures of the suite, free of report formatting.

  cochran_cox.py the t reference distribution of a variance with a seed part and a dev-example part
  evidence.py    one comparison over seeds and dev examples: interval, test, equivalence (TOST), verdict, the
                 Bayesian P(Δ within ±m), the collapse endpoint; the same on a benchmark average; the bootstrap seed
                 of each comparison (`bootstrap_seed`)
  examples.py    the dev-set part of the variance all seeds share (jackknife over the per-example predictions)
  power.py       power, seeds needed and detectable differences from a comparison's own variance
  families.py    primary (Holm) and exploratory (Benjamini-Hochberg) families of comparisons
  collapse.py    degenerate runs by behaviour and McNemar's test of their rates; runs below a declared floor
  design_power.py  each verdict's probability before a study runs (`suite plan`)
  constant.py    whether a cell beats the constant (majority-class / constant-mean) predictor
  aso.py         almost stochastic order, where a comparison's outcomes are bimodal
  curves.py      the data-efficiency table's tests (each size of a curve against the reference), one family
  sequential.py  group-sequential looks for adding seeds until decided, futility by predictive power
  looks.py       one look of that design at a comparison's runs (the loop takes it, the report replays it)
  evp.py         expected validation performance: the expected best tuning score of k configurations drawn
  report_options.py  the report's options (`ReportOptions`: reference, level, correction, primary family, margin,
                 collapse floor, ...), each declared once; below both the grid and the report, which read them
"""
