"""What `pip install .` installs: the one package `empatheia`, every source folder of the
repository inside it, and the repository's top-level layout unchanged."""

from pathlib import Path

from .setup_arguments import REPO, setup_arguments

TOP_LEVEL = ("setup.py", "empatheia", "generators", "training", "configs", "tests", "docs", "Makefile")


def source_folder(package, package_dir):
    """The folder a package is installed from, as setuptools resolves ``package_dir``."""
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in package_dir:
            return REPO / package_dir[prefix] / Path(*parts[cut:])
    return REPO / Path(*parts)


def test_only_the_empatheia_package_is_installed():
    setup = setup_arguments()
    assert {package.split(".")[0] for package in setup["packages"]} == {"empatheia"}
    assert "py_modules" not in setup
    assert [entry.split("=")[0].strip() for entry in setup["entry_points"]["console_scripts"]] == ["empatheia"]


def test_every_source_package_is_installed_from_the_repository_folders():
    setup = setup_arguments()
    folders = {source_folder(package, setup.get("package_dir", {})) for package in setup["packages"]}
    assert all((folder / "__init__.py").is_file() for folder in folders), sorted(map(str, folders))
    # Nothing left behind: every package folder under the installed roots is listed.
    for root in ("empatheia", "generators", "training", "configs"):
        for init in (REPO / root).rglob("__init__.py"):
            assert init.parent in folders, f"{init.parent.relative_to(REPO)} is not installed"


def test_the_presets_and_stage_configs_ship_as_package_data():
    patterns = setup_arguments()["package_data"]["empatheia.configs"]
    configs = REPO / "configs"
    shipped = {path for pattern in patterns for path in configs.glob(pattern)}
    assert {path for path in configs.rglob("*") if path.suffix in (".yaml", ".json")} == shipped


def test_the_top_level_layout_of_the_design_card_is_kept():
    assert all((REPO / name).exists() for name in TOP_LEVEL)
