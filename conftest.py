"""Import-order guard for running every suite in one pytest process.

Importing ansible (the Ansible plugin and playbook tests do) replaces ``sys.intern`` with a patch object, and
``torch._dynamo`` (imported lazily, e.g. by torchvision.tv_tensors) refuses to start once that has happened.
Importing torch's compiler stack first, where torch is installed, keeps both working in one process.
"""

import importlib.util

if importlib.util.find_spec("torch") is not None:
    import torch._dynamo  # noqa: F401
