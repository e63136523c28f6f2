"""Fixtures of the pretrained tests: the transformers reference, computed once."""

from tests.pretrained.reference import reference

__all__ = ["reference"]
