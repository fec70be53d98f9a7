"""Configs that ship inside the package as ``empatheia.configs`` (setup.py maps this folder
there): the model presets, ``model/{tiny,small,paper}.yaml``, read by
:func:`empatheia.config_loader.preset_file`. This file makes the folder a package, so that
an installed or editable package can import it; the training, DeepSpeed and label configs
beside them are read from the repository by path."""
