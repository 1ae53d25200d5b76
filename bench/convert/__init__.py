"""The converter measured: against the codec floor and the naive loop
(``converters``, ``floor``, ``naive``, the Pillow steps they share in
``imageops``), the stored images' quality (``quality``), and the codec study
(``codecs``, ``codec_paths``, ``codec_worker``: ``--only codecs``)."""
