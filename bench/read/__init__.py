"""The tf.data reader measured against Keras and tf.data baselines (``readers``
runs ``worker`` on each of ``pipelines``), and a ResNet-50 step fed by each
(``gpu_step``, skipped without a GPU)."""
