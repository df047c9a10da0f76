"""What `python -m suite bench` measures: training-step time and peak memory of every attention method against vanilla
attention.

What one measurement is: a training step as the runner takes it (`AttentionMethod.training_step`, or the method's own
`training_step`, e.g. AttendOut's), on a random-init model of the chosen shape, in train mode (dropout on), with the
model's loss on random labels. The optimizer is a no-op SGD (its param groups exist, its `step` changes nothing) and
gradient clipping is off, so a step is forward + backward (+ a method's auxiliary loss, + whatever extra work its own
training step does, such as AttendOut's look-ahead passes and generator update); the AdamW update, the same for every
method, does not dilute the ratios. Batches have no padding unless `--padding` is given.

Baselines, both stock transformers with attention-probability dropout at the config's rate (0.1):
  [sdpa]   transformers' fused `scaled_dot_product_attention` path, the default BERT/RoBERTa attention;
  [eager]  transformers' own eager attention (explicit matmul, softmax, dropout, matmul): the reference for methods
           that must materialise the probabilities. It is independent of the suite's code.
The suite's `vanilla` row (its SDPA path) should read about 1.00x [sdpa]: a check of the plumbing.

Protocol: every candidate (baselines and methods) lives in one process, all sharing the same weight tensors. Steps
are interleaved: in each round every candidate takes one step, in an order rotated from round to round, so slow
drifts of a shared machine hit all of them alike. The first `--warmup` rounds are not timed (allocator warm-up,
lazy setup such as AttendOut's generator); then `--reps` timed rounds; the table gives the median and the spread
(interquartile range / median).

Memory: one extra step per candidate after the warm-up. CUDA: `torch.cuda.max_memory_allocated` during the step
minus what was allocated just before it. CPU: the same quantity from the allocation events that
`torch.profiler.profile(profile_memory=True)` records (running sum of allocated minus freed bytes, its maximum).
Both are the step's transient memory (activations, gradients, temporaries) above the resident weights; state a
method keeps between steps is not in it (the extra-parameter column shows added parameters, and for AttendOut its
generator's).

The last columns judge each method against its cost target (a multiple of [eager]; the targets are for CUDA), and
`--profile` adds, for each method that misses it (or for the methods named), the top operators of one profiled step.
Threads follow the rule a single run follows (docs/cost.md#threads-and-waiting: every core, idle threads sleep);
on a busy shared CPU `--threads 1` still gives steadier numbers.

Layout: `measure` (candidates, batches, timed and profiled steps), `output` (table, header, JSON); the command line is
`suite.commands.bench`.
"""
from suite.profiling.measure import (
                      EAGER,
                      SDPA,
                      SHAPES,
                      Candidate,
                      build_candidates,
                      cpu_step_peak_bytes,
                      make_batches,
                      profile_step,
                      run_shape,
                      shape_config,
)
from suite.profiling.output import command_line, header, missed_targets, table, write_json

__all__ = ["EAGER", "SDPA", "SHAPES", "Candidate",
           "build_candidates", "command_line", "cpu_step_peak_bytes", "header", "make_batches",
           "missed_targets", "profile_step", "run_shape", "shape_config", "table", "write_json"]
