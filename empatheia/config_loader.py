"""Reading configs: YAML files, the model presets, ``--set`` overrides, and the dataclasses
they fill.

One loader serves every config of the package (the model's
:class:`~empatheia.config.EmpatheiaConfig`, a training run's
:class:`~empatheia.training.TrainConfig`) and one override syntax every command line and
recipe:

* ``--set a.b=1`` (repeatable), or several ``key=value`` after one ``--set``
  (``--set a.b=1 c=2``); values are YAML (``1e-4``, ``null``, ``[0.9, 0.95]``,
  ``{language_model.pretrained: /models/x}``);
* in Python, a mapping whose keys are dotted (``{"loss.alpha": 0.5}``) or whose values are
  sections (``{"loss": {"alpha": 0.5}}``), alike.

A key names a field of the dataclass, a field of one of its sections, or a key inside one
of its free mappings (``language_model.architecture.hidden_size``). A value given for a
section is merged into it; one given for a free mapping replaces it. An unknown key, or a
value of the wrong type, is a :class:`ConfigError` that names where it came from and the
key.

The presets are ``configs/model/<name>.yaml`` in the repository, shipped inside the
package as ``empatheia.configs`` (setup.py) and read from there with
:mod:`importlib.resources`, so an installed package has them too.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import os
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Union, get_args, get_origin, get_type_hints

import yaml

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

PRESETS_PACKAGE = "empatheia.configs"
PRESETS_FOLDER = "model"


class ConfigError(KeyError, ValueError):
    """A config that cannot be used; the message names where it came from and the key.

    Both a ``KeyError`` (what an unknown key of the model's config has always raised) and a
    ``ValueError`` (what a bad training config has), so callers that catch either keep
    working.
    """

    def __str__(self) -> str:
        # KeyError's own str() quotes the message as if it were a key.
        return str(self.args[0]) if self.args else ""


# ---------------------------------------------------------------------- files
def read_yaml_mapping(source: Union[str, os.PathLike, Traversable]) -> Dict[str, Any]:
    """A YAML file whose top level is a mapping (a path, or a file of a package's data);
    anything else is a :class:`ConfigError` naming the file."""
    path = Path(source) if isinstance(source, (str, os.PathLike)) else source
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ConfigError(f"{source}: not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def preset_names() -> List[str]:
    """The presets the package ships (``tiny``, ``small``, ``paper``)."""
    folder = resources.files(PRESETS_PACKAGE).joinpath(PRESETS_FOLDER)
    return sorted(entry.name[: -len(".yaml")] for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def preset_file(name: str) -> Traversable:
    """The shipped YAML of preset ``name``; an unknown name is a :class:`ConfigError` that
    lists the known ones."""
    names = preset_names()
    if name not in names:
        raise ConfigError(f"unknown preset {name!r}; choose one of {names}")
    return resources.files(PRESETS_PACKAGE).joinpath(PRESETS_FOLDER).joinpath(f"{name}.yaml")


# ---------------------------------------------------------------------- --set
def add_set_argument(parser: Union[argparse.ArgumentParser, "argparse._ArgumentGroup"], help: str) -> None:
    """``--set KEY=VALUE [KEY=VALUE ...]``, repeatable; ``help`` says whose keys they are.
    The parsed ``args.set`` is a list for :func:`parse_sets`."""
    parser.add_argument(
        "--set",
        action="extend",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help=f"{help}; values are YAML; repeatable, and several may follow one --set",
    )


def parse_sets(items: Iterable[str]) -> Dict[str, Any]:
    """``["optim.learning_rate=3.0e-4", "data.eval=null"]`` -> ``{"optim.learning_rate":
    0.0003, "data.eval": None}``: each value read as YAML (which reads ``1e-4``, without a
    dot, as a string; a float field takes it). A later item for the same key wins."""
    overrides: Dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected key=value")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as error:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML: {error}") from None
        # Re-inserted at the end, so overrides apply in the order they were given.
        overrides.pop(key, None)
        overrides[key] = value
    return overrides


# ---------------------------------------------------------------------- dataclasses
def load_dataclass(
    cls,
    data: Mapping[str, Any],
    source: str,
    overrides: Optional[Mapping[str, Any]] = None,
    overrides_source: str = "overrides",
):
    """``cls`` (a dataclass, its sections dataclasses too) from a mapping such as a YAML
    file's, after ``overrides`` (dotted or nested keys, see the module's docstring).
    Keys missing from ``data`` keep the fields' defaults; ``source`` and
    ``overrides_source`` name where the data and the overrides came from in errors."""
    data = copy.deepcopy(dict(data))
    for key, value in (overrides or {}).items():
        _apply(cls, data, str(key).split("."), value, overrides_source, prefix="")
    return _build(cls, data, source, prefix="")


def _apply(cls, data: Dict[str, Any], path: List[str], value: Any, source: str, prefix: str) -> None:
    """Set ``path`` (a dotted key split on its dots) of ``data``, which is read as ``cls``."""
    name, rest = path[0], path[1:]
    types = get_type_hints(cls)
    if name not in types:
        raise _unknown(cls, name, prefix, source)
    key = prefix + name
    section = _dataclass_of(types[name])
    if section is not None:
        node = data.get(name)
        if node is None:
            node = data[name] = {}
        if not isinstance(node, dict):
            raise ConfigError(f"{source}: {key} must be a mapping, got {node!r}")
        if rest:
            _apply(section, node, rest, value, source, f"{key}.")
        elif isinstance(value, Mapping):
            for sub, sub_value in value.items():
                _apply(section, node, str(sub).split("."), sub_value, source, f"{key}.")
        else:
            raise ConfigError(f"{source}: {key} is a section: give a mapping of its keys, got {value!r}")
        return
    if not rest:
        # Checked here too, so that a bad value is blamed on the override, not on the file.
        data[name] = _coerce(value, types[name], key, source)
        return
    # A key inside a free mapping, e.g. language_model.architecture.hidden_size.
    if not _is_mapping(types[name]):
        raise ConfigError(f"{source}: unknown config key {prefix + '.'.join(path)!r} ({key} is not a mapping)")
    node = data
    for part in [name, *rest[:-1]]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: unknown config key {prefix + '.'.join(path)!r} ({part!r} is not a mapping)")
        node = child
    node[rest[-1]] = value


def _build(cls, data: Mapping[str, Any], source: str, prefix: str):
    types = get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        if name not in types:
            raise _unknown(cls, name, prefix, source)
        kwargs[name] = _coerce(value, types[name], prefix + name, source)
    return cls(**kwargs)


def _coerce(value: Any, annotation: Any, key: str, source: str) -> Any:
    """``value`` checked against its field's type. YAML 1.1 reads ``5e-5`` (no dot) as a
    string, so numeric strings are accepted for floats; an int is accepted for a float."""
    if annotation is Any:
        return value
    if get_origin(annotation) is Union:
        choices = [a for a in get_args(annotation) if a is not type(None)]
        if value is None and len(choices) < len(get_args(annotation)):
            return None
        if len(choices) != 1:
            return value  # no field of ours is a wider union
        annotation = choices[0]
    if value is None:
        raise ConfigError(f"{source}: {key} cannot be null")
    section = _dataclass_of(annotation)
    if section is not None:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{source}: {key} must be a mapping, got {value!r}")
        return _build(section, value, source, f"{key}.")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{source}: {key} must be a number, got {value!r}")
    if annotation is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{source}: {key} must be an integer, got {value!r}")
    if annotation is bool and not isinstance(value, bool):
        raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
    if annotation is str and not isinstance(value, str):
        raise ConfigError(f"{source}: {key} must be a string, got {value!r}")
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{source}: {key} must be a list, got {value!r}")
        item = args[0] if args else Any
        return [_coerce(v, item, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{source}: {key} must be a mapping, got {value!r}")
        item = args[1] if args else Any
        return {k: _coerce(v, item, f"{key}.{k}", source) for k, v in value.items()}
    return value


def _dataclass_of(annotation: Any) -> Optional[type]:
    return annotation if isinstance(annotation, type) and dataclasses.is_dataclass(annotation) else None


def _is_mapping(annotation: Any) -> bool:
    return annotation is Any or get_origin(annotation) is dict


def _unknown(cls, name: str, prefix: str, source: str) -> ConfigError:
    known = [f.name for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {prefix + close[0]!r}?" if close else f"; known keys: {sorted(prefix + k for k in known)}"
    return ConfigError(f"{source}: unknown config key {prefix + name!r}{hint}")
