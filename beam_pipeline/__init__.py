"""imagerecords' Apache Beam job: image folders -> shuffled, split TFRecord shards.

Imports no TensorFlow; run it with ``python -m beam_pipeline``. ``PUBLIC_MODULES``
names the modules a client may import from (docs/architecture.md, "Public names").
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
    "beam_pipeline.features.*",  # e.g. near.stage.find_local(): the local near-duplicate search
    "beam_pipeline.core.*",
)
