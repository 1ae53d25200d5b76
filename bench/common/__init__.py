"""What every part of the benchmark shares: sizes and paths (``settings``), the
generated image sets (``data``), a child process measured from the outside
(``procstats``) and the machine it ran on (``machine``)."""
