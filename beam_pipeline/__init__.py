"""imagerecords' Apache Beam job: image folders -> shuffled, split TFRecord shards.

Imports no TensorFlow (docs/format.md section 1). Run it with ``python -m beam_pipeline``.

Its interface is the command line and the files it writes (docs/format.md).
``PUBLIC_MODULES`` are the modules whose names without a leading underscore
a client outside this package (``bench/``, a user's script) may import and
expect to keep: the command line as a call, a reader of the counters line it
prints, the pure core (``beam_pipeline.core``: one image's conversion, split
and order keys, the books, the elements, the near-duplicate hashes, ...), and
the parts of a run the benchmark's tools time on their own (the dry run's
census and the discovery it counts, the progress line, the Beam graph's shard
writer, the near-duplicate search). Every other module is the package's inside, free to change.
``tests/test_bench_public.py`` checks that ``bench/`` keeps to these.
"""

__version__ = "0.1.0"

# "package.*": the package and every module under it.
PUBLIC_MODULES = (
    "beam_pipeline.__main__",  # run(argv), main(): the command line as a call
    "beam_pipeline.cli.summary",  # read_counters(): the counters line the command prints
    "beam_pipeline.cli.dryrun",  # census(): what --dry_run counts
    "beam_pipeline.storage.discovery",  # discover(): the layout found before work starts
    "beam_pipeline.engines.progress",  # Reporter: the live progress line
    "beam_pipeline.stages.staging",  # write_staged_shard(): the Beam graph's shard writer
    "beam_pipeline.stages.near",  # find_local(): the local engine's near-duplicate search
    "beam_pipeline.core.*",
)
