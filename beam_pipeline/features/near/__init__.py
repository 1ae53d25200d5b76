"""Near duplicates: the fingerprint, the band search, the report."""
