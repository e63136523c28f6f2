"""Keys of the ASGI scope that the server layer and the app share.

The server (uvicorn's protocol, ``connection_guard.py``) writes them and the
app's middleware (``protocols/context.py``) reads them; they live apart from
both so that the server never imports a protocol.
"""

from __future__ import annotations

# Set by the server when the connection is lost before the answer was complete (a
# client gone, or dropped at the send timeout): the answer never arrived.
ANSWER_CUT = "attnserve.answer_cut"
