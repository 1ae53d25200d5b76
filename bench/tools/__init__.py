"""One-off tools for studying where time goes; ``make bench`` runs none of them.

Each is runnable on its own and writes only under the gitignored
``bench/results/raw/`` (or prints):

* ``python -m bench.tools.profile_converter`` - per-image stage costs, py-spy
  and cProfile of a converter run.
* ``python -m bench.tools.profile_reader`` - the reader, one stage added at a
  time, on the benchmark's records.
* ``python -m bench.tools.dryrun_scale`` - ``--dry_run`` on 100,000 tiny images.
* ``python -m bench.tools.page_faults`` - the page faults the reader's choice of
  TensorFlow's CPU allocator saves: the default allocator against BFC, each in
  a fresh process.
* ``python -m bench.tools.profile_op`` - the reader's resize op alone.
* ``python -m bench.tools.shard_memory`` - the shuffle path's shard writer:
  memory per shard in flight.
* ``python -m bench.tools.progress_cost`` - the progress line's cost: per
  call, and a run on a terminal against ``--quiet``.
* ``python -m bench.tools.crop_costs`` - ``imagerecords.transforms.train_crop``
  step by step, and the resizes it could use, per image.
* ``python -m bench.tools.interleave OLD [NEW]`` - two commits' converter and
  reader ratios, their own benchmarks in alternating rounds.
* ``python -m bench.tools.codebase_stats`` - lines per package, the longest
  modules and functions, and the project files a local run enters.
"""
