"""Serving a model over HTTP (``nmt-server``): :mod:`nmt.server.http_api`."""
