"""Training recipes: ``recipe`` runs any stage of the curriculum (§5) or downstream
fine-tuning from its YAML config (``empatheia train CONFIG.yaml``, or ``python -m
empatheia.recipes.recipe --config CONFIG.yaml``); ``small_preset`` runs the whole curriculum of the
``small`` preset. The parts they compose live in :mod:`empatheia.training`.
"""
