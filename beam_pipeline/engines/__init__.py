"""The two engines that wire the stages: local_engine.py (no Beam, the default)
and pipeline.py (the Beam graph), plus the process pool and the progress line
they share. Wiring only: the stages live in beam_pipeline.stages.
"""
