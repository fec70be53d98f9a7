"""Training recipes: one module per stage of the curriculum (§5) and one for downstream
fine-tuning. Each has ``run(config, resume=False)``; ``empatheia train CONFIG.yaml`` picks
the recipe named by the config's ``recipe`` key. The parts they compose live in
:mod:`empatheia.training`.
"""
