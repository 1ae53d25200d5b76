"""The command line: flags, checks before work starts, the dry run, running a
job on the chosen engine and the summary it prints. The top layer.
"""
