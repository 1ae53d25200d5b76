"""Flex Template entry point: the launcher runs this file with the template parameters.

It is the ordinary command line with two differences: the launcher returns as
soon as the job is submitted (``--wait=false``), and flags the launcher adds
that this tool does not know are passed to Beam with a warning, not refused.
"""

import os
import sys

from beam_pipeline.__main__ import main

if __name__ == "__main__":
    os.environ.setdefault("IMAGERECORDS_LENIENT_OPTIONS", "1")
    sys.exit(main([*sys.argv[1:], "--wait=false"]))
