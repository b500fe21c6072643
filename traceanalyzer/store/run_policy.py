"""How a run's rules pass is laid out, decided by one thing: the run's size in GPU operations
(kernels, copies and memsets). The rules engine and the run cache read these decisions from a
`RunPolicy` handed to them (`Settings.policy`, `scoped_to_run(policy=...)`); a test or bench
chooses another layout by constructing another policy, never by changing a module's constants.

The thresholds and what each was measured to trade:

- `keep_min_gpu_ops`: a run at least this big keeps its rules' cache in the store file, so later
  passes skip the sorts (5 M kernels: ~5 s of a ~13-18 s pass, for ~350 MB on disk; the dense
  Kineto trace 8x, 180 k operations: a stored run's check 4.0 s -> 2.3 s for 15 MB, the first
  check +0.1 s). Below it the cache costs a few hundred ms to build (21 k operations: 0.2 s of a
  1.2 s check) and is not worth the disk.
- `slice_gpu_ops`: the cache builds its windowed tables (`stream_ops`, `kernel_launches`) in
  slices of start time of about this many operations. A window holds all of its input while it
  computes, and a hash join its whole build side: on 5 M kernels (6.3 M operations) building
  both at once took 1.9 GB above what the process held before, ~0.65 GB in slices of 1 M, in
  the same time within the noise (5.5-6.0 s against 5.6 s; slices of 500 k: 0.5 GB, +1.2 s, the
  fixed cost of each slice's query).
- `parallel_min_gpu_ops`: below it a run's rules run on one thread. Each rule thread's cursor
  needs the views installed (~0.12 s of CPU), more than a second thread saves on a small run (a
  check's rules pass, CPU, one thread against two, 2 cores at load 6: 0.76 against 1.08 s on 11
  operations, 0.93 against 1.39 s on 1,707, 1.30 against 1.65 s on 9,096;
  `python bench/bench_rule_threads.py FILE...`).
- `parallel_max_gpu_ops`: above it, too: the rules are then DuckDB's work, which already uses
  every core inside each query, and two big queries at once only add memory (5 M kernels: 3 %
  faster, 0.9 GB more at the peak). Such a run is big: its pass holds DuckDB to
  `big_run_memory` where TRACEANALYZER_MEMORY_LIMIT sets none (rule after rule adds the blocks
  it reads to the buffer pool, and the pass peaked at the sum: 5 M kernels, a stored run's check
  1.89 GB, T004 alone ~1.1 GB of working memory; held to 1 GB, blocks are let go and the rest
  spills: 1.26 GB, for ~1 s of a ~10 s check).
- `kept_run_memory`: a run that keeps its cache (`keep_min_gpu_ops`) but is not big has its pass
  held to this: its rules' blocks would stay in the buffer pool to the end of the pass (the
  dense Kineto trace 8x, 171 k operations: the check's peak 931 MB in its rules pass, 755 MB
  with the pass held to 512 MB; the whole check held by TRACEANALYZER_MEMORY_LIMIT: 731 MB at
  500 MB, 676 MB at 300 MB; the time within the noise).
- `budget_window_gpu_ops`: a run with more operations than this has its time budget summed
  over windows of about as many (`budget_rows.time_budget_rows`): the sweep holds every event
  of what it sweeps, and the whole of 5 M kernels' (6.3 M operations) took 4.4 GB for 13.8 s,
  against 0.95 GB for 14.1 s in windows of 1 M (the same rows).
- `drop_blocks_when_built`: the pass that has just built a run's kept cache starts with all of
  it in DuckDB's buffer pool, and each rule adds what it reads (5 M kernels: a peak of
  1.6-1.75 GB). There the pool is cut down before each rule (1.4 GB; the blocks are read again
  from the file: 0.5-1.2 s of a 14-15 s pass). Later passes read only what their rules need.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunPlan:
    """What a `RunPolicy` decides for one run of `gpu_ops` operations."""

    gpu_ops: int
    keep: bool  # keep the rules' cache in the store (where the store is writable)
    slices: int  # build the windowed cache tables in this many slices of start time
    parallel: bool  # the run's size admits its rules on several threads
    memory: str | None  # DuckDB's memory limit for the pass where none is set (None: unchanged)


@dataclass(frozen=True)
class RunPolicy:
    """The size thresholds of a rules pass (see the module's text for what each trades)."""

    keep_min_gpu_ops: int = 100_000
    slice_gpu_ops: int = 1_000_000
    parallel_min_gpu_ops: int = 20_000
    parallel_max_gpu_ops: int = 1_000_000
    big_run_memory: str = "1GB"
    kept_run_memory: str = "512MB"
    budget_window_gpu_ops: int = 1_000_000
    drop_blocks_when_built: bool = True

    def plan(self, gpu_ops: int) -> RunPlan:
        big, keep = gpu_ops > self.parallel_max_gpu_ops, gpu_ops >= self.keep_min_gpu_ops
        return RunPlan(gpu_ops=gpu_ops, keep=keep,
                       slices=max(1, -(-gpu_ops // max(1, self.slice_gpu_ops))),
                       parallel=self.parallel_min_gpu_ops <= gpu_ops <= self.parallel_max_gpu_ops,
                       memory=self.big_run_memory if big else self.kept_run_memory if keep else None)


DEFAULT_POLICY = RunPolicy()
