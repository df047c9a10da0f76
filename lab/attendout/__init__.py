"""The AttendOut placebo experiment: does G learn anything from its reward? Run from the repository root:

    python -m lab.attendout --data-dir /work/shared/data/glue     # real reward vs placebo (`run`)
    python -m lab.attendout longhorizon --data-dir ...           # real vs placebo vs planted
    python -m lab.attendout report lab/attendout/results/placebo     # re-render a report

Modules: `common` (data, policy probe, mask draws and rewards), `run` (the placebo experiment), `accumulated` (the
reward summed over k steps), `report` (verdict, markdown, figure), `planted` (the positive control: a planted
reward, in place of the real one or added on top of it), `longhorizon` (thousands of G updates, a g_lr sweep),
`information` (the reward's information offline), `decisive` / `decisive_report` (the pre-registered designs of
lab/attendout/results/decisive: runs, tests, power) and `placebo_log` (what the designs' logged correlation of the
reward with a layer's drop share is made of, at K = 1 and K = 8 on the same steps). Tests: lab/attendout/tests.
"""
