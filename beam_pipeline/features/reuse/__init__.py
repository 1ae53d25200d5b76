"""--reuse: records taken over from an earlier dataset (docs/reuse.md)."""
