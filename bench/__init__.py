"""Benchmark harness for imagerecords: ``python -m bench`` / ``make bench``.

It measures the converter (``python -m beam_pipeline``) against a codec floor and
the naive tutorial loop, and the reader (``reader.make_dataset``) against the
usual Keras / tf.data pipelines, on the same generated images in the same run,
and writes ``bench/results/results.{md,json}`` and ``chart.png``.

Sub-packages, by what they measure (each ``--only`` part lives in one):

* ``common``  - what every part shares: the sizes and paths (``settings``), the
  generated "web" and "phone" image sets (``data``), a child process timed with
  its RSS sampled (``procstats``), the machine description (``machine``).
* ``convert`` - the converter against its two baselines (``converters``;
  ``floor`` and ``naive`` are runnable), the stored images' quality
  (``quality``) and the codec study (``codecs``, ``codec_paths``,
  ``codec_worker``: Pillow filters, libvips, simplejpeg (+ OpenCV), optional
  Pillow-SIMD).
* ``read``    - the reader benchmark (``readers``, ``pipelines``, ``worker``:
  with the crop-decode and full-decode floors and uint8 rows) and ``gpu_step``,
  ResNet-50 fed by each reader ("skipped" without a GPU).
* ``train``   - the trainers' loaders (tf.data, TFDS, Grain) on the same shards.
* ``near``    - near-duplicate hashes: the calibration set and its measurement.
* ``scale``   - memory and speed at 1x, 8x, 64x the web set and many small files
  (``growth``), and ``--reuse`` of a grown folder (``reuse``).
* ``tools``   - one-off profilers and studies that ``make bench`` does not run
  (``python -m bench.tools.profile_converter`` and the like).

``report`` (beside ``__main__``, as it joins the parts) writes the Markdown
table, JSON and PNG chart.
"""
