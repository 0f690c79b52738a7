"""The conversion sources of ``python -m modeling.bert.convert``, one module each with the same names: ``FIELDS``
(config fields, both ways), ``KEYS`` (parameter renames, both ways), ``CLASSES`` (transformers class -> SesameBert
class), ``LAYOUT`` (its ``LAYOUTS`` row), ``SOURCE`` (a :class:`common.Source`: the mechanics, shared) and
``to_sesame(model)`` / ``from_sesame(model)``. Adding a source is one module here and one layout row in ``LAYOUTS``.
"""

from . import bert, eurobert, modernbert
from .common import Source

#: ``model_type`` (and ``--to`` format) -> its module.
SOURCES = {module.SOURCE.name: module for module in (bert, modernbert, eurobert)}

__all__ = ["SOURCES", "Source"]
