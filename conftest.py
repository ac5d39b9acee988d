"""Import-order guard for running every suite in one pytest process.

Importing ansible (the Ansible plugin and playbook tests do) replaces ``sys.intern`` with a patch object, and
``torch._dynamo`` (imported lazily, e.g. by torchvision.tv_tensors) refuses to start once that has happened.
Importing torch's compiler stack first, where torch is installed, keeps both working in one process.
"""

import collections
import importlib.util

if importlib.util.find_spec("torch") is not None:
    import torch._dynamo  # noqa: F401


def pytest_collection_modifyitems(config, items):
    """The slow proofs first, then the files with the most tests (the order pytest-xdist's loadfile would choose by
    itself): each file goes whole to one worker in this order (the Makefile passes --no-loadscope-reorder, since
    xdist's own reorder, by test count alone, handed the learning proof, one test of 7 minutes, out last, where it
    ran alone at the end of the stage)."""
    per_file = collections.Counter(item.nodeid.split("::")[0] for item in items)
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, -per_file[item.nodeid.split("::")[0]]))
