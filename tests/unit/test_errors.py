"""Every exception class the package defines derives from FleetError, so that a caller can
catch the fleet's errors with one ``except FleetError``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import scrapy_fleet
from scrapy_fleet.errors import FleetError


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(scrapy_fleet.__path__, "scrapy_fleet."):
        if info.name.endswith("__main__"):
            continue  # runs a program when imported
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == info.name):
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_exception_of_the_package_derives_from_fleet_error():
    classes = _exception_classes()
    assert "scrapy_fleet.errors.FleetConfigError" in classes  # the walk found the package's
    assert "scrapy_fleet.pipelines.mongo_writes.DocumentRejected" in classes
    assert sorted(name for name, cls in classes.items() if not issubclass(cls, FleetError)) == []
