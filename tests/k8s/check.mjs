// Checks deploy/k8s without a cluster: renders every overlay with
// `kubectl kustomize`, validates every object against the Kubernetes API
// schemas of kubernetes-models (the JSON-schema validation it ships, and a
// TypeScript check of each object as a literal of its API type, which
// rejects unknown fields, as `kubectl apply --validate=strict` would), and
// checks that each job's manifests agree with the config they run. Then it
// breaks a rendered overlay in each way it checks for and expects every
// break to be caught, so that the check itself is known to work.
//
//   node tests/k8s/check.mjs        (after `npm ci` in tests/k8s)
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import YAML from "yaml";

const here = path.dirname(fileURLToPath(import.meta.url));
const overlays = path.resolve(here, "../../deploy/k8s/overlays");

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
// fields the example configs use: cluster.num_servers, and workers per
// segment from training.workers_per_segment or a segment's own workers).
function configFacts(text) {
  const body = text.replace(/#.*$/gm, "");
  const number = (re, within, fallback) => { const m = re.exec(within); return m ? Number(m[1]) : fallback; };
  const perSegment = number(/workers_per_segment:\s*(\d+)/, body, 1);
  const segments = [...body.matchAll(/segments\s*\{((?:[^{}]|\{[^{}]*\})*)\}/g)].map((m) => m[1]);
  return {
    servers: number(/num_servers:\s*(\d+)/, body, 0),
    workers: segments.map((s) => number(/(?:^|\s)workers:\s*(\d+)/, s, perSegment)),
    chain: /combine:\s*CHAIN/.test(body),
  };
}

const argAfter = (args, flag) => { const i = args.indexOf(flag); return i < 0 ? undefined : args[i + 1]; };

function consistencyErrors(objects) {
  const errors = [];
  const byKind = (kind) => objects.filter((o) => o.kind === kind);
  const job = byKind("ConfigMap").find((c) => c.metadata.name.startsWith("segps-job"));
  const configs = byKind("ConfigMap").find((c) => c.metadata.name.startsWith("segps-configs"));
  if (!job || !configs) return ["the segps-job and segps-configs ConfigMaps are missing"];
  const configText = configs.data[job.data.config];
  if (!configText) return [`segps-job names config ${job.data.config}, which segps-configs does not hold`];
  const facts = configFacts(configText);

  const sts = byKind("StatefulSet").find((s) => s.metadata.name === "segps-server");
  const svc = byKind("Service").find((s) => s.metadata.name === sts?.spec.serviceName);
  if (!sts || !svc) return ["no segps-server StatefulSet with its Service"];
  if (svc.spec.clusterIP !== "None") errors.push(`Service ${svc.metadata.name} is not headless`);
  if (sts.spec.replicas !== facts.servers) {
    errors.push(`StatefulSet segps-server has ${sts.spec.replicas} replicas; ${job.data.config} has num_servers ${facts.servers}`);
  }
  const server = sts.spec.template.spec.containers[0];
  const port = server.ports.find((p) => p.name === "grpc").containerPort;
  if (argAfter(server.args, "--listen") !== `0.0.0.0:${port}`) errors.push("the server does not listen on its grpc port");
  if (argAfter(server.args, "--index") !== "$(POD_INDEX)" ||
      !server.env.some((e) => e.name === "POD_INDEX" &&
                              e.valueFrom?.fieldRef?.fieldPath === "metadata.labels['apps.kubernetes.io/pod-index']")) {
    errors.push("the server's --index is not its pod ordinal");
  }
  // The pods' DNS names: <statefulset>-<ordinal>.<service>.
  const expected = Array.from({ length: sts.spec.replicas }, (_, i) => `${sts.metadata.name}-${i}.${svc.metadata.name}:${port}`).join(",");
  const jobs = byKind("Job");
  for (const j of jobs) {
    const args = j.spec.template.spec.containers[0].args;
    if (argAfter(args, "--servers") !== expected) {
      errors.push(`Job ${j.metadata.name}: --servers ${argAfter(args, "--servers")}, but the server pods are ${expected}`);
    }
  }
  facts.workers.forEach((workers, k) => {
    const w = jobs.filter((j) => argAfter(j.spec.template.spec.containers[0].args, "--segment") === String(k));
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
  const workerJobs = jobs.filter((j) => argAfter(j.spec.template.spec.containers[0].args, "--segment") !== undefined);
  if (workerJobs.length !== facts.workers.length) {
    errors.push(`${workerJobs.length} worker Jobs for the config's ${facts.workers.length} segments`);
  }
  if (facts.chain) errors.push(...chainErrors(facts, workerJobs, byKind("Service")));
  return errors;
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

// Each break must be caught.
const args = (o, name) => o.find((x) => x.metadata.name === name).spec.template.spec.containers[0].args;
const breaks = {
  "an unknown field": (o) => { o.find((x) => x.kind === "StatefulSet").spec.template.spec.containers[0].imagee = "x"; },
  "a wrongly typed field": (o) => { o.find((x) => x.kind === "StatefulSet").spec.replicas = "2"; },
  "server replicas off the config": (o) => { o.find((x) => x.kind === "StatefulSet").spec.replicas = 3; },
  "workers off the config": (o) => { o.find((x) => x.metadata.name === "segps-worker-seg1").spec.parallelism = 1; },
  "a worker given another server name": (o) => {
    const a = args(o, "segps-worker-seg0");
    a[a.indexOf("--servers") + 1] = "segps-server-0.segps-server:7000,segps-server-2.segps-server:7000";
  },
  "a stage sending to another replica": (o) => {
    const a = args(o, "segps-worker-seg0");
    a[a.indexOf("--next_stage") + 1] = "segps-worker-seg1-0.segps-stages:7100";
  },
  "the last stage given a next one": (o) => { args(o, "segps-worker-seg2").push("--next_stage", "segps-worker-seg0-0.segps-stages:7100"); },
  "a stage listening off its Service's port": (o) => {
    const a = args(o, "segps-worker-seg2");
    a[a.indexOf("--stage_listen") + 1] = "0.0.0.0:7200";
  },
  "stage pods outside the Service": (o) => { o.find((x) => x.metadata.name === "segps-stages").spec.selector = { app: "other" }; },
};
for (const [what, breakIt] of Object.entries(breaks)) {
  const objects = structuredClone(rendered[/stage|Service/.test(what) ? "teacher-chain" : "teacher"]);
  breakIt(objects);
  const errors = [...(await schemaErrors(objects)), ...consistencyErrors(objects)];
  console.log(`${errors.length ? "ok  " : "FAIL"} caught ${what}${errors.length ? `: ${errors[0]}` : ": not caught"}`);
  failures += errors.length === 0;
}
process.exit(failures ? 1 : 0);
