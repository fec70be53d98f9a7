"""Evaluation: automatic text, speech and video metrics, the `empatheia eval` files
(``records``), scoring (``scoring``), model runs (``model_runs``) and report, and the
human-evaluation kit (§6, Appendix E.3)."""
