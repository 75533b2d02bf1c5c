// Checks deploy/k8s without a cluster: renders every overlay with
// `kubectl kustomize`, validates every object against the Kubernetes API
// schemas of kubernetes-models (the JSON-schema validation it ships, and a
// TypeScript check of each object as a literal of its API type, which
// rejects unknown fields, as `kubectl apply --validate=strict` would), and
// checks that each job's manifests agree with the config they run: server
// and worker counts, server names, stage links, mutual TLS with tokens from
// the Secrets `deploy/make-certs.sh --k8s` makes, the data and model
// volumes, and NetworkPolicies that keep strangers off the servers. Then it
// breaks a rendered overlay in each way it checks for and expects every
// break to be caught, so that the check itself is known to work.
//
//   node tests/k8s/check.mjs SECRETS_YAML   (after `npm ci` in tests/k8s;
//   SECRETS_YAML from `bash deploy/make-certs.sh --k8s DIR`)
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import YAML from "yaml";

const here = path.dirname(fileURLToPath(import.meta.url));
const overlays = path.resolve(here, "../../deploy/k8s/overlays");
const examples = path.resolve(here, "../../deploy/k8s/examples");
const secrets = YAML.parseAllDocuments(fs.readFileSync(process.argv[2], "utf8")).map((d) => d.toJS()).filter((o) => o);

function render(dir) {
  const text = execFileSync("kubectl", ["kustomize", dir], { encoding: "utf8" });
  return YAML.parseAllDocuments(text).map((d) => d.toJS());
}

// The kubernetes-models module of an object: "apps/v1" + "StatefulSet".
const modelPath = (o) => `kubernetes-models/${o.apiVersion}/${o.kind}`;

