// Runs an overlay's pods as local processes, to show that the commands
// the manifests give (flags, mounts, Secrets, the config's data paths)
// make a working job: each container's command and args as rendered, with
// $(VAR)s expanded from its env, the pods' volumes as local folders (the
// ConfigMap's files, the Secrets' files from make-certs.sh --k8s, a data
// folder written by the data-volume example's Job, a model folder), and the
// servers' DNS names and ports as loopback ports. Servers, then every
// worker of every Job index, then the evaluation Job's containers in order;
// every process must exit 0 and the model and report must land on the
// model volume. Only the number of epochs is cut, to 1.
//
//   node tests/k8s/run_pods.mjs OVERLAY BIN_DIR CERTS_DIR
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import YAML from "yaml";

const [overlay, bin, certs] = process.argv.slice(2);
const here = path.dirname(fileURLToPath(import.meta.url));
const configs = path.resolve(here, "../../deploy/configs");
const objects = YAML.parseAllDocuments(execFileSync("kubectl", ["kustomize", overlay], { encoding: "utf8" }))
  .map((d) => d.toJS());
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "segps-pods-"));
const children = [];
const fail = (why) => {
  console.log(`FAIL ${why}`);
  for (const c of children) c.kill("SIGKILL");
  process.exit(1);
};
// A job that should take seconds: a hang fails instead of holding the suite.
setTimeout(() => fail("the pods did not finish within 5 minutes"), 5 * 60 * 1000).unref();

async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, "127.0.0.1", () => { const { port } = s.address(); s.close(() => resolve(port)); });
  });
}

// Local folders for a pod's volumes, by volume name.
function volumeFolders(pod, name) {
  const folders = {};
  for (const v of pod.volumes ?? []) {
    if (v.configMap) {
      folders[v.name] = path.join(scratch, `${name}-${v.name}`);
      const map = objects.find((o) => o.kind === "ConfigMap" && o.metadata.name === v.configMap.name);
      fs.mkdirSync(folders[v.name], { recursive: true });
      for (const [key, text] of Object.entries(map.data)) {
        fs.writeFileSync(path.join(folders[v.name], key), text.replace(/epochs: \d+/, "epochs: 1"));
      }
    } else if (v.secret) {
      folders[v.name] = certs;  // make-certs.sh names its files as the Secrets' keys
    } else {
      folders[v.name] = path.join(scratch, v.persistentVolumeClaim?.claimName ?? `${name}-${v.name}`);
      fs.mkdirSync(folders[v.name], { recursive: true });
    }
  }
  return folders;
}

// The command of one container, as the pod would run it here.
function command(pod, container, env, folders, names) {
  const vars = { ...env };
  for (const e of container.env ?? []) {
    const ref = e.valueFrom?.configMapKeyRef;
    if (ref) vars[e.name] = objects.find((o) => o.kind === "ConfigMap" && o.metadata.name === ref.name).data[ref.key];
  }
  const local = (arg) => {
    let out = arg.replace(/\$\((\w+)\)/g, (m, v) => vars[v] ?? m);
    for (const [from, to] of names) out = out.split(from).join(to);
    for (const m of container.volumeMounts ?? []) {
      if (out === m.mountPath || out.startsWith(m.mountPath + "/")) out = folders[m.name] + out.slice(m.mountPath.length);
    }
    return out;
  };
  const args = (container.args ?? []).map(local);
  const metrics = args.indexOf("--metrics_listen");
  if (metrics >= 0) args.splice(metrics, 2);  // no scraper here
  // The config's data paths, under the data volume's mount, as the pod would read them.
  const data = (container.volumeMounts ?? []).find((m) => m.mountPath === "/data");
  if (data) {
    const file = path.join(folders.config, "job.pbtxt");
    fs.writeFileSync(file, fs.readFileSync(file, "utf8").split('"/data/').join(`"${folders[data.name]}/`));
  }
  return [path.join(bin, container.command[0]), args];
}

