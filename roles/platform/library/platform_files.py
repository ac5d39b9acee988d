#!/usr/bin/python
"""Write a set of files in one directory in one module call, each only when its content differs."""

from __future__ import annotations

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: platform_files
short_description: Write several files into one directory, each only when its content changed
description:
  - The platform role renders a dozen files of manifests (megabytes of CRDs) on the controller; one call of this
    module writes them all, where a loop of ansible.builtin.copy costs a module run per file.
  - A file is replaced atomically (written beside it, then renamed) and only when its content differs, so that a
    run that changes nothing reports no change. Check mode reports what would be written.
options:
  dest:
    description: The directory (created when missing).
    type: path
    required: true
  files:
    description: File name (no directory part) -> content.
    type: dict
    required: true
  mode:
    description: Mode of the files written.
    type: str
    default: "0644"
author: dinops
"""

EXAMPLES = r"""
- name: Write the rendered manifests
  platform_files:
    dest: /srv/build/platform/rendered
    files:
      01-trainer-objects.yaml: "---\n{...}\n"
"""

RETURN = r"""
written:
  description: The names of the files written (or that check mode would write).
  type: list
  elements: str
  returned: always
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "files": {"type": "dict", "required": True},
            "mode": {"type": "str", "default": "0644"},
        },
        supports_check_mode=True,
    )
    dest = module.params["dest"]
    mode = int(module.params["mode"], 8)
    written = []
    for name, content in sorted(module.params["files"].items()):
        if not name or os.sep in name or name in (".", ".."):
            module.fail_json(msg=f"platform_files: {name!r} is not a file name")
        data = str(content).encode("utf-8")
        path = os.path.join(dest, name)
        try:
            with open(path, "rb") as handle:
                if handle.read() == data and (os.stat(path).st_mode & 0o7777) == mode:
                    continue
        except FileNotFoundError:
            pass
        written.append(name)
        if module.check_mode:
            continue
        os.makedirs(dest, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=dest, prefix=f".{name}.")
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    module.exit_json(changed=bool(written), written=written)


if __name__ == "__main__":
    main()
