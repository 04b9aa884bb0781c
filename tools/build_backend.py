"""meterhub's build backend: setuptools' own, without its notice on every editable install.

setuptools announces each editable install of a project laid out like this one with an
`InformationOnly` warning ("Please be careful with folders in your working directory with
the same name as your package"), a warning only because it has no other way to reach the
user. No folder here is named like the package: `meterhub` is assembled from hub/,
spawner/, billing_hooks/ … by `package-dir`, and tests/test_packaging.py checks that nothing
imports those folders by their bare names. The notice only buried `make serve`'s console.
Every other hook, and every other warning, is setuptools' unchanged.
"""

from __future__ import annotations

import warnings

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 (the PEP 517 and PEP 660 hooks)
from setuptools.warnings import InformationOnly


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Editable installation", InformationOnly)
        return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
