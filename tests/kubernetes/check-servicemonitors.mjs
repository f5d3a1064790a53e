// Validates the ServiceMonitors in a JSON array of Kubernetes objects (standard input) against
// the Prometheus Operator's CRD schema, as npm @kubernetes-models/prometheus-operator packages
// it: types, required fields, enums and patterns (an interval of "30 seconds" fails). The CRD
// schema allows unknown fields (the API server drops them without a word), so this also
// refuses every field the CRD's types do not declare, read from the package's type
// declarations: a misspelt `intervall` fails here instead of being ignored by the cluster.
// Usage: node check-servicemonitors.mjs NODE_MODULES < objects.json; exit 1 on a problem.
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const modules = resolve(process.argv[2]);
const operator = join(modules, "@kubernetes-models/prometheus-operator");
const { ServiceMonitor } = await import(
  pathToFileURL(join(operator, "monitoring.coreos.com/v1/ServiceMonitor.js")).href
);

// The properties of interface `name` declared in the .d.ts `file`, with their type text, and
// where the interfaces that file imports are declared.
const declarations = new Map();
function declaration(file, name) {
  const key = `${file}#${name}`;
  if (declarations.has(key)) return declarations.get(key);
  const text = readFileSync(file, "utf8");
  const imports = new Map();
  for (const m of text.matchAll(/import \{ ([^}]+) \} from "([^"]+)";/g)) {
    const from = m[2].startsWith(".")
      ? join(dirname(file), m[2].replace(/\.js$/, ".d.ts"))
      : join(modules, m[2].replace(/\.js$/, "") + ".d.ts");
    for (const imported of m[1].split(",")) imports.set(imported.trim(), from);
  }
  // Declared under its own name, or exported under this one (`export type { IObjectMeta as
  // IIoK8sApimachineryPkgApisMetaV1ObjectMeta }`).
  const alias = text.match(new RegExp(`(\\w+) as ${name}\\b`));
  let start = text.indexOf(`export interface ${name} `);
  if (start < 0 && alias) start = text.indexOf(`export interface ${alias[1]} `);
  if (start < 0) throw new Error(`${file} does not declare ${name}`);
  const body = text.slice(text.indexOf("{", start) + 1);
  const properties = new Map();
  let depth = 0;
  for (const line of body.split("\n")) {
    if (depth === 0 && /^}/.test(line)) break;
    const m = depth === 0 && line.match(/^ {4}"?([A-Za-z0-9_$-]+)"?\??: (.*?);?$/);
    if (m) properties.set(m[1], m[2]);
    depth += (line.match(/\{/g) || []).length - (line.match(/\}/g) || []).length;
  }
  const found = { file, properties, imports };
  declarations.set(key, found);
  return found;
}

// Every key of `value` must be declared by interface `name` (recursively, through interface
// and Array<interface> types); others (strings, maps, unions) are left to the schema.
function unknownFields(value, file, name, path, problems) {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return;
  const { properties, imports } = declaration(file, name);
  for (const [key, child] of Object.entries(value)) {
    const type = properties.get(key);
    if (type === undefined) {
      problems.push(`${path}/${key}: not a field of ${name.replace(/^I(ComGithub\w+V1|IoK8s\w+V1)?/, "")}`);
      continue;
    }
    const one = type.match(/^(I\w+)$/);
    const many = type.match(/^Array<(I\w+)>$/);
    const inner = (one || many || [])[1];
    if (!inner || !imports.has(inner)) continue;
    for (const [i, item] of (many ? child : [child]).entries()) {
      unknownFields(item, imports.get(inner), inner, many ? `${path}/${key}/${i}` : `${path}/${key}`, problems);
    }
  }
}

const objects = JSON.parse(readFileSync(0, "utf8"));
const monitors = objects.filter((o) => o && o.kind === "ServiceMonitor");
let failed = false;
for (const monitor of monitors) {
  const name = monitor.metadata?.name ?? "(unnamed)";
  const problems = [];
  try {
    new ServiceMonitor(monitor).validate();
  } catch (e) {
    problems.push(e.message);
  }
  unknownFields(monitor, join(operator, "monitoring.coreos.com/v1/ServiceMonitor.d.ts"), "IServiceMonitor", "", problems);
  for (const p of problems) console.error(`ServiceMonitor ${name}: ${p}`);
  failed ||= problems.length > 0;
}
if (monitors.length === 0) {
  console.error("no ServiceMonitor to check");
  failed = true;
}
process.exit(failed ? 1 : 0);
