"""Session fixtures of the cloud tests (defined in cloud_helpers, shared with the test modules' helpers)."""

from cloud.cloud_helpers import moto, public_key

__all__ = ["moto", "public_key"]
