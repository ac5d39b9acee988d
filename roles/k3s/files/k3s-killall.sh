#!/bin/sh
# Stop k3s and everything it started, as the k3s-killall.sh that k3s's install.sh writes does (k3s v1.33.1+k3s1,
# https://github.com/k3s-io/k3s/blob/v1.33.1%2Bk3s1/install.sh, create_killall): stop the k3s units, kill the
# containerd shims (the pods' processes), unmount and remove k3s's and kubelet's mounts, delete the CNI network
# namespaces and links, drop k3s's iptables rules. The k3s role's uninstall runs it; safe to run twice.
set -x

for service in /etc/systemd/system/k3s*.service; do
    [ -s "$service" ] && systemctl stop "$(basename "$service")"
done

pstree() {
    for pid in "$@"; do
        echo "$pid"
        for child in $(ps -e -o ppid= -o pid= | awk -v p="$pid" '$1 == p {print $2}'); do
            pstree "$child"
        done
    done
}

shims=$(ps -e -o pid= -o args= | awk '$2 ~ /k3s\/data\/[^\/]*\/bin\/containerd-shim/ {print $1}')
[ -n "$shims" ] && kill -9 $(pstree $shims) 2>/dev/null

do_unmount_and_remove() {
    awk '{print $2}' /proc/self/mounts | grep "^$1" | sort -r | while read -r mount; do
        umount -f "$mount" && rm -rf "$mount"
    done
}

do_unmount_and_remove /run/k3s
do_unmount_and_remove /var/lib/rancher/k3s
do_unmount_and_remove /var/lib/kubelet/pods
do_unmount_and_remove /var/lib/kubelet/plugins
do_unmount_and_remove /run/netns/cni-

ip netns show 2>/dev/null | grep cni- | awk '{print $1}' | xargs -r -n1 ip netns delete
for link in cni0 flannel.1 flannel-v6.1 kube-ipvs0 flannel-wg flannel-wg-v6; do
    ip link show "$link" >/dev/null 2>&1 && ip link delete "$link"
done
rm -rf /var/lib/cni/
for tables in iptables ip6tables; do
    command -v "$tables-save" >/dev/null || continue
    "$tables-save" | grep -v KUBE- | grep -v CNI- | grep -iv flannel | "$tables-restore"
done
exit 0
