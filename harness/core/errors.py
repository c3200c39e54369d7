"""The project's own error type: everything a user can get wrong ends here, as one clear line."""


class HarnessError(Exception):
    """A user-facing failure: bad input, unreachable service, missing commit. Printed without traceback."""


class SuiteError(HarnessError):
    """A suite document is malformed; the message names the bad field."""
