"""The converter at size: memory and speed as the input grows, and the many
small files, full, killed and resumed (``growth``: ``--only scale``), and
``--reuse OLD`` of a grown folder against a full conversion (``reuse``:
``--only reuse``)."""
