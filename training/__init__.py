"""Training recipes for the four Empatheia stages.

The losses and the parameters each stage trains live in the model
(:meth:`empatheia.Empatheia.forward` and :meth:`empatheia.Empatheia.set_stage`); the
recipes that drive them with an optimiser, checkpoints and DeepSpeed are added here.
"""
