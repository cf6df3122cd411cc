"""Report: HTML and Markdown built from scores.csv, comparisons.csv and the manifest."""
