"""Errors that end the command line with one clear message and a non-zero exit."""


class UsageError(ValueError):
    """Bad arguments or unusable input/output, found before any work starts.

    The CLI prints ``str(error)`` alone (no traceback) and exits with status 2.
    """


class BooksDoNotBalance(RuntimeError):
    """The job's own accounting found images lost, doubled, or too many rejected.

    Raised inside the pipeline's final step, so ``dataset_info.json`` is never
    written for an incomplete dataset. The CLI recognises it by name in the
    runner's error text and prints its message.
    """
