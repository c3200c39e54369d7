"""Reports: the site's templates, static files and pure rendering of plain records (imports at most harness.core).

Kept as a package of its own rather than folded under ``harness.render``: it is the presentation layer alone
(``render`` formatting and templates, ``chip``, ``variants``, ``regressions``, ``history``, ``evidence`` page
pieces, ``svg``/``xy``/``strip`` plots), held to plain records by its import-linter contract; ``harness.render``
decides which pages to write and writes them, ``harness.analysis`` loads what they show."""
