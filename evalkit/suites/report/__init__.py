"""Each suite's place in the report (its section, verdict columns, measured memory), one module per suite.

These modules sit in the report layer (they build the report's tables and figures); the suites' specs name
their functions by dotted strings ("evalkit.suites.report.<suite>:section"), which the report loads by name.
A suite without such a module gets a table of its declared metrics.
"""
