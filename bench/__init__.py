"""Benchmark harness for imagerecords: ``python -m bench`` / ``make bench``.

It measures the converter (``python -m beam_pipeline``) against a codec floor and
the naive tutorial loop, and the reader (``reader.make_dataset``) against the
usual Keras / tf.data pipelines, on the same generated images in the same run,
and writes ``bench/results/results.{md,json}`` and ``chart.png``.

Modules, one job each:

* ``settings``  - the full and ``--quick`` sizes, paths.
* ``data``      - deterministic "web" and "phone" image sets from real photos.
* ``procstats`` - run a command, time it, sample the RSS of its process tree.
* ``machine``   - the machine description (CPU, RAM, versions, load).
* ``convert_floor``, ``convert_naive`` - the two converter baselines (runnable).
* ``converters`` - runs the three converters on each set.
* ``codecs``, ``codec_paths``, ``codec_worker`` - the codec study:
  Pillow filters, libvips, simplejpeg (+ OpenCV), optional Pillow-SIMD.
* ``read_pipelines``, ``read_worker``, ``readers`` - the reader benchmark
  (with the crop-decode and full-decode floors and uint8 rows).
* ``gpu_step`` - ResNet-50 fed by each reader; says "skipped" without a GPU.
* ``report``    - Markdown table, JSON and PNG chart.
* ``scale``     - memory and speed at 1x, 8x, 64x the web set.
* ``tools``     - one-off profilers and studies that ``make bench`` does not run
  (``python -m bench.tools.profile_converter`` and the like).
"""
