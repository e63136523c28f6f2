"""What runs inside the peers' own venvs, started by path (``python FILE``), never imported
from them: ``inproc_worker`` (imports only the standard library and numpy at the top, so
any venv runs it; ours imports its ``Text`` for the reference) and ``pytriton_server``
(the PyTriton venv)."""
