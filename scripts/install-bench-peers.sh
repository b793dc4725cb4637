#!/usr/bin/env bash
# Installs what the benchmark harness in bench/ needs besides Rust:
#   - etcd-server        the etcd peer system (3-member cluster, started by the harness)
#   - zookeeper          the ZooKeeper peer system (3-server ensemble, started by the harness)
#   - protobuf-compiler  protoc, needed to build the etcd-client crate
#   - libprotobuf-dev    the well-known .proto files (google/protobuf/*.proto) protoc imports there
#
# Non-interactive and idempotent: packages already installed are left as they
# are. Debian may start etcd or ZooKeeper as a system service on install; this
# script keeps them from starting (policy-rc.d during the install) and stops
# and disables any that run anyway, so the harness's own instances own the
# ports. Run as root (or through sudo).
set -euo pipefail

PACKAGES=(etcd-server zookeeper protobuf-compiler libprotobuf-dev)
SERVICES=(etcd zookeeper)

if [[ $(id -u) -ne 0 ]]; then
    echo "install-bench-peers.sh: must run as root (try: sudo $0)" >&2
    exit 1
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$pkg")
    fi
done

if ((${#missing[@]} > 0)); then
    # Refuse service starts during the install, unless a policy already exists.
    policy=/usr/sbin/policy-rc.d
    added_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        added_policy=1
        trap 'rm -f "$policy"' EXIT
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
    if ((added_policy)); then
        rm -f "$policy"
        trap - EXIT
    fi
else
    echo "install-bench-peers.sh: ${PACKAGES[*]} already installed"
fi

# Stop and disable the system services, whichever init system is in charge.
systemd_running=0
[[ -d /run/systemd/system ]] && systemd_running=1
for svc in "${SERVICES[@]}"; do
    if ((systemd_running)); then
        if systemctl list-unit-files "$svc.service" >/dev/null 2>&1; then
            systemctl disable --now "$svc.service" >/dev/null 2>&1 || true
        fi
    elif [[ -x /etc/init.d/$svc ]]; then
        if service "$svc" status >/dev/null 2>&1; then
            service "$svc" stop || true
        fi
        update-rc.d "$svc" disable >/dev/null 2>&1 || true
    fi
done

# Check: the binaries are there, and nothing from a system service listens on
# the default ports (etcd 2379/2380, ZooKeeper 2181).
for bin in etcd protoc java; do
    command -v "$bin" >/dev/null || { echo "install-bench-peers.sh: $bin not found after install" >&2; exit 1; }
done
[[ -d /usr/share/zookeeper/lib || -f /usr/share/java/zookeeper.jar ]] || {
    echo "install-bench-peers.sh: ZooKeeper jars not found under /usr/share/zookeeper or /usr/share/java" >&2
    exit 1
}
if command -v ss >/dev/null; then
    busy=$(ss -Hltn '( sport = :2379 or sport = :2380 or sport = :2181 )' || true)
    if [[ -n $busy ]]; then
        echo "install-bench-peers.sh: warning: something still listens on an etcd/ZooKeeper default port:" >&2
        echo "$busy" >&2
    fi
fi
echo "install-bench-peers.sh: ok ($(etcd --version | head -1); $(protoc --version); zookeeper $(dpkg-query -W -f='${Version}' zookeeper))"
