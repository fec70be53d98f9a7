"""Evaluation: automatic text, speech and video metrics, the `empatheia eval` runner and
report, and the human-evaluation kit (§6, Appendix E.3)."""
