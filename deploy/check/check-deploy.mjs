// check-deploy.mjs: "make check-deploy". Validates every object in the manifests of a folder
// (deploy/kubernetes) against the Kubernetes API's OpenAPI schemas (kubernetes-models) and the
// Prometheus operator's, offline, then checks the rules a GPU node needs of them: the daemon
// sees its clients' pids (hostPID), runs on tainted GPU nodes, asks for what it uses, is probed,
// runs under seccomp with a read-only root and exposes its metrics only behind a policy; the
// clients run as a non-root user under seccomp.
//
//   node check-deploy.mjs NODE_MODULES_DIR MANIFESTS_DIR
//
// Exit 0 and one line saying what was checked, or 1 with one line per problem.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, dir] = process.argv.slice(2);
if (!modules || !dir) {
  console.error("usage: node check-deploy.mjs NODE_MODULES_DIR MANIFESTS_DIR");
  process.exit(2);
}
const load = (path) => import(pathToFileURL(join(modules, path)).href);
const { parseAllDocuments } = await load("yaml/dist/index.js");

// apiVersion -> the module holding its kinds.
const groups = {
  v1: "kubernetes-models/v1/index.js",
  "apps/v1": "kubernetes-models/apps/v1/index.js",
  "batch/v1": "kubernetes-models/batch/v1/index.js",
  "networking.k8s.io/v1": "kubernetes-models/networking.k8s.io/v1/index.js",
  "monitoring.coreos.com/v1": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/index.js",
};

const problems = [];
const objects = [];
for (const file of readdirSync(dir).filter((f) => f.endsWith(".yaml")).sort()) {
  const docs = parseAllDocuments(readFileSync(join(dir, file), "utf8"));
  for (const doc of docs) {
    if (doc.errors.length) {
      problems.push(`${file}: not YAML: ${doc.errors[0].message}`);
      continue;
    }
    const obj = doc.toJS();
    if (!obj)
      continue;
    const where = `${file}: ${obj.kind}/${obj.metadata?.name}`;
    const group = groups[obj.apiVersion];
    if (!group) {
      problems.push(`${where}: apiVersion ${obj.apiVersion} is not one this check knows`);
      continue;
    }
    const Kind = (await load(group))[obj.kind];
    if (!Kind) {
      problems.push(`${where}: no kind ${obj.kind} in ${obj.apiVersion}`);
      continue;
    }
    try {
      new Kind(obj).validate();
    } catch (e) {
      problems.push(`${where}: does not match the API's schema: ${e.message}`);
      continue;
    }
    objects.push({ file, where, obj });
  }
}

// The pod template of a workload, or the pod itself.
const podSpec = (o) => (o.kind === "Pod" ? o.spec : o.kind === "Job" || o.kind === "DaemonSet" ? o.spec?.template?.spec : null);
const seccomp = (spec, c) =>
  (c.securityContext?.seccompProfile?.type ?? spec.securityContext?.seccompProfile?.type) === "RuntimeDefault";
const need = (ok, where, what) => ok || problems.push(`${where}: ${what}`);

