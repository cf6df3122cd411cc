"""A model judge: any deployment evalkit can reach grades the prompts suite's outputs with the rubrics.

- `prompts`: the judge's prompt templates, the rubrics they quote, and the strict parsing of its answers.
- `run`: the judging itself (engine through the result cache, resumable records in `<run>/judge/`).
- `score`: judge scores, bias controls (position flips, length slope, same-family flag) and certification
  against imported human ratings; certified categories only reach the decision.

Judge output is model output: untrusted, stored as text, shown inert.
"""
