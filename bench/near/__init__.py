"""Near-duplicate hashes (``--only near``): ``calibration`` builds the set of
real photos and known near copies, ``duplicates`` measures recall, false pairs,
cost and scale on it."""
