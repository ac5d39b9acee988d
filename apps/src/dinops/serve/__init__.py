"""The inference API: a Flask app factory (:func:`dinops.serve.app.create_app`) run by gunicorn.

This package's ``__init__`` imports nothing, so that :mod:`dinops.serve.logs` stays importable where torch
and Flask are not installed (the client and downloader images).
"""
