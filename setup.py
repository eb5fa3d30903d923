"""What pyproject.toml cannot say: the folder ``plugins/`` installs as ``hogwild_plugins``.

Everything else about the distribution (metadata, dependencies, extras, entry points) is in
``pyproject.toml``.
"""

from setuptools import find_packages, setup

PLUGIN_PACKAGES = ["hogwild_plugins"] + [
    f"hogwild_plugins.{name}" for name in find_packages("plugins")
]

setup(
    packages=find_packages(include=["hogwild", "hogwild.*"]) + PLUGIN_PACKAGES,
    package_dir={"hogwild_plugins": "plugins"},
)
