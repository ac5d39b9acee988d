"""Start moto's server with the two EBS volume fields that AWS always returns and moto leaves out.

AWS answers DescribeVolumes with ``SnapshotId: ""`` and ``MultiAttachEnabled: false`` for a volume created
without a snapshot; moto omits both, and amazon.aws's ec2_vol (re-attaching) and ec2_vol_info read them.
Filling in AWS's values keeps the playbooks' real module paths under test instead of working around them.

Usage: python moto_server.py HOST PORT
"""

from __future__ import annotations

import sys

from moto.ec2.models.elastic_block_store import Volume
from moto.server import main as moto_main

_original_init = Volume.__init__


def _init_with_aws_defaults(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
    _original_init(self, *args, **kwargs)
    if self.snapshot_id is None:
        self.snapshot_id = ""
    if self.multi_attach_enabled is None:
        self.multi_attach_enabled = False


Volume.__init__ = _init_with_aws_defaults  # type: ignore[method-assign]

if __name__ == "__main__":
    host, port = sys.argv[1], sys.argv[2]
    moto_main(["-H", host, "-p", port])