const daemons = objects.filter((x) => x.obj.kind === "DaemonSet");
need(daemons.length === 1, dir, `one DaemonSet (gpupoold), not ${daemons.length}`);
for (const { where, obj } of daemons) {
  const spec = podSpec(obj);
  need(spec.hostPID === true, where, "hostPID: true (else every client is pid 0 to the daemon: no pidfd, no pod identity)");
  need((spec.tolerations ?? []).some((t) => t.key === "nvidia.com/gpu" || (t.operator === "Exists" && !t.key)), where,
       "a toleration for the nvidia.com/gpu taint that GPU nodes commonly carry");
  for (const c of spec.containers) {
    const r = c.resources ?? {};
    need(r.requests?.cpu && r.requests?.memory, where, `container ${c.name}: CPU and memory requests`);
    need(r.limits?.memory, where, `container ${c.name}: a memory limit`);
    need(c.livenessProbe && (c.readinessProbe || c.startupProbe), where,
         `container ${c.name}: a liveness probe and a startup or readiness probe`);
    need(seccomp(spec, c), where, `container ${c.name}: seccompProfile RuntimeDefault`);
    need(c.securityContext?.readOnlyRootFilesystem === true, where, `container ${c.name}: a read-only root filesystem`);
    need(c.securityContext?.allowPrivilegeEscalation === false, where, `container ${c.name}: allowPrivilegeEscalation false`);
    const listen = (c.args ?? []).join(" ").match(/--metrics-listen[ =](\S+)/);
    need(!listen || !/^(0\.0\.0\.0|\[::\]|:)/.test(listen[1]), where,
         `container ${c.name}: metrics bound to the pod's address or localhost, not every address`);
    if (c.name === "gpupoold") {
      // Reservations are kept in the state directory: on the pod's own filesystem they would go with the pod.
      const stateDir = (c.args ?? []).join(" ").match(/--state-dir[ =](\S+)/)?.[1];
      const mount = (c.volumeMounts ?? []).find((m) => stateDir && (stateDir === m.mountPath || stateDir.startsWith(`${m.mountPath}/`)));
      const volume = mount && (spec.volumes ?? []).find((v) => v.name === mount.name);
      need(volume?.hostPath && !mount.readOnly, where,
           `container ${c.name}: --state-dir on a writable hostPath volume (reservations must outlive the pod)`);
    }
  }
  const labels = obj.spec.template.metadata?.labels ?? {};
  const selects = (sel) => Object.entries(sel?.matchLabels ?? {}).every(([k, v]) => labels[k] === v);
  need(objects.some((x) => x.obj.kind === "NetworkPolicy" && selects(x.obj.spec.podSelector) &&
                          (x.obj.spec.policyTypes ?? []).includes("Ingress")), where,
       "a NetworkPolicy that selects its pods and limits who reaches the metrics port");
}
need(objects.some((x) => x.obj.kind === "PodMonitor"), dir, "a PodMonitor example for the Prometheus operator");

const clients = objects.filter((x) => (x.obj.kind === "Job" || x.obj.kind === "Pod") && x.obj.metadata?.namespace !== "gpupool");
need(clients.length > 0, dir, "a client example (a Job or Pod outside the gpupool namespace)");
for (const { where, obj } of clients) {
  const spec = podSpec(obj);
  for (const c of spec.containers) {
    const user = c.securityContext?.runAsUser ?? spec.securityContext?.runAsUser;
    const nonRoot = c.securityContext?.runAsNonRoot ?? spec.securityContext?.runAsNonRoot;
    need(nonRoot === true && user !== 0 && user !== undefined, where, `container ${c.name}: runs as a non-root uid (runAsNonRoot, runAsUser)`);
    need(seccomp(spec, c), where, `container ${c.name}: seccompProfile RuntimeDefault`);
    need(c.securityContext?.allowPrivilegeEscalation === false, where, `container ${c.name}: allowPrivilegeEscalation false`);
    need(c.resources?.limits?.["gpupool.io/memory"] !== undefined, where,
         `container ${c.name}: asks for gpupool.io/memory (the device plugin mounts the socket and holds it to what it asked)`);
  }
  need(!(spec.volumes ?? []).some((v) => v.hostPath), where,
       "no hostPath volume (the device plugin gives the socket: the namespace can stay at Pod Security baseline)");
}
// The device plugin beside the daemon: the kubelet's directories, and the daemon's socket.
for (const { where, obj } of daemons) {
  const spec = podSpec(obj);
  const plugin = spec.containers.find((c) => (c.command ?? []).some((a) => a.endsWith("gpupool-device-plugin")));
  need(plugin, where, "a container running gpupool-device-plugin");
  if (plugin) {
    const mounted = (path) => (plugin.volumeMounts ?? []).some((m) =>
      m.mountPath === path && (spec.volumes ?? []).some((v) => v.name === m.name && v.hostPath?.path === path));
    need(mounted("/var/lib/kubelet/device-plugins"), where,
         "the device plugin's container mounts the kubelet's /var/lib/kubelet/device-plugins from the node");
    need(mounted("/var/lib/kubelet/pod-resources"), where,
         "the device plugin's container mounts the kubelet's /var/lib/kubelet/pod-resources from the node");
  }
}

if (problems.length) {
  for (const p of problems)
    console.error(`check-deploy: ${p}`);
  process.exit(1);
}
console.log(`check-deploy: ${objects.length} objects in ${dir} match the Kubernetes 1.27 and Prometheus operator schemas, ` +
            "and the daemon's and clients' rules hold");
