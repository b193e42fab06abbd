"""The experiments' reports: one module per experiment, ``reports/NAME.py``.

A report module turns a recipe's results — plain dicts and lists of numbers, the frozen
``Config`` — into what a reader sees: the markdown results file (tables, the command that
reproduces them) and the figures (matplotlib, Agg backend, written to a path it is given).
It never trains and computes no model quantity; it imports nothing from the recipes
(``seqjax.experiments.NAME``), so the recipe imports its report and never the other way
round. What a report needs from a recipe (labels, a reference number, a lexicon) comes in
as an argument or lives in the report itself when only formatting uses it.

A report's functions are called by their own module's name (e.g.
``seqjax.experiments.reports.char_lm.write_results``); no recipe re-exports them.
"""
