"""The project's own error type: everything a user can get wrong ends here, as one clear line."""


def first_line(exc: BaseException) -> str:
    """An exception's first line of text, or its type's name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class HarnessError(Exception):
    """A user-facing failure: bad input, unreachable service, missing commit. Printed without traceback."""


class SuiteError(HarnessError):
    """A suite document is malformed; the message names the bad field."""
