#!/usr/bin/env bash
# check-deploy.sh: "make check-deploy". The manifests in deploy/kubernetes must pass
# deploy/check/check-deploy.mjs (the API's schemas and the node's rules), and each rule must
# catch what it is there for: copies with one thing broken each must fail, saying what.
set -euo pipefail
modules=$1
check=deploy/check/check-deploy.mjs
node "$check" "$modules" deploy/kubernetes

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
broken() {      # broken NAME SED-SCRIPT FILE WANT: FILE edited by SED-SCRIPT must fail saying WANT
        local name=$1 script=$2 file=$3 want=$4 out
        rm -rf "$tmp/k" && cp -r deploy/kubernetes "$tmp/k"
        sed -i "$script" "$tmp/k/$file"
        if out=$(node "$check" "$modules" "$tmp/k" 2>&1); then
                echo "check-deploy: a manifest with $name passed" >&2
                exit 1
        fi
        grep -qF -- "$want" <<<"$out" || { echo "check-deploy: $name: expected '$want', got: $out" >&2; exit 1; }
}
broken "hostPID a string" 's/hostPID: true/hostPID: "yes"/' gpupoold-daemonset.yaml "hostPID must be boolean"
broken "no hostPID" '/hostPID: true/d' gpupoold-daemonset.yaml "hostPID: true"
broken "no toleration" 's/key: nvidia.com\/gpu/key: example.com\/other/' gpupoold-daemonset.yaml "a toleration"
broken "no memory limit" '/limits:/{n;/memory: 256Mi/d}' gpupoold-daemonset.yaml "a memory limit"
broken "no seccomp" '/seccompProfile:/,+1d' gpupoold-daemonset.yaml "seccompProfile RuntimeDefault"
broken "a writable root" 's/readOnlyRootFilesystem: true/readOnlyRootFilesystem: false/' gpupoold-daemonset.yaml \
        "read-only root filesystem"
broken "metrics on every address" 's/\$(POD_IP):9403/0.0.0.0:9403/' gpupoold-daemonset.yaml "not every address"
broken "no startup or readiness probe" '/startupProbe:/,/failureThreshold/d; /readinessProbe:/,/timeoutSeconds: 5/d' \
        gpupoold-daemonset.yaml "a startup or readiness probe"
broken "no state directory" 's/, "--state-dir", "\/var\/lib\/gpupool"//' gpupoold-daemonset.yaml \
        "--state-dir on a writable hostPath volume"
broken "a state directory in the pod" \
        '/^        - name: state$/,/type: DirectoryOrCreate/{s/hostPath:/emptyDir: {}/;/path:/d;/type:/d}' \
        gpupoold-daemonset.yaml "--state-dir on a writable hostPath volume"
broken "a root client" 's/runAsUser: 1000/runAsUser: 0/' client-job.yaml "non-root uid"
broken "a client without seccomp" '/seccompProfile:/,+1d' client-job.yaml "seccompProfile RuntimeDefault"
broken "a client with a hostPath" 's/^\(          \)resources:$/\1volumeMounts: [{name: s, mountPath: \/run\/gpupool}]\n\1resources:/; s/^\(      \)containers:$/\1volumes: [{name: s, hostPath: {path: \/run\/gpupool}}]\n\1containers:/' \
        client-job.yaml "no hostPath volume"
broken "a client that asks no memory" 's/gpupool.io\/memory: 8/nvidia.com\/gpu: 1/' client-job.yaml "asks for gpupool.io/memory"
broken "no device plugin" 's/"\/usr\/bin\/gpupool-device-plugin"/"\/usr\/bin\/true"/' gpupoold-daemonset.yaml \
        "a container running gpupool-device-plugin"
broken "no kubelet directory" 's/path: \/var\/lib\/kubelet\/device-plugins/path: \/tmp\/dp/' gpupoold-daemonset.yaml \
        "mounts the kubelet's /var/lib/kubelet/device-plugins"
broken "an unknown kind" 's/kind: PodMonitor/kind: PodWatcher/' gpupoold-daemonset.yaml "no kind PodWatcher"
echo "check-deploy: 17 broken copies of the manifests refused, each saying why"
