"""An engine error's message in the Open Inference Protocol's names, for both transports
(the REST body's ``error``, the gRPC status's details): the same words either way."""

from __future__ import annotations

from service.errors import ServiceError, field_name

# Domain names spelled as this protocol's tensors: a request's sequences are the rows
# of its batch, its mask the attention_mask input.
RENAMES = {"inputs": "batch", "mask": "attention_mask"}


def message(exc: ServiceError) -> str:
    """The error's message, led by the field to blame (if one is) in tensor names."""
    where = None if exc.field is None else field_name(exc.field, RENAMES)
    return exc.message if where is None else f"{where}: {exc.message}"
