"""Import-order guard for running every suite in one pytest process.

Importing ansible (the Ansible plugin and playbook tests do) replaces ``sys.intern`` with a patch object, and
``torch._dynamo`` (imported lazily, e.g. by torchvision.tv_tensors) refuses to start once that has happened.
Importing torch's compiler stack first, where torch is installed, keeps both working in one process.
"""

import importlib.util

if importlib.util.find_spec("torch") is not None:
    import torch._dynamo  # noqa: F401


def pytest_collection_modifyitems(config, items):
    """The slow proofs first (the learning test trains for minutes on one core): under pytest-xdist's loadfile
    scheduling each file goes whole to one worker in collection order, and `testpaths` lists tests/ before
    apps/tests, so the learning proof was handed out last and ran alone at the end of the stage."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