async function schemaErrors(objects) {
  const errors = [];
  for (const o of objects) {
    try {
      const module = await import(modelPath(o));
      new module[o.kind](o).validate();
    } catch (e) {
      errors.push(`${o.kind}/${o.metadata?.name}: ${e.message}`);
    }
  }
  // Unknown fields: every object as a literal of its API type.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "segps-k8s-"));
  let text = objects.map((o, i) => `import type { I${o.kind} as T${i} } from "${modelPath(o)}";\n`).join("");
  const starts = [];  // the line each object's literal starts on
  objects.forEach((o, i) => {
    starts.push(text.split("\n").length);
    text += `export const o${i}: T${i} = ${JSON.stringify(o, null, 1)};\n`;
  });
  const file = path.join(dir, "objects.ts");
  fs.writeFileSync(file, text);
  fs.symlinkSync(path.join(here, "node_modules"), path.join(dir, "node_modules"));
  try {
    execFileSync(path.join(here, "node_modules/.bin/tsc"),
                 ["--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext", file],
                 { encoding: "utf8" });
  } catch (e) {
    for (const line of (e.stdout || String(e)).split("\n").filter((l) => l.includes("error TS"))) {
      const at = Number((/objects\.ts\((\d+),/.exec(line) || [0, 0])[1]);
      const o = objects[starts.filter((s) => s <= at).length - 1];
      errors.push(`${o ? `${o.kind}/${o.metadata?.name}` : "objects.ts"}: ${line.replace(/^.*error TS\d+: /, "")}`);
    }
  }
  fs.rmSync(dir, { recursive: true, force: true });
  return errors;
}

// What the manifests must agree with, read from a config's text (the
// fields the example configs use: cluster.num_servers and replicas, and
// workers per segment from training.workers_per_segment or a segment's own
// workers).
function configFacts(text) {
  const body = text.replace(/#.*$/gm, "");
  const number = (re, within, fallback) => { const m = re.exec(within); return m ? Number(m[1]) : fallback; };
  const perSegment = number(/workers_per_segment:\s*(\d+)/, body, 1);
  const segments = [...body.matchAll(/segments\s*\{((?:[^{}]|\{[^{}]*\})*)\}/g)].map((m) => m[1]);
  return {
    servers: number(/num_servers:\s*(\d+)/, body, 0),
    replicas: number(/(?:^|\s)replicas:\s*(\d+)/, body, 1),
    workers: segments.map((s) => number(/(?:^|\s)workers:\s*(\d+)/, s, perSegment)),
    chain: /combine:\s*CHAIN/.test(body),
    dataFiles: [...body.matchAll(/(?:path|train_x|train_y|test_x|test_y|train_csv|test_csv):\s*"([^"]*)"/g)].map((m) => m[1]),
  };
}

const argAfter = (args, flag) => { const i = args.indexOf(flag); return i < 0 ? undefined : args[i + 1]; };

// A container's args with $(VAR) expanded from its env: literal values and
// ConfigMap keys (the generated ConfigMaps carry a hash suffix).
function expandedArgs(container, objects) {
  const value = (e) => {
    if (e.value !== undefined) return e.value;
    const ref = e.valueFrom?.configMapKeyRef;
    const map = ref && objects.find((o) => o.kind === "ConfigMap" && o.metadata.name === ref.name);
    return map?.data?.[ref.key];
  };
  const env = Object.fromEntries((container.env ?? []).map((e) => [e.name, value(e)]));
  return (container.args ?? []).map((a) => a.replace(/\$\((\w+)\)/g, (m, name) => env[name] ?? m));
}

// Every segps process's containers: [pod spec, container, expanded args].
function processes(objects) {
  const out = [];
  for (const o of objects.filter((x) => ["Job", "StatefulSet"].includes(x.kind))) {
    const pod = o.spec.template.spec;
    for (const c of [...(pod.initContainers ?? []), ...pod.containers]) out.push([o, pod, c, expandedArgs(c, objects)]);
  }
  return out;
}

// The files a container reads from a Secret volume: the Secret (from
// make-certs.sh --k8s) must hold the key, and the pod must mount it.
function secretFileErrors(o, pod, container, file) {
  const mount = (container.volumeMounts ?? []).find((m) => file.startsWith(m.mountPath + "/"));
  const volume = mount && pod.volumes.find((v) => v.name === mount.name);
  if (!volume?.secret) return [`${o.kind} ${o.metadata.name}/${container.name}: ${file} is on no Secret volume`];
  const secret = secrets.find((s) => s.metadata.name === volume.secret.secretName);
  const key = file.slice(mount.mountPath.length + 1);
  if (!secret) return [`${o.kind} ${o.metadata.name}: Secret ${volume.secret.secretName} is not one make-certs.sh --k8s makes`];
  if (!(key in secret.data)) return [`${o.kind} ${o.metadata.name}: ${file}: Secret ${secret.metadata.name} has no ${key}`];
  return [];
}

// Mutual TLS with tokens everywhere: servers require client certificates
// and tokens; every client presents a certificate and a token; no plaintext.
function tlsErrors(objects) {
  const errors = [];
  for (const [o, pod, c, args] of processes(objects)) {
    if (c.command?.[0] === "segps-data") continue;
    const server = c.command?.[0] === "segps-server";
    const where = `${o.kind} ${o.metadata.name}/${c.name}`;
    // --insecure serves the metrics in plaintext; with TLS flags missing it would serve the parameters so too.
    if (args.includes("--insecure") && !argAfter(args, "--tls_cert")) errors.push(`${where}: --insecure without TLS`);
    if (server && !args.includes("--require_client_cert")) errors.push(`${where}: no --require_client_cert`);
    const files = ["--tls_ca", "--tls_cert", "--tls_key", "--token_file"].map((f) => [f, argAfter(args, f)]);
    for (const [flag, file] of files) {
      if (!file) errors.push(`${where}: no ${flag}`);
      else errors.push(...secretFileErrors(o, pod, c, file));
    }
    for (const flag of ["--stage_tls_cert", "--stage_tls_key"]) {
      if (argAfter(args, flag)) errors.push(...secretFileErrors(o, pod, c, argAfter(args, flag)));
    }
    const probe = c.readinessProbe?.exec?.command;
    if (server && !(probe?.[0] === "segps-health" && probe.includes("--tls_ca"))) errors.push(`${where}: its probe does not speak TLS`);
  }
  return errors;
}

// The config's data files under the data volume's mount in every pod that
// reads data (workers, the evaluation), read-only, from a claim or a host
// path; the evaluation writes its report and the model on a claim.
function volumeErrors(objects, facts) {
  const errors = [];
  for (const [o, pod, c, args] of processes(objects)) {
    const binary = c.command?.[0];
    const where = `${o.kind} ${o.metadata.name}/${c.name}`;
    if (binary === "segps-worker" || binary === "segps-eval") {
      for (const file of facts.dataFiles.filter((f) => f.startsWith("/data/"))) {
        const mount = (c.volumeMounts ?? []).find((m) => file.startsWith(m.mountPath + "/"));
        const volume = mount && pod.volumes.find((v) => v.name === mount.name);
        if (!volume || !(volume.persistentVolumeClaim || volume.hostPath)) {
          errors.push(`${where}: the config reads ${file}, which no claim or host path holds here`);
        } else if (!mount.readOnly) errors.push(`${where}: the data volume is mounted writable`);
      }
    }
    for (const flag of binary === "segps-eval" ? ["--report"] : binary === "segps-export" ? ["--out", "--onnx"] : []) {
      const file = argAfter(args, flag) ?? "";
      const mount = (c.volumeMounts ?? []).find((m) => file.startsWith(m.mountPath + "/"));
      const volume = mount && pod.volumes.find((v) => v.name === mount.name);
      if (!volume?.persistentVolumeClaim) errors.push(`${where}: ${flag} ${file || "(none)"} is not on a claim: it dies with the pod`);
    }
  }
  if (!processes(objects).some(([, , c]) => c.command?.[0] === "segps-export")) errors.push("no segps-export: no model comes out");
  return errors;
}

// Labels a NetworkPolicy selector matches.
function selects(selector, labels) {
  if (!selector) return false;
  const byLabel = Object.entries(selector.matchLabels ?? {}).every(([k, v]) => labels?.[k] === v);
  const byExpression = (selector.matchExpressions ?? []).every((e) =>
    e.operator === "In" ? e.values.includes(labels?.[e.key]) : e.operator === "Exists" ? labels?.[e.key] !== undefined : false);
  return byLabel && byExpression;
}

// The servers' port and the stage links' admit the job's own pods only:
// some policy selects those pods, and every rule that opens the port names
// its sources by pod labels (no rule open to all, no namespace-wide one);
// the workers and the evaluation can reach the servers, and with
// cluster.replicas the servers each other.
function networkErrors(objects, facts) {
  const errors = [];
  const policies = objects.filter((o) => o.kind === "NetworkPolicy");
  const pods = objects.filter((o) => ["Job", "StatefulSet"].includes(o.kind)).map((o) => o.spec.template.metadata.labels);
  const guard = (name, labels, port, clients) => {
    const mine = policies.filter((p) => selects(p.spec.podSelector, labels) && p.spec.policyTypes?.includes("Ingress"));
    if (!mine.length) return errors.push(`no NetworkPolicy selects the ${name}: anyone may reach port ${port}`);
    const rules = mine.flatMap((p) => p.spec.ingress ?? []).filter((r) => !r.ports || r.ports.some((q) => q.port === port));
    for (const r of rules) {
      if (!r.from?.length || r.from.some((f) => !f.podSelector || f.namespaceSelector)) {
        errors.push(`a NetworkPolicy opens the ${name}' port ${port} beyond the job's pods`);
      }
    }
    for (const client of clients) {
      if (!rules.some((r) => r.from?.some((f) => selects(f.podSelector, client)))) {
        errors.push(`the ${name}' port ${port} is closed to pods labelled ${JSON.stringify(client)}`);
      }
    }
  };
  const labelled = (name) => pods.filter((l) => l?.["app.kubernetes.io/name"] === name);
  guard("servers", labelled("segps-server")[0], 7000, [...labelled("segps-worker"), ...labelled("segps-eval"),
                                                      ...(facts.replicas > 1 ? labelled("segps-server") : [])]);
  if (objects.some((o) => o.kind === "Service" && o.metadata.name === "segps-stages")) {
    guard("stages", labelled("segps-worker")[0], 7100, labelled("segps-worker"));
  }
  return errors;
}

function consistencyErrors(objects) {
  const errors = [];
  const byKind = (kind) => objects.filter((o) => o.kind === kind);
  const job = byKind("ConfigMap").find((c) => c.metadata.name.startsWith("segps-job"));
  if (!job?.data?.["job.pbtxt"]) return ["no segps-job ConfigMap with job.pbtxt"];
  const facts = configFacts(job.data["job.pbtxt"]);

  const sts = byKind("StatefulSet").find((s) => s.metadata.name === "segps-server");
  const svc = byKind("Service").find((s) => s.metadata.name === sts?.spec.serviceName);
  if (!sts || !svc) return ["no segps-server StatefulSet with its Service"];
  if (svc.spec.clusterIP !== "None") errors.push(`Service ${svc.metadata.name} is not headless`);
  if (sts.spec.replicas !== facts.servers) {
    errors.push(`StatefulSet segps-server has ${sts.spec.replicas} replicas; the config has num_servers ${facts.servers}`);
  }
  const server = sts.spec.template.spec.containers[0];
  const serverArgs = expandedArgs(server, objects);
  const port = server.ports.find((p) => p.name === "grpc").containerPort;
  if (argAfter(serverArgs, "--listen") !== `0.0.0.0:${port}`) errors.push("the server does not listen on its grpc port");
  if (argAfter(serverArgs, "--index") !== "$(POD_INDEX)" ||
      !server.env.some((e) => e.name === "POD_INDEX" &&
                              e.valueFrom?.fieldRef?.fieldPath === "metadata.labels['apps.kubernetes.io/pod-index']")) {
    errors.push("the server's --index is not its pod ordinal");
  }
  // The pods' DNS names: <statefulset>-<ordinal>.<service>.
  const expected = Array.from({ length: sts.spec.replicas }, (_, i) => `${sts.metadata.name}-${i}.${svc.metadata.name}:${port}`).join(",");
  for (const [o, , c, args] of processes(objects)) {
    if (["segps-server", "segps-worker", "segps-eval", "segps-export"].includes(c.command?.[0]) &&
        argAfter(args, "--servers") !== expected) {
      errors.push(`Job ${o.metadata.name}/${c.name}: --servers ${argAfter(args, "--servers")}, but the server pods are ${expected}`);
    }
  }
  const jobs = byKind("Job");
  const segmentOf = (j) => argAfter(j.spec.template.spec.containers[0].args ?? [], "--segment");
  facts.workers.forEach((workers, k) => {
    const w = jobs.filter((j) => segmentOf(j) === String(k));
    if (w.length !== 1) return errors.push(`segment ${k}: ${w.length} worker Jobs, expected 1`);
    const spec = w[0].spec;
    if (spec.completionMode !== "Indexed") errors.push(`Job ${w[0].metadata.name} is not Indexed`);
    if (spec.completions !== workers || spec.parallelism !== workers) {
      errors.push(`Job ${w[0].metadata.name}: completions ${spec.completions}, parallelism ${spec.parallelism}; segment ${k} has ${workers} workers`);
    }
    if (argAfter(spec.template.spec.containers[0].args, "--rank") !== "$(JOB_COMPLETION_INDEX)") {
      errors.push(`Job ${w[0].metadata.name}: --rank is not the completion index`);
    }
  });
  const workerJobs = jobs.filter((j) => segmentOf(j) !== undefined);
  if (workerJobs.length !== facts.workers.length) {
    errors.push(`${workerJobs.length} worker Jobs for the config's ${facts.workers.length} segments`);
  }
  if (facts.chain) errors.push(...chainErrors(facts, workerJobs, byKind("Service")));
  return [...errors, ...tlsErrors(objects), ...volumeErrors(objects, facts), ...networkErrors(objects, facts)];
}

// A chain's stages (model.combine: CHAIN): replica r of stage k reaches
// replica r of stage k+1 at that pod's name, <job>-<index>.<subdomain>, the
// subdomain a headless Service that selects the stage's pods, on the port
// the next stage listens on; the last stage has no next one.
function chainErrors(facts, jobs, services) {
  const errors = [];
  const stage = (k) => jobs.find((j) => argAfter(j.spec.template.spec.containers[0].args, "--segment") === String(k));
  const linkPort = (j) => (argAfter(j.spec.template.spec.containers[0].args, "--stage_listen") ?? "").split(":")[1];
  for (let k = 0; k < facts.workers.length; k++) {
    const j = stage(k);
    if (!j) continue;  // reported above
    const pod = j.spec.template;
    const svc = services.find((s) => s.metadata.name === pod.spec.subdomain);
    if (!svc || svc.spec.clusterIP !== "None") {
      errors.push(`Job ${j.metadata.name}: its pods' subdomain ${pod.spec.subdomain} is no headless Service`);
      continue;
    }
    if (!Object.entries(svc.spec.selector ?? {}).every(([key, value]) => pod.metadata.labels?.[key] === value)) {
      errors.push(`Service ${svc.metadata.name} does not select Job ${j.metadata.name}'s pods`);
    }
    if (k > 0 && !svc.spec.ports.some((p) => String(p.port) === linkPort(j))) {
      errors.push(`Job ${j.metadata.name}: --stage_listen port ${linkPort(j)} is not a port of Service ${svc.metadata.name}`);
    }
    const next = stage(k + 1);
    const expected = next && `${next.metadata.name}-$(JOB_COMPLETION_INDEX).${next.spec.template.spec.subdomain}:${linkPort(next)}`;
    const given = argAfter(pod.spec.containers[0].args, "--next_stage");
    if (given !== expected) {
      errors.push(`Job ${j.metadata.name}: --next_stage ${given}, expected ${expected ?? "none (the last stage)"}`);
    }
  }
  return errors;
}

let failures = 0;
const names = fs.readdirSync(overlays).sort();
const rendered = {};
for (const name of names) {
  const objects = render(path.join(overlays, name));
  rendered[name] = objects;
  const errors = [...(await schemaErrors(objects)), ...consistencyErrors(objects)];
  const kinds = objects.map((o) => o.kind).join(", ");
  console.log(`${errors.length ? "FAIL" : "ok  "} overlay ${name}: ${objects.length} objects (${kinds})`);
  for (const e of errors) console.log(`       ${e}`);
  failures += errors.length > 0;
}

// The examples beside the overlays: valid objects.
for (const file of fs.readdirSync(examples).filter((f) => f.endsWith(".yaml")).sort()) {
  const objects = YAML.parseAllDocuments(fs.readFileSync(path.join(examples, file), "utf8")).map((d) => d.toJS());
  const errors = await schemaErrors(objects);
  console.log(`${errors.length ? "FAIL" : "ok  "} example ${file}: ${objects.length} objects`);
  for (const e of errors) console.log(`       ${e}`);
  failures += errors.length > 0;
}

// Each break must be caught: [what, overlay, how].
const find = (o, name) => o.find((x) => x.metadata.name === name);
const workload = (o, name) => o.find((x) => x.metadata.name === name && ["Job", "StatefulSet"].includes(x.kind));
const container = (o, name, index = 0) => workload(o, name).spec.template.spec.containers[index];
const args = (o, name) => container(o, name).args;
const drop = (list, flag, count = 2) => list.splice(list.indexOf(flag), count);
const serverPolicy = (o) => find(o, "segps-servers").spec;
const breaks = [
  ["an unknown field", "teacher", (o) => { container(o, "segps-server").imagee = "x"; }],
  ["a wrongly typed field", "teacher", (o) => { workload(o, "segps-server").spec.replicas = "2"; }],
  ["server replicas off the config", "teacher", (o) => { workload(o, "segps-server").spec.replicas = 3; }],
  ["workers off the config", "teacher", (o) => { find(o, "segps-worker-seg1").spec.parallelism = 1; }],
  ["a worker given another server name", "teacher", (o) => {
    const a = args(o, "segps-worker-seg0");
    a[a.indexOf("--servers") + 1] = "segps-server-0.segps-server:7000,segps-server-2.segps-server:7000";
  }],
  ["the servers' list off the servers", "teacher", (o) => {
    o.find((x) => x.kind === "ConfigMap").data.servers = "segps-server-0.segps-server:7000";
  }],
  ["a stage sending to another replica", "teacher-chain", (o) => {
    const a = args(o, "segps-worker-seg0");
    a[a.indexOf("--next_stage") + 1] = "segps-worker-seg1-0.segps-stages:7100";
  }],
  ["the last stage given a next one", "teacher-chain", (o) => {
    args(o, "segps-worker-seg2").push("--next_stage", "segps-worker-seg0-0.segps-stages:7100");
  }],
  ["a stage listening off its Service's port", "teacher-chain", (o) => {
    const a = args(o, "segps-worker-seg2");
    a[a.indexOf("--stage_listen") + 1] = "0.0.0.0:7200";
  }],
  ["stage pods outside the Service", "teacher-chain", (o) => { find(o, "segps-stages").spec.selector = { app: "other" }; }],
  ["a plaintext server", "teacher", (o) => {
    const a = args(o, "segps-server");
    for (const flag of ["--tls_ca", "--tls_cert", "--tls_key"]) drop(a, flag);
    a.push("--insecure");
  }],
  ["a server that takes clients without certificates", "teacher", (o) => { drop(args(o, "segps-server"), "--require_client_cert", 1); }],
  ["a worker without a token", "teacher", (o) => { drop(args(o, "segps-worker-seg0"), "--token_file"); }],
  ["a key the Secrets do not hold", "teacher", (o) => {
    const a = args(o, "segps-worker-seg1");
    a[a.indexOf("--tls_key") + 1] = "/certs/worker.key";
  }],
  ["a stage link's certificate off its Secret", "teacher-chain", (o) => {
    find(o, "segps-worker-seg2").spec.template.spec.volumes.find((v) => v.name === "certs").secret.secretName = "segps-reader-tls";
  }],
  ["a data volume missing from a worker", "teacher-npy", (o) => {
    const c = container(o, "segps-worker-seg1");
    c.volumeMounts = c.volumeMounts.filter((m) => m.name !== "data");
  }],
  ["a writable data volume", "teacher-npy", (o) => {
    find(o, "segps-eval").spec.template.spec.initContainers[0].volumeMounts.find((m) => m.name === "data").readOnly = false;
  }],
  ["a report that dies with its pod", "teacher", (o) => {
    const a = find(o, "segps-eval").spec.template.spec.initContainers[0].args;
    a[a.indexOf("--report") + 1] = "/tmp/report.json";
  }],
  ["no export", "teacher", (o) => { container(o, "segps-eval").command = ["segps-eval"]; }],
  ["no NetworkPolicy over the servers", "teacher", (o) => { o.splice(o.indexOf(find(o, "segps-servers")), 1); }],
  ["the servers' port open to all", "teacher", (o) => { delete serverPolicy(o).ingress[0].from; }],
  ["the servers' port open to a namespace", "teacher", (o) => { serverPolicy(o).ingress[0].from.push({ namespaceSelector: {} }); }],
  ["the servers closed to the evaluation", "teacher", (o) => {
    serverPolicy(o).ingress[0].from[0].podSelector.matchExpressions[0].values = ["segps-worker"];
  }],
  ["replicated servers closed to each other", "teacher-replicated", (o) => {
    serverPolicy(o).ingress[0].from[0].podSelector.matchExpressions[0].values = ["segps-worker", "segps-eval"];
  }],
  ["the stage links open to all", "teacher-chain", (o) => { delete find(o, "segps-workers").spec.ingress[0].from; }],
];
for (const [what, overlay, breakIt] of breaks) {
  const objects = structuredClone(rendered[overlay]);
  breakIt(objects);
  const errors = [...(await schemaErrors(objects)), ...consistencyErrors(objects)];
  console.log(`${errors.length ? "ok  " : "FAIL"} caught ${what}${errors.length ? `: ${errors[0]}` : ": not caught"}`);
  failures += errors.length === 0;
}
process.exit(failures ? 1 : 0);
