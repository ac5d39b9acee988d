"""dinops: the DINO object detector and the tools that train, serve and feed it."""

__version__ = "0.1.0"
