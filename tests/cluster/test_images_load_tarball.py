"""images_load tarball: the archives of the current tags stay, those of superseded tags are removed."""

from __future__ import annotations

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from dinops_testing import REPO


def test_only_archives_of_superseded_tags_are_removed():
    tasks = yaml.safe_load((REPO / "roles/images/tasks/load_tarball.yml").read_text())
    (remove,) = [task for task in tasks if task["name"] == "load_tarball | Remove the archives of superseded tags"]
    directory = "/var/lib/dinops/images/tarballs"
    found = [
        f"{directory}/dinops-serve_0.1.0-aaaa.tar",
        f"{directory}/dinops-serve_0.1.0-old0.tar",
        f"{directory}/dinops-download_0.1.0-bbbb.tar",
        f"{directory}/dinops-download_0.1.0-old1.tar",
    ]
    variables = {
        "images_tarball_dir": directory,
        "__images_local": {"serve": "dinops-serve:0.1.0-aaaa", "download": "dinops-download:0.1.0-bbbb"},
        "__images_tarballs_result": {"files": [{"path": path} for path in found]},
    }
    removed = Templar(loader=DataLoader(), variables=variables).template(trust_as_template(remove["loop"]))
    assert [item["path"] for item in removed] == [found[1], found[3]]
