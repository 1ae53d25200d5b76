"""Exact duplicates: identical source files grouped, and dropped under --dedupe."""
