"""The inference API: a Flask app factory (:func:`dinops.serve.app.create_app`) run by gunicorn.

This package's ``__init__`` imports nothing heavy; the structured logging that the client and the downloader share
with it lives in :mod:`dinops.logs`.
"""
