"""Trainers' loaders on the same shards (``--only trainers``): ``trainers`` runs
``worker`` on each of ``pipelines``."""
