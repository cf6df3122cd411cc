"""`evalkit view`: a local web viewer over a folder of run directories.

It reads what is on disk through evalkit's own readers (records via `RunDir`/`parse_record`, the CSVs and
decision.json through `evalkit.results.Run`) and never loads a model. Its only writes are blind ratings made
in the browser, stored as the same sheet files `rate import` reads (`evalkit.viewer.review`).

Modules: `safety` (which paths may be read), `runs` (the runs list and each run's status), `index` (one
run's item matrix, built once per run and cached by the files' mtimes), `textdiff` (token-level
differences), `compare` (run against run through the suites' own compare()), `review` (browser ratings),
`app` (the Starlette application and its security headers).
"""
from __future__ import annotations
