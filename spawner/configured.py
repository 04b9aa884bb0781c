"""Configurable objects made once for a configuration that does not change (the hub's)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import TypeVar

from traitlets.config import Config, Configurable

T = TypeVar("T", bound=Configurable)
#: where on a Config object (its instance __dict__, not one of its sections) `per_config`
#: keeps what it made: (class, extra) -> (what the config's sections for the class read
#: then, the object); it lives and dies with the config (copies of a Config start without it)
_MADE = "_meterhub_made"
_MADE_LOCK = threading.Lock()


def per_config(
    cls: type[T], config: Config, extra: Hashable = None, make: Callable[[], T] | None = None
) -> T:
    """`cls(config=config)` (or what `make` returns), made once for this config object and
    kept while its sections for `cls` read the same; `extra` tells apart objects made from
    the same config in different ways, and names how: one `make` for one (cls, extra). Of
    the objects with an `extra` (say, the catalog with the admins' prices of the moment)
    only the last made is kept, beside the plain one (extra None).

    A spawn read its BillingSettings and its catalog from the hub's config afresh, about a
    tenth of a millisecond each to load the config into their traits, for a config that
    does not change once the hub runs (bench/spawn_burst.py). The objects are shared, by
    threads too: never assign to their traits.
    """
    sections = repr([dict.get(config, name) for name in cls.section_names()])
    with _MADE_LOCK:
        made = vars(config).setdefault(_MADE, {})
        kept = made.get((cls, extra))
    if kept is not None and kept[0] == sections:
        return kept[1]
    obj = make() if make is not None else cls(config=config)
    with _MADE_LOCK:
        if extra is not None:  # the catalog of the prices before a change goes
            for key in [k for k in made if k[0] is cls and k[1] not in (None, extra)]:
                del made[key]
        made[(cls, extra)] = (sections, obj)
    return obj
