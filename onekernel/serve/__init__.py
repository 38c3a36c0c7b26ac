"""``onekernel serve``: an OpenAI-compatible HTTP server with streaming and continuous batching.

``engine.py`` (the batching engine on its own thread), ``protocol.py`` (request bodies and their checks),
``format.py`` (response bodies), ``text.py`` (stop strings), ``metrics.py`` (Prometheus), ``app.py`` (routes),
``main.py`` (the command). docs/DESIGN.md, "Serving".
"""
