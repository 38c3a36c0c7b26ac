"""``onekernel serve``: an OpenAI-compatible HTTP server with streaming and continuous batching.

``engine.py`` (the batching engine on its own thread), ``protocol.py`` (request bodies), ``unsupported.py`` (the
fields not honoured), ``checks.py`` (a body -> the engine's request), ``invalid.py`` (pydantic's refusals -> 400s),
``format.py`` (response bodies), ``text.py`` (stop strings), ``metrics.py`` (Prometheus), ``app.py`` (routes),
``shutdown.py`` (signals: drain, then stop), ``main.py`` (the command). docs/DESIGN.md, "Serving".
"""
