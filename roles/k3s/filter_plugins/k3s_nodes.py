"""Node roles of the k3s cluster, from the inventory: the one place that decides a node's dinops.io/ labels.

The k3s role writes them as ``node-label`` entries of each node's config.yaml and (for nodes already registered)
with ``kubectl label`` from the server; the workloads role's placement filter imports this file to know which node
carries which label. The labels use the dinops.io/ prefix: the NodeRestriction admission plugin rejects labels a
kubelet sets on itself under kubernetes.io/ and k8s.io/ unless they are on its allow-list
(https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#noderestriction).
"""

from __future__ import annotations

from typing import Any

LABEL_GPU = "dinops.io/gpu"
LABEL_TRAIN = "dinops.io/train"
LABEL_INFERENCE = "dinops.io/inference"
# Every label this role manages; a node loses the ones its host no longer asks for.
MANAGED_LABELS = (LABEL_GPU, LABEL_TRAIN, LABEL_INFERENCE)


class K3sNodesError(ValueError):
    """A host setting that cannot give node labels; the message names the variable."""


def node_labels(gpu_count: Any, workloads: Any) -> dict[str, str]:
    """The dinops.io/ labels of one node: gpu when preflight found a GPU, train and inference from the profile.

    ``gpu_count`` is ``ansible_local.dinops.gpu_count`` (0 or missing on CPU hosts); ``workloads`` is the host's
    ``gpu_profile.workloads`` list (download, train, inference, client).
    """
    try:
        gpus = int(gpu_count or 0)
    except (TypeError, ValueError):
        raise K3sNodesError(f"ansible_local.dinops.gpu_count must be a number, got {gpu_count!r}") from None
    if gpus < 0:
        raise K3sNodesError(f"ansible_local.dinops.gpu_count must not be negative, got {gpus}")
    if workloads is None:
        workloads = []
    if isinstance(workloads, str) or not isinstance(workloads, (list, tuple)):
        raise K3sNodesError(f"gpu_profile.workloads must be a list, got {workloads!r}")
    labels = {}
    if gpus > 0:
        labels[LABEL_GPU] = "true"
    if "train" in workloads:
        labels[LABEL_TRAIN] = "true"
    if "inference" in workloads:
        labels[LABEL_INFERENCE] = "true"
    return labels


def node_label_args(labels: dict[str, str]) -> list[str]:
    """``kubectl label`` arguments that make a registered node carry exactly ``labels`` among the managed ones:
    ``key=value`` for each wanted label, ``key-`` (removal) for each managed label it should no longer have."""
    args = [f"{key}={value}" for key, value in sorted(labels.items())]
    args += [f"{key}-" for key in MANAGED_LABELS if key not in labels]
    return args


def config_node_labels(labels: dict[str, str]) -> list[str]:
    """The k3s config.yaml ``node-label`` list (``key=value`` strings, https://docs.k3s.io/cli/agent#node-labels-and-taints-for-agents)."""
    return [f"{key}={value}" for key, value in sorted(labels.items())]


# Addresses k3s and containerd must reach directly, never through a proxy: the default cluster CIDR (pods), the
# service CIDR and the cluster DNS names (https://docs.k3s.io/advanced#configuring-an-http-proxy, k3s v1.33).
CLUSTER_NO_PROXY = ("127.0.0.1", "localhost", "10.42.0.0/16", "10.43.0.0/16", ".svc", ".cluster.local")
PROXY_KEYS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")


def proxy_environment(proxy_env: Any, node_addresses: Any) -> dict[str, str]:
    """The k3s service's proxy environment (k3s.service.env) from the inventory's ``proxy_env``.

    Keys are upper-cased (k3s and containerd read HTTP_PROXY, HTTPS_PROXY, NO_PROXY); NO_PROXY gains every node's
    address and the cluster's own ranges, so that agents reach the server and pods reach services directly. No
    proxy configured: an empty dict (no file content, nothing changes).
    """
    if not proxy_env:
        return {}
    if not isinstance(proxy_env, dict):
        raise K3sNodesError(f"proxy_env (k3s_proxy_env) must be a dict, got {proxy_env!r}")
    env = {}
    for key, value in proxy_env.items():
        upper = str(key).upper()
        if upper not in PROXY_KEYS:
            raise K3sNodesError(
                f"proxy_env (k3s_proxy_env) has unknown key {key!r}; keys are http_proxy, https_proxy, no_proxy"
            )
        text = str(value)
        if "\n" in text:
            raise K3sNodesError(f"proxy_env (k3s_proxy_env) value of {key} must be one line")
        env[upper] = text
    if not ({"HTTP_PROXY", "HTTPS_PROXY"} & env.keys()):
        return {}
    wanted = [item.strip() for item in env.get("NO_PROXY", "").split(",") if item.strip()]
    for item in [str(a) for a in node_addresses or [] if a] + list(CLUSTER_NO_PROXY):
        if item not in wanted:
            wanted.append(item)
    env["NO_PROXY"] = ",".join(wanted)
    return dict(sorted(env.items()))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "dinops_node_labels": node_labels,
            "dinops_node_label_args": node_label_args,
            "dinops_config_node_labels": config_node_labels,
            "dinops_k3s_proxy_environment": proxy_environment,
        }