function start(name, [program, args]) {
  const child = spawn(program, args, { stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  child.stdout.on("data", (d) => { output += d; });
  child.stderr.on("data", (d) => { output += d; });
  children.push(child);
  return new Promise((resolve) => child.on("exit", (code) => resolve({ name, code, output })));
}

async function finish(name, run) {
  const result = await run;
  if (result.code !== 0) fail(`${name} exited ${result.code}:\n${result.output.slice(-3000)}`);
  console.log(`ok   ${name} exited 0`);
  return result;
}

const sts = objects.find((o) => o.kind === "StatefulSet");
const service = objects.find((o) => o.kind === "Service" && o.metadata.name === sts.spec.serviceName);
const ports = await Promise.all(Array.from({ length: sts.spec.replicas }, () => freePort()));
// segps-server-<i>.segps-server:7000 and 0.0.0.0:7000 of pod i: 127.0.0.1:<its port>.
const serverNames = ports.map((p, i) => [`${sts.metadata.name}-${i}.${service.metadata.name}:7000`, `127.0.0.1:${p}`]);

// The data, as deploy/k8s/examples/data-volume.yaml's Job writes it into the claim.
const example = YAML.parseAllDocuments(fs.readFileSync(path.resolve(here, "../../deploy/k8s/examples/data-volume.yaml"), "utf8"))
  .map((d) => d.toJS());
const load = example.find((o) => o.kind === "Job").spec.template.spec.containers[0];
const dataFolder = path.join(scratch, "segps-data");
await finish("the data-volume example's Job", start("load", [
  path.join(bin, load.command[0]),
  load.args.map((a) => a.replace("/etc/segps/configs", configs).replace(/^\/data$/, dataFolder))]));

let finished = false;  // once set, servers may stop
for (let i = 0; i < sts.spec.replicas; i++) {
  const pod = sts.spec.template.spec;
  const folders = volumeFolders(pod, `server-${i}`);
  folders.checkpoints = path.join(scratch, `checkpoints-${i}`);
  const names = [...serverNames, ["0.0.0.0:7000", `127.0.0.1:${ports[i]}`]];
  start(`server ${i}`, command(pod, pod.containers[0], { POD_INDEX: String(i) }, folders, names))
    .then((r) => { if (!finished) fail(`server ${i} exited ${r.code} during the job:\n${r.output.slice(-3000)}`); });
}
const workers = [];
for (const job of objects.filter((o) => o.kind === "Job" && o.metadata.name.startsWith("segps-worker"))) {
  const pod = job.spec.template.spec;
  for (let index = 0; index < job.spec.completions; index++) {
    const name = `${job.metadata.name} index ${index}`;
    // Each pod its own folders: a shared config file rewritten for the next pod could be read half written.
    workers.push(finish(name, start(name, command(pod, pod.containers[0], { JOB_COMPLETION_INDEX: String(index) },
                                                 volumeFolders(pod, `${job.metadata.name}-${index}`), serverNames))));
  }
}
const evaluation = objects.find((o) => o.kind === "Job" && o.metadata.name === "segps-eval").spec.template.spec;
const folders = volumeFolders(evaluation, "segps-eval");
for (const c of [...(evaluation.initContainers ?? []), ...evaluation.containers]) {
  await finish(`segps-eval/${c.name}`, start(c.name, command(evaluation, c, {}, folders, serverNames)));
}
await Promise.all(workers);
finished = true;
for (const c of children) c.kill("SIGTERM");
const model = folders.model;
for (const file of ["report.json", "model.safetensors", "model.onnx"]) {
  if (!fs.existsSync(path.join(model, file))) fail(`no ${file} on the model volume`);
}
const accuracy = JSON.parse(fs.readFileSync(path.join(model, "report.json"), "utf8")).ensemble.accuracy;
console.log(`ok   report.json, model.safetensors and model.onnx on the model volume; ensemble accuracy ${accuracy}`);
fs.rmSync(scratch, { recursive: true, force: true });
process.exit(accuracy > 0.5 ? 0 : 1);
