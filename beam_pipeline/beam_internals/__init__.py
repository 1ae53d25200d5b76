"""Everything that touches Beam's private modules or its option table, in one
place under one version guard (beam_private.BEAM_VERSION); the
tripwire test (tests/test_beam_private.py) covers every module here.
"""
